"""Full-batch capacity: the highest request rate a replica's engine can serve, from its step model.

Why: an engine whose step limit is above what it serves (vLLM V1's 1,024 sequences on an H100)
admits every arrival and queues inside its batch. A mild overload then shows no queueing delay and
its batch grows so slowly that a run of a few thousand requests cannot tell it from a slow fill
(simcore.metrics.saturation). The step model can: it says how fast the engine works at its fullest
batch, and an offered rate above that cannot be sustained however long the run.

The steady state it solves (continuous batching over the paged cache, one replica): N sequences
decode in every step, and the prompts' tokens ride along (chunked prefill: each prompt's chunks
add their marginal cost to a step of N decodes, less the fixed part of a step's prefill work
that the N / E[o - 1] prompts joining each step share; without chunked prefill, V0 runs them as prompt
batches of up to max_num_batched_tokens that stall the decodes). Per second the engine spends
S x T_dec(N) in decode work and lam x E[P] in prefill, and emits N x S decode tokens, which must
be lam x E[o - 1]. So

    lam(N) = N / (E[o - 1] x T_dec(N) + N x E[P(N)])

N is at most max_num_seqs and what the KV cache holds at the batch's mean context (each sequence's
context averaged over its decode steps, weighted by them: sum over requests of (o-1) p + (o-1) o / 2,
over the sum of o - 1, plus half a block). With prefix caching, running sequences that share a
prompt prefix reference its full blocks once (vLLM's block pool: a cached block is a full block,
and a request that hits it `touch`es it, one more reference to one physical block;
vllm-project/vllm vllm/v1/core/block_pool.py at c59cb7941357443da7c5eef75cfa8697d683d228), so the
cache holds a prefix group's blocks once for the whole batch and the rest of each context per
sequence: N x (context - shared) + held(N) <= KV tokens, held(N) the full blocks of the prefixes
N sequences use (`SharedPrefix`, `declared_shared`: where the run's own prefix cache hit). The capacity is the largest lam(N) over N up to that.
It is the model's own number (the same step prices the run used), not a measurement; preemption
and uneven batches only lower what a run achieves, so a run offered clearly more than this is
overloaded (simcore.metrics.judge_capacity).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# batch sizes tried below the cache's limit, down to 1/16 of it (lam(N) grows with N on every
# deployment tried; the smaller ones are a guard, the largest is always checked)
_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
MAX_PROMPT_LENGTHS = 64  # distinct prompt lengths priced (quantiles beyond that): bounded work per run


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """KV blocks running sequences share through the prefix cache: `per_seq` tokens of each
    sequence's context (on average) sit in a shared prefix's full blocks, held once per replica
    for every prefix some running sequence uses: `num_groups` prefixes of `block_tokens` tokens
    (their full blocks), each sequence using a given one with probability `fraction / num_groups`
    (workloads.spec.SharedPrefix draws them so)."""

    per_seq: float
    block_tokens: int
    num_groups: int = 1
    fraction: float = 1.0

    def held_once(self, n: int) -> float:
        """Tokens of the distinct prefixes n running sequences use: the expected number of groups
        n independent draws hit, G (1 - (1 - f / G)^n), times a prefix's full blocks."""
        g = self.num_groups
        return g * (1.0 - (1.0 - self.fraction / g) ** n) * self.block_tokens


