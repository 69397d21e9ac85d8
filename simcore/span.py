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

from kvsim.simcore.latency import StepLatencyModel

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


def _int0(value: int) -> np.ndarray:
    """`value` as a read-only 0-d int64 array, built once: numpy combines two arrays faster
    than an array and a Python int (the same values)."""
    key = ("int0", value)
    cached = _CONSTANTS.get(key)
    if cached is None:
        cached = _CONSTANTS[key] = np.array(value, dtype=np.int64)
        cached.flags.writeable = False
    return cached


def block_residues(values: np.ndarray, block_size: int) -> np.ndarray:
    """`values % block_size` (where each request stands in its last block); for a power of two
    the same residues by a bit-mask, which is cheaper."""
    if block_size & (block_size - 1):
        return np.remainder(values, _int0(block_size))
    return np.bitwise_and(values, _int0(block_size - 1))


def _new_block_bins(block_size: int, num_steps: int) -> np.ndarray:
    """For steps k = 1..num_steps, the residue c % block_size of the requests that take a new
    block at step k: (1 - k) % block_size for k >= 2; step 1 (its appends were made by the
    schedule) reads the bin past the residues, which is always empty."""
    def build(n: int) -> np.ndarray:
        bins = (1 - np.arange(1, n + 1)) % block_size
        bins[0] = block_size
        return bins
    return _constant(("bins", block_size), num_steps, build)


def _first_step_weights(block_size: int) -> np.ndarray:
    """Unfilled slots of its last block after step 1, (-(c + 1)) % block_size, for a request
    with c % block_size == r, r = 0..block_size-1 (and 0 for the empty bin past them)."""
    def build(n: int) -> np.ndarray:
        weights = np.zeros(block_size + 1, dtype=np.int64)
        weights[:block_size] = (-(np.arange(block_size) + 1)) % block_size
        return weights
    return _constant(("weights", block_size), block_size + 1, build)


def span_shape(computed: np.ndarray, min_remaining: int, block_size: int, free_blocks: int,
               cap: int = MAX_SPAN_STEPS, internal_first: int | None = None) -> SpanShape:
    """`computed`: tokens each request had computed before step 1; `min_remaining`: the fewest
    tokens a request still emits, step 1's included; `free_blocks`: free GPU blocks after step
    1's appends; `internal_first`: the unfilled slots of the requests' last blocks after step 1
    when the caller knows them (else counted here)."""
    k_max = min(min_remaining, cap)
    # a new block at step k >= 2 iff (c + k - 1) % bs == 0, i.e. c % bs == (1 - k) % bs
    hist = np.bincount(block_residues(computed, block_size), minlength=block_size + 1)  # the last bin stays empty
    cum = hist[_new_block_bins(block_size, k_max)].cumsum()
    # at most ceil((k_max - 1) / bs) new blocks per request in steps 2..k_max
    if len(computed) * ((k_max - 2) // block_size + 1) < free_blocks or int(cum[-1]) < free_blocks:
        k = k_max  # every step leaves a block free (the usual case)
    else:
        k = min(k_max, int(cum.searchsorted(free_blocks - 1, side="right")))  # steps with cum <= free - 1
    k = max(k, 1) if free_blocks >= 1 else 1
    if internal_first is None:
        internal_first = int(hist.dot(_first_step_weights(block_size)))
    return SpanShape(k, cum[:k], computed, internal_first)


def kv_slots(shape: SpanShape, num_seqs: int, block_size: int, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Allocated slots and unfilled slots of the requests' last blocks after each step
    k = 1..num_steps: A_k = (used + cum_k) * bs, and, every step filling one slot per request
    and a new block adding block_size free ones, I_k = I_1 - R (k - 1) + bs * cum_k."""
    new_slots = shape.new_blocks_cum[:num_steps] * _int0(block_size)
    allocated = new_slots + shape.used_blocks * block_size
    first = shape.internal_first
    internal = np.arange(first, first - num_seqs * num_steps, -num_seqs) + new_slots
    return allocated, internal


def context_sums(first: int, num_seqs: int, num_steps: int) -> np.ndarray:
    """The decode context sum of steps 1..num_steps of a span: `first`, then `num_seqs` more
    each step (every sequence attends to one more token)."""
    return np.arange(first, first + num_seqs * num_steps, num_seqs)


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
