"""Decode spans: many decode-only steps of an unchanged batch priced and applied as one event.

While the batch cannot change, step-by-step simulation repeats the same decision: every
running sequence decodes one token, nobody is admitted, preempted or swapped. A span covers
steps 1..K of such a run, where step 1 is the plan the policy just made and K is the first step
at which step-by-step simulation could decide differently:

    K <= min over running requests of the tokens each still has to emit   (step K finishes one)
    K <= last step whose new KV blocks still leave one block free         (no append can fail,
                                                                            the regime's "no
                                                                            free block" flag
                                                                            stays off)
    an arrival that could be admitted (the queue was empty) cuts the span at the first step
    boundary at or after it (the engine's business; see Engine.run)

Request j of the batch has c_j computed tokens before step 1. After step k it has c_j + k, and
the append at the start of step k (k >= 2) takes a new block iff c_j + k - 1 is a multiple of
the block size:

    c_j = 5, bs = 4:  step 1 writes slot 6 | step 2 slot 7 | step 3 slot 8 | step 4 slot 9 (new block)

Everything here is arithmetic on small numpy arrays (per request, per step of the span); no
SimPy, no per-token Python work. Equality with one event per step is tested in
tests/test_fastpath_equivalence.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.latency import StepLatencyModel

MAX_SPAN_STEPS = 4096  # longer runs are split into several spans (bounds the arrays below)
MIN_SPAN_STEPS = 4  # shorter ones run as single steps: the span's numpy set-up costs about as much


@dataclass(slots=True)
class SpanShape:
    """How far a decode span may run, and the KV it takes per step."""

    num_steps: int  # K >= 1
    new_blocks_cum: np.ndarray  # [K] blocks taken by the appends of steps 2..k (0 for k = 1)
    computed: np.ndarray  # [R] tokens each request had computed before step 1
    internal_first: int = 0  # unfilled slots of the requests' last blocks after step 1
    used_blocks: int = 0  # GPU blocks in use after step 1's appends (set by the policy)


def _constant(key: tuple, length: int, build) -> np.ndarray:
    """The first `length` values of a constant array, built once (`build(n)`, n >= length) and
    handed out as views: read-only, so no caller can change it for the next."""
    cached = _CONSTANTS.get(key)
    if cached is None or len(cached) < length:
        cached = _CONSTANTS[key] = build(max(length, MAX_SPAN_STEPS))
        cached.flags.writeable = False
    return cached[:length]


_CONSTANTS: dict[tuple, np.ndarray] = {}


def _step_residues(block_size: int, num_steps: int) -> np.ndarray:
    """k % block_size for k = 1..num_steps."""
    return _constant(("residues", block_size), num_steps, lambda n: np.arange(1, n + 1) % block_size)


def _first_step_weights(block_size: int) -> np.ndarray:
    """(r - 2) % block_size for r = 0..block_size-1: a request with (1 - c) % bs == r has
    (-(c + 1)) % bs unfilled slots in its last block after step 1."""
    return _constant(("weights", block_size), block_size, lambda n: (np.arange(block_size) - 2) % block_size)


def span_shape(computed: np.ndarray, min_remaining: int, block_size: int, free_blocks: int,
               cap: int = MAX_SPAN_STEPS) -> SpanShape:
    """`computed`: tokens each request had computed before step 1; `min_remaining`: the fewest
    tokens a request still emits, step 1's included; `free_blocks`: free GPU blocks after step
    1's appends."""
    k_max = min(min_remaining, cap)
    # a new block at step k >= 2 iff (c + k - 1) % bs == 0, i.e. k % bs == (1 - c) % bs
    residues = np.subtract(1, computed)
    if block_size & (block_size - 1):
        np.remainder(residues, block_size, out=residues)
    else:  # a power of two: the same residues (two's complement), several times cheaper
        np.bitwise_and(residues, block_size - 1, out=residues)
    hist = np.bincount(residues, minlength=block_size)
    new = hist[_step_residues(block_size, k_max)]
    new[0] = 0  # step 1's appends were made by the policy's schedule
    cum = new.cumsum()
    if int(cum[-1]) < free_blocks:  # every step leaves a block free (the usual case)
        k = k_max
    else:
        k = min(k_max, int(cum.searchsorted(free_blocks - 1, side="right")))  # steps with cum <= free - 1
    k = max(k, 1) if free_blocks >= 1 else 1
    return SpanShape(k, cum[:k], computed, int(hist.dot(_first_step_weights(block_size))))


def internal_slots(shape: SpanShape, num_seqs: int, block_size: int, num_steps: int) -> np.ndarray:
    """Unfilled slots of the requests' last blocks after each step k = 1..num_steps,
    sum_j (-(c_j + k)) % bs: every step fills one slot per request, and a step that opens a
    new block for a request adds block_size free ones, so I_k = I_1 - R (k - 1) + bs * cum_k."""
    k = step_offsets(num_steps)
    return shape.internal_first - num_seqs * k + block_size * shape.new_blocks_cum[:num_steps]


def step_offsets(num_steps: int) -> np.ndarray:
    """0, 1, ..., num_steps - 1."""
    return _constant(("offsets",), num_steps, np.arange)


def decode_step_fixed_ms(latency: StepLatencyModel, num_seqs: int) -> tuple[float, float]:
    """(collectives, host) ms of one decode-only step of `num_seqs` sequences: the same for
    every step of a span (only attention grows with the context)."""
    _, coll, host, _ = latency.fixed_parts_ms(num_seqs, num_seqs, 0, num_seqs)
    return coll, host


def boundaries(start: float, durations: np.ndarray) -> np.ndarray:
    """Step end times start + d1, (start + d1) + d2, ...: added one at a time, in order, exactly
    as SimPy's clock advances step by step (np.add.accumulate is sequential)."""
    out = np.empty(len(durations) + 1)
    out[0] = start
    out[1:] = durations
    return np.add.accumulate(out)[1:]


def delay_to(now: float, target: float) -> float:
    """A delay d with now + d == target in floating point (SimPy adds delays to its clock), or,
    when rounding skips `target` (now has finer bits than it), the first d landing after it:
    one ulp (~1e-17 s per second of simulated time) late."""
    d = target - now
    for _ in range(4):
        landed = now + d
        if landed == target:
            return d
        d += target - landed
    while now + d < target:
        d += float(np.spacing(target))
    return d