def cache_batch(num_gpu_tokens: int, per_seq: float, shared: SharedPrefix | None) -> int:
    """The sequences the cache holds when each needs `per_seq` tokens of blocks (context,
    lookahead, half a block): N x per_seq <= KV, or with shared prefixes
    N x (per_seq - shared.per_seq) + shared.held_once(N) <= KV (the largest such N; the left
    side grows with N)."""
    alone = int(num_gpu_tokens // per_seq)
    if shared is None or shared.per_seq <= 0:
        return alone
    own = max(per_seq - shared.per_seq, 1.0)
    lo, hi = alone, int(num_gpu_tokens // own)
    while lo < hi:  # the largest N that fits, between no sharing and no held prefix
        mid = (lo + hi + 1) // 2
        if mid * own + shared.held_once(mid) <= num_gpu_tokens:
            lo = mid
        else:
            hi = mid - 1
    return lo


def first_admission_hits(hits: int, num_finished: int, num_readmitted: int) -> float:
    """Prefix-cache hit tokens of the finished requests' first admissions. The counters count a
    hit at every admission, and a request preempted by recompute is admitted again (and hits its
    prefix again); the hits per admission, times one admission per request, are its prompt's."""
    admissions = num_finished + max(0, num_readmitted)
    return hits * num_finished / admissions if admissions else 0.0


def computed_share(hit_tokens: float, prompts: np.ndarray) -> float:
    """The share of the finished requests' prompt tokens actually computed: all but the prefix-cache
    (and CPU-tier) hits (full_batch_capacity's and prefill_capacity's `prefill_share`)."""
    return max(0.0, 1.0 - hit_tokens / max(1, int(np.asarray(prompts).sum(dtype=np.int64))))


def declared_shared(workload, block_size: int, hits_per_request: float) -> SharedPrefix | None:
    """SharedPrefix of a run whose requests hit `hits_per_request` prefix tokens each at their
    first admission (first_admission_hits): None without hits (prefix caching off, or nothing
    shared: each sequence holds its whole context). The prefixes its workload declares
    (workloads.spec.SharedPrefix: num_groups system prompts of prefix_len tokens, a fraction of
    requests each drawing one) are shared whole: a request that misses its prefix (evicted from a
    small cache) computes it into blocks the next ones of its group share, so the batch still
    holds one copy per prefix in use; where prefixes come per request (a trace's prefix_id
    column, sonnet's head), the run's hits are the shared part, as one prefix of their blocks."""
    if hits_per_request <= 0:
        return None
    spec = getattr(workload, "shared_prefix", None)
    if spec is not None:
        whole = (int(spec.prefix_len) // block_size) * block_size  # full blocks only: vLLM hashes those
        return SharedPrefix(float(spec.fraction) * whole, whole, int(spec.num_groups), float(spec.fraction))
    return SharedPrefix(float(hits_per_request), int(-(-hits_per_request // block_size)) * block_size)


def full_batch_capacity(latency, config, num_gpu_tokens: int, prompts: np.ndarray, outputs: np.ndarray,
                        prefill_share: float = 1.0, decode_only: bool = False,
                        speculation: tuple[Any, float, float] | None = None,
                        shared: SharedPrefix | None = None) -> dict[str, Any] | None:
    """{"rate": req/s, "batch": N, "context": mean decode context} of one replica, or None (no
    request, or a decode instance with nothing to decode); where no request decodes (every output
    one token) the engine only prefills: its prompts per second at full steps (prefill_capacity),
    N the prompts in one. `latency`: the run's StepLatencyModel (a fresh copy is priced, so the
    run's extrapolation counts are untouched); `config`: its ResolvedConfig; `prompts` /
    `outputs`: the finished requests' prompt and output lengths; `prefill_share`: the share of
    prompt tokens actually computed (prefix-cache hits are not); `decode_only`: a disaggregated
    decode instance (its prompts' KV arrives from the prefill pool: no prefill term);
    `speculation`: (the run's SpeculativeStepCost, mean draft tokens per verify, mean acceptance
    length): each decode step is a verify of 1 + d tokens per sequence plus the drafter's passes,
    and emits the acceptance length's tokens per sequence (vLLM's spec-decode metric);
    `shared`: the KV blocks running sequences share through the prefix cache (cache_batch)."""
    prompts = np.asarray(prompts, dtype=np.int64)
    outputs = np.asarray(outputs, dtype=np.int64)
    decodes = np.maximum(outputs - 1, 0)
    if not len(prompts) or (decode_only and decodes.sum() == 0):
        return None
    if decodes.sum() == 0:  # every request ends with its prompt's step: the engine only prefills
        rate = prefill_capacity(latency, config, prompts, prefill_share)
        mean = max(1, int(round(float(prompts.mean()) * prefill_share)))
        batch = min(int(config.engine.max_num_seqs), max(1, int(config.max_num_batched_tokens) // mean))
        return {"rate": rate, "batch": batch, "context": 0.0}
    lat = _priced_copy(latency)
    step_s, per_step = (lambda n, ctx_sum: lat.step_time_s(n, [], n, ctx_sum, n)), 1.0
    lookahead = 0
    if speculation is not None:
        cost, drafts, per_step = speculation
        step_s = _verify_step(cost, lat, drafts)
        lookahead = int(round(drafts))
    engine = config.engine
    context = float((decodes * prompts + decodes * (decodes + 1) / 2).sum() / decodes.sum())
    by_cache = cache_batch(num_gpu_tokens, context + lookahead + engine.block_size / 2, shared)
    n_max = max(1, min(int(engine.max_num_seqs), by_cache))
    budget = int(config.max_num_batched_tokens)
    computed = np.maximum(1, np.rint(prompts * prefill_share).astype(np.int64))
    lengths, weights = _length_groups(computed)
    rounds = _round_steps(config)
    if rounds > 1:  # vLLM 0.6's decode rounds: a sequence that finishes mid-round is computed to its end
        decodes = rounds * -(-decodes // rounds)
    mean_decodes = float(decodes.mean()) / per_step  # decode steps per request (its slot's, with rounds)
    best: dict[str, Any] | None = None
    for n in sorted({n_max, *(b for b in _BATCHES if n_max // 16 <= b < n_max)}):
        ctx_sum = int(round(n * context))
        t_dec = step_s(n, ctx_sum)
        if decode_only:
            rate = n / (mean_decodes * t_dec)
            if best is None or rate > best["rate"]:
                best = {"rate": rate, "batch": n, "context": context}
            continue
        chunked = engine.enable_chunked_prefill
        # a prompt's marginal cost on a plain decode step (speculating, its verify is priced above)
        t_plain = t_dec if speculation is None else lat.step_time_s(n, [], n, ctx_sum, n)
        per_prompt = [_prefill_s(lat, int(p), n, ctx_sum, t_plain, budget, chunked) for p in lengths]
        mean_prefill = float(np.dot(weights, per_prompt))
        if chunked:
            saving = _shared_step_saving(lat, n, ctx_sum, t_plain, budget, mean_decodes, computed)
            mean_prefill = max(0.0, mean_prefill - saving)
        rate = n / (mean_decodes * t_dec + n * mean_prefill)
        if best is None or rate > best["rate"]:
            best = {"rate": rate, "batch": n, "context": context}
    return best


def _round_steps(config) -> int:
    """Steps of one of vLLM 0.6's multi-step decode rounds (simcore/policies/continuous_v0.py), 1
    without them. A request joins a round after its prompt's step and, finishing mid-round, is
    still computed to the round's end, so its decodes take rounds x ceil((o - 1) / rounds) steps."""
    from kvsim.simcore.batch_defaults import num_scheduler_steps

    e = config.engine
    return num_scheduler_steps(e.engine_version, e.enable_chunked_prefill, e.speculative_config is not None)


def describes(config) -> bool:
    """Whether the steady state above is the run's: vLLM's continuous batching over the paged cache."""
    return config.policy.name == "continuous" and config.policy.allocator == "paged"


def served_lengths(records) -> tuple[np.ndarray, np.ndarray] | None:
    """(prompt, output) lengths of the finished requests, or None where the capacity does not
    describe them: no exact request rows, nothing finished, or several sequences per request."""
    from kvsim.simcore.records import FINISHED

    if not records.kept:
        return None
    cols = records.columns()
    done = cols["status"] == FINISHED
    if not done.any() or (cols["n"][done] != 1).any() or (cols["beam_width"][done] > 1).any():
        return None
    return cols["num_prompt_tokens"][done], cols["num_positions"][done]


def _priced_copy(latency):
    """A fresh copy of the run's model (its extrapolation counts stay the run's) that prices with
    the model's own step_time_s, not a probe a caller set on the instance (profiles.calibrate)."""
    lat = latency.fresh()
    lat.__dict__.pop("step_time_s", None)
    return lat


def _verify_step(cost, lat, drafts: float):
    """t(n, ctx_sum): seconds of a speculative decode step of n sequences, each verifying 1 + d
    draft tokens (d the run's mean per verify) and drafting again, priced by a copy of the run's
    SpeculativeStepCost on `lat` (its sums stay the run's)."""
    from kvsim.simcore.speculative_cost import SpeculativeStepCost
    from kvsim.simcore.step import SpecStep, StepPlan

    fresh = SpeculativeStepCost(lat, cost.spec, cost._target, None if cost.draft is None else cost.draft.fresh())
    d = max(0, int(round(drafts)))

    def step_s(n: int, ctx_sum: int) -> float:
        ctx = ctx_sum // n
        spec = SpecStep(verify={i: (d, 0) for i in range(n)}, verify_chunks=[(1 + d, ctx)] * n,
                        verify_context_tokens=ctx_sum + n, num_draft_tokens=n * d, num_drafting=n,
                        drafting_context_tokens=ctx_sum + n)
        return fresh.step_time_s(StepPlan(num_tokens=n, num_decode_seqs=n, decode_context_tokens=ctx_sum + n,
                                          num_sampled=n, spec=spec))

    return step_s


def prefill_capacity(latency, config, prompts: np.ndarray, prefill_share: float = 1.0) -> float | None:
    """Prompts per second one prefill-only instance (a disaggregated prefill pool's replica)
    computes at full steps: each prompt's share of a step packed with prompts of its length up to
    max_num_batched_tokens (longer ones chunked at it). None without prompts."""
    prompts = np.asarray(prompts, dtype=np.int64)
    if not len(prompts):
        return None
    lat = _priced_copy(latency)
    budget = int(config.max_num_batched_tokens)
    lengths, weights = _length_groups(np.maximum(1, np.rint(prompts * prefill_share).astype(np.int64)))
    cost = []
    for p in (int(x) for x in lengths):
        if p <= budget:
            k = min(max(1, budget // p), int(config.engine.max_num_seqs))
            cost.append(lat.step_time_s(k * p, [(p, 0)] * k, 0, 0, k) / k)
            continue
        done, total = 0, 0.0
        while done < p:
            q = min(budget, p - done)
            total += lat.step_time_s(q, [(q, done)], 0, 0, 1 if done + q == p else 0)
            done += q
        cost.append(total)
    return 1.0 / float(np.dot(weights, cost))


def _length_groups(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct lengths and their shares; beyond MAX_PROMPT_LENGTHS of them, equal-count groups
    priced at their mean length (prefill cost is close to linear within a group)."""
    values, counts = np.unique(lengths, return_counts=True)
    if len(values) <= MAX_PROMPT_LENGTHS:
        return values, counts / counts.sum()
    ordered = np.sort(lengths)
    groups = np.array_split(ordered, MAX_PROMPT_LENGTHS)
    return (np.array([int(round(g.mean())) for g in groups]),
            np.array([len(g) for g in groups], dtype=np.float64) / len(ordered))


def _shared_step_saving(lat, n: int, ctx_sum: int, t_dec: float, budget: int, mean_decodes: float,
                        computed: np.ndarray) -> float:
    """Seconds per prompt saved because prompts share steps. A step's prefill part has a fixed
    share (a prompt alone pays it, k prompts in one step split it), and in the steady state
    k = N / E[o - 1] prompts join each step of N decodes (one per E[o - 1] decode steps each). The
    saving is what a mean-length prompt pays alone less its share of k of them in one step; none
    when k is about one or k mean prompts do not fit the step's token budget."""
    mean = max(1, int(round(float(computed.mean()))))
    k = min(int(round(n / max(mean_decodes, 1.0))), max(0, budget - n) // mean)
    if k < 2:
        return 0.0
    alone = lat.step_time_s(n + mean, [(mean, 0)], n, ctx_sum, n + 1) - t_dec
    together = (lat.step_time_s(n + k * mean, [(mean, 0)] * k, n, ctx_sum, n + k) - t_dec) / k
    return max(0.0, alone - together)


def _prefill_s(lat, prompt: int, n: int, ctx_sum: int, t_dec: float, budget: int, chunked: bool) -> float:
    """Seconds one prompt adds: its chunks' marginal cost on steps of n decodes (chunked prefill),
    or its share of a prompt batch (V0 without chunked prefill; the decodes wait meanwhile)."""
    if not chunked:
        k = max(1, budget // prompt)
        return lat.step_time_s(k * prompt, [(prompt, 0)] * k, 0, 0, k) / k
    room = max(1, budget - n)
    done, total = 0, 0.0
    while done < prompt:
        q = min(room, prompt - done)
        total += lat.step_time_s(n + q, [(q, done)], n, ctx_sum, n + 1) - t_dec
        done += q
    return total
