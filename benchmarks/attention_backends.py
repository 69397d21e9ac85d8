"""What each --engine-version's attention backend does to a step's price (issue 27, presets).

Prints, per model / TP on the H100 and per vLLM version, one prefill step of a single prompt of
512 / 2048 / 8192 tokens (its cost per prompt token, and the attention part of it) and one decode
step of 32 sequences at 4k context, priced from the committed roofline profile by the step model
both cores use (StepLatencyModel with that version: host terms and, where the profile has them,
per-version prefill attention tables; profiles/attention.py).

    python benchmarks/attention_backends.py [--json]
"""

from __future__ import annotations

import argparse
import json

from kvsim.profiles import default_profile
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.specs import ENGINE_VERSIONS

CASES = (("llama2-70b", 4), ("llama3-8b", 1))
PROMPTS = (512, 2048, 8192)
DECODE = (32, 4096)  # sequences, context each


def measure() -> list[dict]:
    gpu, rows = get_gpu("H100-SXM-80GB"), []
    for name, tp in CASES:
        profile = default_profile(gpu, get_model(name), tp)
        for version in ENGINE_VERSIONS:
            lat = profile.latency_model(engine_version=version)
            row = {"model": name, "tp": tp, "engine_version": version, "profile_sha256": profile.sha256[:12],
                   "prefill_backend": lat.prefill_backend or "profile table"}
            for p in PROMPTS:
                ms = 1e3 * lat.step_time_s(p, [(p, 0)], 0, 0, 1)
                attn = lat.num_layers * lat.prefill(p, 0)
                row[f"prefill_{p}_us_per_token"] = round(1e3 * ms / p, 2)
                row[f"prefill_{p}_attention_ms"] = round(attn, 3)
            seqs, ctx = DECODE
            row["decode_32x4k_ms"] = round(1e3 * lat.step_time_s(seqs, [], seqs, seqs * ctx, seqs), 3)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    rows = measure()
    if parser.parse_args().json:
        print(json.dumps(rows, indent=1))
        return
    head = ["model", "tp", "engine_version", "prefill_backend"] + [f"prefill_{p}_us_per_token" for p in PROMPTS] \
        + [f"prefill_{p}_attention_ms" for p in PROMPTS] + ["decode_32x4k_ms", "profile_sha256"]
    print(" | ".join(head))
    for row in rows:
        print(" | ".join(str(row[k]) for k in head))


if __name__ == "__main__":
    main()
