"""kvsim end to end against published ABSOLUTE vLLM serving figures on H100 (throughput, TPOT, latency).

published_checks.py checks ratios (feature on / off); this script checks the numbers themselves:
each row is one figure a vLLM source published with its setup (model, GPUs, TP, dataset, rate,
number of prompts, vLLM version). kvsim runs the closest setup, untouched (default profiles, no
option chosen to meet a figure), twice: with the `--engine-version` that matches the source's
vLLM version, and with kvsim's default engine (no `--engine-version`). Each row prints the published
value, both of kvsim's and their signed errors (kvsim / published - 1); the footer gives median and
worst |error| per engine choice. The rows were written down, with their sources and assumptions,
before kvsim was run on them. Sources, assumptions and results: docs/published-checks.md, section
"End-to-end absolute figures".

    python benchmarks/e2e_published.py                  # every row (~20 s on 2 shared cores; --all-engines ~1 min)
    python benchmarks/e2e_published.py --rows V3,V7     # some rows
    python benchmarks/e2e_published.py --list           # the rows, their sources and commands; nothing run
    python benchmarks/e2e_published.py --rows V4 --breakdown   # + where the run's step time goes

Every run is `kvsim run ... --json --no-error-bars` in a subprocess (published_checks.run_json).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from published_checks import run_json, select_rows, write_workloads  # noqa: E402  (the shared runner, --rows, file writer)

# Workload files (name -> YAML text). Lengths are what the source states; spreads are ours (below).
WORKLOADS = {
    # vLLM v0.6.0 blog: "500 prompts randomly sampled from ShareGPT ... Average input tokens: 202,
    # average output tokens: 179". Log-normal with cv 1.0 is our assumption (as workloads/sharegpt.yaml;
    # the blog gives only the means). Arrivals: all at t=0 (QPS inf); --rate replaces them with Poisson.
    "sharegpt-v060": """name: sharegpt-v060
description: vLLM v0.6.0 blog's ShareGPT sample (500 prompts, means 202 / 179; cv 1.0 assumed)
num_requests: 500
arrival: {process: batch}
prompt_len: {dist: lognormal, mean: 202, cv: 1.0}
output_len: {dist: lognormal, mean: 179, cv: 1.0}
""",
    # vLLM v0.6.0 blog: sonnet-based synthetic sets, "roughly 462 input tokens and 16 output tokens
    # on average" (prefill-heavy) and "462 input tokens and 256 output tokens" (decode-heavy), 500 prompts.
    # Fixed lengths at those averages (the sonnet sampler varies them by a few tokens). The suite asked
    # for --sonnet-input-len 512 --sonnet-prefix-len 50 (PR #7412's nightly-tests.json): every prompt
    # starts with the same ~50 tokens. vLLM 0.6.0 ran without prefix caching, so they are prefilled
    # each time; a V1 engine (prefix caching on by default) would reuse them: not modelled here.
    "prefill-heavy-v060": """name: prefill-heavy-v060
description: vLLM v0.6.0 blog's prefill-heavy set (500 prompts, 462 in / 16 out)
num_requests: 500
arrival: {process: batch}
prompt_len: {dist: fixed, value: 462}
output_len: {dist: fixed, value: 16}
""",
    "decode-heavy-v060": """name: decode-heavy-v060
description: vLLM v0.6.0 blog's decode-heavy set (500 prompts, 462 in / 256 out)
num_requests: 500
arrival: {process: batch}
prompt_len: {dist: fixed, value: 462}
output_len: {dist: fixed, value: 256}
""",
    # vLLM V1 alpha blog (ShareGPT, prompt count not stated): benchmark_serving's default 1,000
    # prompts; means 230 / 200 are that default sample's totals with the Llama-3.1 tokenizer as one
    # published run prints them (dphnAI/sonar PR #983: "Total input tokens: 229971", "Total generated
    # tokens: 199533", 1000 requests, Llama 3.1 8B). cv 1.0 assumed.
    "sharegpt-1000": """name: sharegpt-1000
