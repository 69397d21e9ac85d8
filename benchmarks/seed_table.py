"""Rerun the seed article's benchmark table with kvsim and print it as markdown (no files written).

    python benchmarks/seed_table.py [--num-requests 1000] [--seed 0]

A thin wrapper over `reports.seed_table`; `kvsim report seed-table` does the same and also
writes the markdown, CSV and figure (the committed reference is reports/reference/).
"""

from __future__ import annotations

import argparse

from kvsim.reports.seed_table import build_seed_table, render_markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    report = build_seed_table(args.num_requests, args.seed)
    print(render_markdown(report))
    print(f"wall {report.wall_s:.1f} s")


if __name__ == "__main__":
    main()
