"""What a run's records cost in memory, without simulating it (issues 10 and 11).

Feeds N synthetic requests through the stores a run keeps (simcore.records.RequestRecords,
the pooled ITL `Samples`, one `StepRecorder`), at the peer workload's proportions (~230 output
tokens and ~7 engine steps per request), then builds the summary and the regime as `kvsim run`
does, and prints the process's peak RSS (getrusage) and RSS after the imports. The engine's own
state (running batch, queue, KV blocks) is bounded by the batch and not included; the real
`kvsim run` adds it and the interpreter's imports (see bench_peer.py for whole runs).

Run: python benchmarks/bench_memory.py [--requests 1000000] [--tokens-per-request 230] [--steps-per-request 7]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from kvsim.simcore.metrics import StepRecorder, StepTotals, summarize_records
from kvsim.simcore.records import RequestRecords, Samples
from kvsim.simcore.step import MemorySnapshot, StepPlan


class _Req:
    __slots__ = ("arrival_s", "max_tokens", "n", "beam_width")


class _State:
    """The attributes `RequestRecords.leave` reads from a ReqState."""

    __slots__ = ("request", "request_id", "reject_reason", "first_scheduled_s", "first_token_s",
                 "finish_s", "num_prompt_tokens", "num_generated", "num_preemptions")


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--tokens-per-request", type=int, default=230)
    parser.add_argument("--steps-per-request", type=float, default=7.0)
    args = parser.parse_args()
    base = _rss_mib()
    started = time.process_time()
    rng = np.random.default_rng(0)
    records, itl, recorder = RequestRecords(), Samples(), StepRecorder()
    recorder.kv_capacity, recorder.kv_unit = 500_000, 16
    plan, mem = StepPlan(num_tokens=128, num_decode_seqs=128, num_sampled=128), MemorySnapshot(300_000, 290_000)
    steps_per_request, now, step_dt = args.steps_per_request, 0.0, 0.04
    num_steps_done = 0
    for i in range(args.requests):
        now += 0.25
        records.arrive(now)
        req, st = _Req(), _State()
        req.arrival_s, req.max_tokens, req.n, req.beam_width = now, 230, 1, 1
        st.request, st.request_id, st.reject_reason = req, i, ""
        st.first_scheduled_s, st.first_token_s, st.finish_s = now + 0.01, now + 0.3, now + 10.0 + rng.random()
        st.num_prompt_tokens, st.num_generated, st.num_preemptions = 1000, args.tokens_per_request, 0
        records.leave(st, 0)
        while num_steps_done < (i + 1) * steps_per_request:  # ITLs arrive one array per step
            itl.extend(rng.gamma(9.0, step_dt / 9.0, size=max(1, round(args.tokens_per_request / steps_per_request))))
            recorder.record(now, step_dt, plan, mem, 128, 3, 0)
            num_steps_done += 1
    fed = _rss_mib()
    records.finalize()
    recorder.finalize()
    totals = StepTotals()
    totals.add(recorder.totals)
    summary = summarize_records(records, itl, totals)
    recorder.columns_kept()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"requests {args.requests:,}  ITLs {len(itl):,}  steps {totals.num_steps:,}  "
          f"kept rows: requests {'all' if records.kept else 'none (running sums)'}, steps {len(recorder.columns_kept()['start_s']):,}")
    print(f"RSS after imports {base:.0f} MiB, after feeding {fed:.0f} MiB, peak {peak:.0f} MiB "
          f"({(peak - base) * 2**20 / args.requests:.0f} bytes per request over the imports); "
          f"CPU {time.process_time() - started:.0f} s; p99 E2EL {summary['p99_e2el_ms']:.1f} ms")


if __name__ == "__main__":
    main()