description: benchmark_serving's default ShareGPT sample (1000 prompts, means 230 / 200; cv 1.0 assumed)
num_requests: 1000
arrival: {process: batch}
prompt_len: {dist: lognormal, mean: 230, cv: 1.0}
output_len: {dist: lognormal, mean: 200, cv: 1.0}
""",
}

# metric -> (summary key, scale to the published unit, unit)
METRICS = {
    "throughput": ("request_throughput", 1.0, "req/s"),
    "mean_tpot": ("mean_tpot_ms", 1.0, "ms"),
    "mean_e2el": ("mean_e2el_ms", 1e-3, "s"),
}

H100 = ["--gpu", "H100-SXM-80GB"]
L3_8B = ["--model", "llama3-8b"] + H100
L3_70B_TP4 = ["--model", "llama3-70b", "--tp", "4"] + H100
L31_8B = ["--model", "llama3.1-8b"] + H100
L33_70B_TP4 = ["--model", "llama3.3-70b", "--tp", "4"] + H100

BLOG_V060 = "https://blog.vllm.ai/2024/09/05/perf-update.html"
BLOG_V1 = "https://blog.vllm.ai/2025/01/27/v1-alpha-release.html"
# The figures' files, read pixel by pixel against their axes' gridlines (+-1-2% of the axis span):
FIG_V060 = ("vllm-project/vllm-project.github.io@ce90fa1339a34277da0a5c5771edff840aa44e58 "
            "assets/figures/perf-v060/")
FIG_V1 = "vllm-project/vllm-project.github.io@1aef324e239d6a36e4060e2aed27fa0483d06ea2 assets/figures/v1/v1_llama.png"


@dataclass(frozen=True)
class Row:
    """One published absolute figure and kvsim's closest setup for it."""

    id: str
    what: str
    metric: str  # a METRICS key
    published: float  # in METRICS[metric]'s unit
    engine: str  # the --engine-version matching the source's vLLM version
    version: str  # the vLLM version the source ran
    args: list[str]  # kvsim run options, without --engine-version
    workload: str  # a WORKLOADS key
    source: str  # URL
    figure: str  # where the number was read
    note: str = ""


# The v0.6.0 blog's vLLM server, as its benchmark suite launched it: `vllm.entrypoints.openai.api_server
# -tp N --gpu-memory-utilization 0.9 --num-scheduler-steps 10 --max-num-seqs 512 --dtype bfloat16`
# (`vllm_server_parameters` of every test in .buildkite/nightly-benchmarks/tests/nightly-tests.json as
# merged by vllm-project/vllm PR #7412, whose nightly-descriptions.md names the blog as its results;
# the blog's reproduction guide, vllm-project/vllm issue #8176 of 2024-09-05, runs that suite in the
# vllm/vllm-openai:v0.6.0 image). The client ran benchmark_serving.py with --ignore-eos. The 0.5.3 bars'
# server options are not stated (0.5.3 had no --num-scheduler-steps, so that JSON could not have run
# unchanged); those rows keep vLLM's defaults. The file read is the suite as merged (2024-10-04); the blog's
# own copy (buildkite build 8532's artifact) is not stored, and the blog's TPOT / throughput pairs imply
# ~350-370 sequences in flight, above 256 (docs/published-checks.md).
V060_SERVER = ["--max-num-seqs", "512"]


def _v060(i, what, metric, pub, version, model_args, workload, fig, rate=None, note=""):
    engine = "vllm-0.6" if version == "0.6.0" else "vllm-v0"
    args = model_args + (V060_SERVER if version == "0.6.0" else []) + (["--rate", str(rate)] if rate else [])
    return Row(f"V{i}", what, metric, pub, engine, version, args, workload, BLOG_V060, FIG_V060 + fig, note)


