"""Price one common grid of steps with two profiles and compare (`kvsim profile compare`)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from kvsim.simcore.latency import Profile, StepLatencyModel

DECODE_BATCH = (1, 8, 32, 128, 256)
DECODE_CONTEXT = (128, 1024, 4096)
PREFILL_CHUNKS = (128, 512, 2048, 8192)
MIXED = ((512, 16, 1024), (512, 64, 1024), (2048, 128, 2048))  # (chunk, decodes, context each)


@dataclass(frozen=True, slots=True)
class Step:
    kind: str  # decode | prefill | mixed
    label: str
    num_tokens: int
    prefill_chunks: tuple[tuple[int, int], ...]
    num_decode_seqs: int
    decode_context_tokens: int
    num_sampled: int


def common_steps() -> list[Step]:
    steps = [
        Step("decode", f"{b} seqs x {c} ctx", b, (), b, b * c, b)
        for b in DECODE_BATCH for c in DECODE_CONTEXT
    ]
    steps += [Step("prefill", f"{c}-token chunk", c, ((c, 0),), 0, 0, 1) for c in PREFILL_CHUNKS]
    steps += [
        Step("mixed", f"{c} chunk + {b} decodes x {ctx}", c + b, ((c, 0),), b, b * ctx, b + 1)
        for c, b, ctx in MIXED
    ]
    return steps


def step_ms(model: StepLatencyModel, s: Step) -> float:
    return 1e3 * model.step_time_s(
        s.num_tokens, list(s.prefill_chunks), s.num_decode_seqs, s.decode_context_tokens, s.num_sampled
    )


def compare(a: Profile, b: Profile, policy: str = "continuous", block_size: int = 16):
    """Rows (step, a_ms, b_ms, b/a) and a summary: median and worst ratio (worst = farthest
    from 1 either way), and how many steps each profile had to extrapolate."""
    ma, mb = StepLatencyModel(a.data, policy=policy), StepLatencyModel(b.data, policy=policy)
    ma.set_block_size(block_size)
    mb.set_block_size(block_size)
    rows = []
    for s in common_steps():
        ta, tb = step_ms(ma, s), step_ms(mb, s)
        rows.append((s, ta, tb, tb / ta))
    ratios = [r[3] for r in rows]
    summary = {
        "median_ratio": statistics.median(ratios),
        "worst_ratio": max(ratios, key=lambda r: abs(math.log(r))),
        "extrapolated_a": ma.extrapolated.steps,
        "extrapolated_b": mb.extrapolated.steps,
    }
    return rows, summary