ROWS: list[Row] = [
    # vLLM v0.6.0 blog, headline figure (llama*_comparison.png): ShareGPT 500 prompts, throughput at
    # QPS inf, TPOT at 32 QPS; v0.6.0 with --num-scheduler-steps 10, v0.5.3 as released.
    _v060(1, "Llama-3-8B, 1 x H100, ShareGPT 500, QPS inf, vLLM 0.6.0", "throughput", 36.5, "0.6.0", L3_8B,
          "sharegpt-v060", "llama8B_comparison.png", note="appendix H100_8B.png reads 36.9"),
    _v060(2, "same, vLLM 0.5.3", "throughput", 13.4, "0.5.3", L3_8B, "sharegpt-v060", "llama8B_comparison.png"),
    _v060(3, "Llama-3-8B, 1 x H100, ShareGPT 500, 32 QPS, vLLM 0.6.0", "mean_tpot", 13.5, "0.6.0", L3_8B,
          "sharegpt-v060", "llama8B_comparison.png", rate=32, note="appendix H100_8B.png reads 14.3"),
    _v060(4, "same, vLLM 0.5.3", "mean_tpot", 70.3, "0.5.3", L3_8B, "sharegpt-v060", "llama8B_comparison.png",
          rate=32, note="0.5.3's API server shared the engine's process (the blog: 33% of the time in HTTP)"),
    _v060(5, "Llama-3-70B, 4 x H100 (TP 4), ShareGPT 500, QPS inf, vLLM 0.6.0", "throughput", 17.3, "0.6.0",
          L3_70B_TP4, "sharegpt-v060", "llama70B_comparison.png", note="appendix H100_70B.png reads 17.3"),
    _v060(6, "same, vLLM 0.5.3", "throughput", 9.9, "0.5.3", L3_70B_TP4, "sharegpt-v060",
          "llama70B_comparison.png"),
    _v060(7, "Llama-3-70B, 4 x H100 (TP 4), ShareGPT 500, 32 QPS, vLLM 0.6.0", "mean_tpot", 60.9, "0.6.0",
          L3_70B_TP4, "sharegpt-v060", "llama70B_comparison.png", rate=32, note="appendix H100_70B.png reads 57.3"),
    _v060(8, "same, vLLM 0.5.3", "mean_tpot", 145.5, "0.5.3", L3_70B_TP4, "sharegpt-v060",
          "llama70B_comparison.png", rate=32),
    # Appendix (H100_8B.png, H100_70B.png), vLLM 0.6.0: sonnet-based fixed-length sets.
    _v060(9, "Llama-3-8B, 1 x H100, decode-heavy 462/256, 500, QPS inf", "throughput", 31.0, "0.6.0", L3_8B,
          "decode-heavy-v060", "H100_8B.png"),
    _v060(10, "Llama-3-8B, 1 x H100, prefill-heavy 462/16, 500, QPS inf", "throughput", 59.0, "0.6.0", L3_8B,
          "prefill-heavy-v060", "H100_8B.png"),
    _v060(11, "Llama-3-70B, 4 x H100, decode-heavy 462/256, 500, QPS inf", "throughput", 15.4, "0.6.0",
          L3_70B_TP4, "decode-heavy-v060", "H100_70B.png"),
    _v060(12, "Llama-3-70B, 4 x H100, prefill-heavy 462/16, 500, QPS inf", "throughput", 25.2, "0.6.0",
          L3_70B_TP4, "prefill-heavy-v060", "H100_70B.png"),
    _v060(13, "Llama-3-8B, 1 x H100, decode-heavy 462/256, 500, 32 QPS", "mean_tpot", 24.5, "0.6.0", L3_8B,
          "decode-heavy-v060", "H100_8B.png", rate=32),
    _v060(14, "Llama-3-70B, 4 x H100, decode-heavy 462/256, 500, 32 QPS", "mean_tpot", 94.6, "0.6.0",
          L3_70B_TP4, "decode-heavy-v060", "H100_70B.png", rate=32),
    # vLLM V1 alpha blog (v1_llama.png): mean latency against QPS, ShareGPT, V1 of vLLM 0.7.0. Rows at
    # rates below the knee only (above it the latency depends on the unstated prompt count).
    *[Row(f"W{i + 1}", f"{label}, ShareGPT (1000 assumed), {qps} QPS, vLLM 0.7.0 V1", "mean_e2el", pub, "vllm-v1",
          "0.7.0 (V1)", args + ["--rate", str(qps)], "sharegpt-1000", BLOG_V1, FIG_V1,
          note="'Latency' read as mean end-to-end latency; prompt count and lengths assumed")
      for i, (label, args, qps, pub) in enumerate([
          ("Llama-3.1-8B, 1 x H100", L31_8B, 1, 1.68), ("Llama-3.1-8B, 1 x H100", L31_8B, 20, 1.99),
          ("Llama-3.1-8B, 1 x H100", L31_8B, 40, 2.80), ("Llama-3.3-70B, 4 x H100", L33_70B_TP4, 1, 4.20),
          ("Llama-3.3-70B, 4 x H100", L33_70B_TP4, 10, 5.09), ("Llama-3.3-70B, 4 x H100", L33_70B_TP4, 20, 8.11)])],
]

# "matched": the source's version mapped to --engine-version; "default": no --engine-version (kvsim's
# default engine and batch defaults); --all-engines adds every preset on every row.
ENGINES = ("matched", "default")
PRESETS = ("vllm-v0", "vllm-0.6", "vllm-v1", "vllm-v1-async")


def command(row: Row, engine: str, workload_dir: str) -> list[str]:
    cmd = ["kvsim", "run"] + row.args + ["--workload", os.path.join(workload_dir, row.workload + ".yaml")]
    if engine != "default":
        cmd += ["--engine-version", row.engine if engine == "matched" else engine]
    return cmd + ["--json", "--no-error-bars"]


def measure(row: Row, engine: str, workload_dir: str) -> float:
    key, scale, _ = METRICS[row.metric]
    return float(run_json(command(row, engine, workload_dir))["summary"][key]) * scale


def breakdown(row: Row, engine: str, workload_dir: str) -> str:
    """Where the run's time goes: decode-only and prefill-carrying steps, each split into kernels,
    collectives and host (steps.csv's columns), as mean ms per step."""
    with tempfile.TemporaryDirectory() as out:
        cmd = command(row, engine, workload_dir)[:-2] + ["--no-error-bars", "--out", out]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            return "breakdown failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
        with open(os.path.join(out, "steps.csv")) as f:
            rows = list(csv.DictReader(f))
    parts = []
    for label, pick in (("decode steps", lambda r: float(r["num_prefill_tokens"]) == 0),
                        ("steps with a prefill", lambda r: float(r["num_prefill_tokens"]) > 0)):
        sel = [r for r in rows if pick(r)]
        n = sum(float(r["num_steps"]) for r in sel)
        if not n:
            continue
        seqs = sum(float(r["num_seqs"]) * float(r["num_steps"]) for r in sel) / n
        k, c, h = (sum(float(r[col]) for r in sel) / n for col in ("kernels_ms", "collectives_ms", "host_ms"))
        tot = k + c + h
        parts.append(f"{label}: {n:.0f}, mean batch {seqs:.0f} seqs, {tot:.2f} ms/step = kernels {k:.2f} "
                     f"({100 * k / tot:.0f}%) + collectives {c:.2f} ({100 * c / tot:.0f}%) + host {h:.2f} "
                     f"({100 * h / tot:.0f}%)")
    return "; ".join(parts)


def run_row(row: Row, workload_dir: str, engines: tuple[str, ...] = ENGINES) -> dict:
    out = {"id": row.id}
    for engine in engines:
        try:
            value = measure(row, engine, workload_dir)
        except RuntimeError as exc:
            out[engine] = None
            out[engine + "_error"] = str(exc)
            continue
        out[engine] = value
        out[engine + "_error"] = value / row.published - 1
    return out


def summarize(results: list[dict], engines: tuple[str, ...] = ENGINES) -> list[str]:
    lines = []
    for engine in engines:
        errs = [abs(r[engine + "_error"]) for r in results if r.get(engine) is not None]
        if errs:
            lines.append(f"{engine:13s}: median |error| {100 * statistics.median(errs):.0f}%, "
                         f"worst {100 * max(errs):.0f}% over {len(errs)} rows")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", help="comma-separated row ids (default: all)")
    parser.add_argument("--list", action="store_true", help="print the rows, sources and commands; run nothing")
    parser.add_argument("--all-engines", action="store_true",
                        help="also run every --engine-version preset on every row")
    parser.add_argument("--breakdown", action="store_true",
                        help="also print where each run's step time goes (kernels / collectives / host)")
    args = parser.parse_args(argv)
    rows = select_rows(ROWS, args.rows, "e2e_published")
    if rows is None:
        return 2
    with tempfile.TemporaryDirectory() as folder:
        write_workloads(folder, WORKLOADS)
        if args.list:
            for row in rows:
                unit = METRICS[row.metric][2]
                print(f"{row.id}: {row.what}: {row.metric} {row.published:g} {unit} (vLLM {row.version} -> "
                      f"--engine-version {row.engine})\n  source: {row.source} ({row.figure})"
                      + (f"\n  note: {row.note}" if row.note else ""))
                for engine in ENGINES:
                    print(f"  {engine}: {' '.join(command(row, engine, folder))}")
            return 0
        engines = ENGINES + (PRESETS if args.all_engines else ())
        print("| row | setup | metric | published | matched engine | "
              + " | ".join(f"kvsim ({e}) | error" for e in engines) + " |")
        print("|---|---|---|---|---|" + "---|---|" * len(engines))
        results = []
        for row in rows:
            started = time.perf_counter()
            r = run_row(row, folder, engines)
            results.append(r)
            cells = []
            for engine in engines:
                if r[engine] is None:
                    cells += [f"error: {r[engine + '_error']}", ""]
                else:
                    cells += [f"{r[engine]:.3g}", f"{100 * r[engine + '_error']:+.0f}%"]
            print(f"| {row.id} | {row.what} | {row.metric} ({METRICS[row.metric][2]}) | {row.published:g} | "
                  f"{row.engine} | {' | '.join(cells)} |", flush=True)
            if args.breakdown:
                for engine in ENGINES:
                    print(f"  {row.id} {engine}: {breakdown(row, engine, folder)}", flush=True)
            r["wall_s"] = time.perf_counter() - started
        print("median / worst |error| by engine choice (matched: the source's vLLM version):")
        for line in summarize(results, engines):
            print(line)
        by_version = {row.version: [r for r, rw in zip(results, rows, strict=True) if rw.version == row.version] for row in rows}
        if len(by_version) > 1:
            for version, group in by_version.items():
                print(f"rows from vLLM {version}:")
                for line in summarize(group, engines):
                    print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
