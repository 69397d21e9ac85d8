"""Continuous batching over a paged KV cache: vLLM (PagedAttention + iteration-level scheduling).

One token-budget loop per step, as in vLLM's scheduler: running requests first (one decode
token each, or their next prefill chunk), then, if nobody was preempted, swapped-out requests
and then waiting ones in arrival order while blocks, `max_num_seqs` and the budget allow.
When a running request cannot get a block, the newest running request is preempted
(recompute: drop its KV and prefill prompt + generated tokens again later; swap: copy its
blocks to the CPU pool over PCIe, and back before it runs again).

Requests with `n > 1` or beam search fork after their prefill and share blocks
(simcore.sampling); `max_num_seqs` and the token budget count their sequences.

With prefix caching on, a waiting request first adopts the cached full blocks of its shared
prefix (simcore.block_pool) and computes only the rest of its prompt. A conversation's turn
(`Request.tokens`, workloads.sessions) looks up every full block of its prompt by vLLM's chained
hashes (simcore.prefix_hash), and its blocks, answer included, are cached as they are computed
and when it finishes, so the next turn finds them. With a CPU KV tier (simcore.kv_tier), cached
blocks are written through to host memory, and a prefix that continues there past the GPU hit is
loaded over PCIe while the request waits (other requests keep stepping) instead of recomputed.

Disaggregated prefill/decode (simcore.disagg), as vLLM V1's scheduler runs a KV connector
(vllm/v1/core/sched/scheduler.py with NixlConnector): on a decode instance, a waiting request
whose prompt KV lives on a prefill instance (`remote_prefill_tokens`) gets blocks for all of it
when it reaches its turn and room exists (else the queue stops there, as for any admission), and
the load starts (`remote_loader`); it then waits without running (WAITING_FOR_REMOTE_KVS, skipped
by the admission loop) until the transfer is done, and is admitted with every prompt token but
the last computed (vLLM recomputes the last one to sample the first token). On a prefill
instance, a finished `hold_kv` request keeps its blocks until `release_held` (NixlConnector's
delay_free_blocks: the producer frees them when the consumer has read them).

Without chunked prefill the registry builds `continuous_v0.VllmV0PagedPolicy` instead (vLLM
V0's prefill-first scheduler); this class then only serves direct construction.

Simplifications: no watermark, no priority scheduling; a swap that does
not fit the CPU pool falls back to recompute (vLLM V0 aborted the request instead); a
multi-sequence request preempted by recompute re-prefills one sequence and forks again.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from kvsim.simcore.block_pool import AllocStatus, PagedAllocator
from kvsim.simcore.kv_tier import HostKVTier
from kvsim.simcore.policies.base import Queues
from kvsim.simcore.sampling import SequenceGroups, group_width
from kvsim.simcore.span import MIN_SPAN_STEPS, SpanShape, block_residues, span_shape
from kvsim.simcore.state import ReqState
from kvsim.simcore.step import MemorySnapshot, StepPlan


class ContinuousPagedPolicy:
    name = "continuous"

    def __init__(
        self,
        allocator: PagedAllocator,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
        preemption_mode: str,
        rng: np.random.Generator | None = None,
        enable_prefix_caching: bool = False,
        host_tier: HostKVTier | None = None,
        load_block_s: float = 0.0,
    ):
        self.enable_prefix_caching = enable_prefix_caching
        # the CPU KV tier (--kv-offloading-size; simcore.kv_tier) and the seconds to load one
        # block from it over the host link
        self.host_tier = host_tier
        self.load_block_s = load_block_s
        # request id -> (ready at, cached, of them loaded, blocks its prompt still needs once loaded,
        # its state, when the load started), in the order the loads started
        self._offloads: dict[int, tuple[float, int, int, int, ReqState, float]] = {}
        self._load_reserved = 0  # those blocks, summed over the queued loads
        self._offload_tokens = 0  # slots written by sequences still loading from the CPU tier (not running)
        self._link_free_s = 0.0  # when the replica's host link finishes its last queued load
        self.offload_hit_tokens = 0  # prompt tokens loaded from the CPU tier instead of recomputed
        self.offload_loaded_blocks = 0
        self.offload_wait_s = 0.0  # seconds requests waited for their loads before their first scheduling
        self._filling_prefix: list[ReqState] = []  # planned requests writing shared-prefix blocks
        self.prefix_query_tokens = 0  # prompt tokens of admitted requests that share a prefix
        self.prefix_hit_tokens = 0  # of those, tokens adopted from the prefix cache
        self.groups = SequenceGroups(allocator, rng or np.random.default_rng(0))
        self._emitting_groups: list[ReqState] = []  # multi-seq requests whose step emits a token
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.swap = preemption_mode == "swap"
        # by lifecycle slot: the allocator row (`seq_index`) of the request's one sequence
        self._seq_index = np.zeros(256, dtype=np.int64)
        self._decode_all_rows: tuple[StepPlan, np.ndarray] | None = None  # the last _decode_all's rows
        # disaggregated serving (module docstring): sequences on the GPU that do not run
        self.remote_loader = None  # called with a request whose remote KV now has blocks here
        self._loading: dict[int, int] = {}  # request id -> prompt tokens being loaded
        self._loaded: set[int] = set()  # loaded, waiting for admission
        self._held: dict[int, int] = {}  # finished hold_kv request id -> tokens its blocks keep
        self.parked_tokens = 0  # KV slots written by those sequences (loading, loaded or held)
        # multi-step scheduling (continuous_v0.py), while a round's first step is planned: slots a
        # sequence takes beyond its next tokens, and free blocks already held back for them (0: none)
        self._round_lookahead = 0
        self._round_reserved = 0

    # -- admission -------------------------------------------------------------------------
    def check(self, st: ReqState) -> str:
        alloc = self.allocator
        if not self.enable_chunked_prefill and st.num_prompt_tokens > self.max_num_batched_tokens:
            return (
                f"prompt of {st.num_prompt_tokens} tokens exceeds max_num_batched_tokens "
                f"{self.max_num_batched_tokens} and chunked prefill is off"
            )
        width = group_width(st)
        if width > min(self.max_num_seqs, self.max_num_batched_tokens):
            return (
                f"runs {width} sequences but a step takes at most max_num_seqs={self.max_num_seqs} "
                f"sequences and max_num_batched_tokens={self.max_num_batched_tokens} tokens"
            )
        if width > 1:
            need = self.groups.num_blocks_for(st)
            if need > alloc.num_gpu_blocks:
                return f"needs {need} KV blocks for {width} sequences but the cache has {alloc.num_gpu_blocks}"
        elif alloc.can_allocate(st.final_len) == AllocStatus.NEVER:
            return (
                f"needs {alloc.blocks_for(st.final_len)} KV blocks but the cache has "
                f"{alloc.num_gpu_blocks}"
            )
        return ""

    def idle_timeout(self, queues: Queues, now: float) -> float | None:
        """An idle engine wakes when the next KV load from the CPU tier completes (a loaded request
        still waiting for blocks waits, like any other, for a step to free them)."""
        pending = [load[0] for load in self._offloads.values() if load[0] > now]
        return min(pending) - now if pending else None

    def counters(self) -> dict[str, int]:
        out = {"prefix_query_tokens": self.prefix_query_tokens, "prefix_hit_tokens": self.prefix_hit_tokens}
        if self.host_tier is not None:
            out.update(offload_hit_tokens=self.offload_hit_tokens, offload_loaded_blocks=self.offload_loaded_blocks,
                       offload_stored_blocks=self.host_tier.num_stored, offload_evicted_blocks=self.host_tier.num_evicted,
                       offload_wait_s=self.offload_wait_s)
        return out

    # -- scheduling ------------------------------------------------------------------------
    def schedule(self, queues: Queues, now: float) -> StepPlan | None:
        plan = self._new_plan()
        running, budget = self._plan_running(plan, queues, self.max_num_batched_tokens)
        if plan.num_preempted:  # (alone, only where blocks of requests that do not run fill the cache:
            return plan  # disaggregated serving; Engine.run applies them and idles)
        if queues.swapped:
            running = list(queues.running) if running is None else running
            budget = self._swap_in(queues, plan, running, budget)
            if len(plan.swapped_in) < len(queues.swapped):
                return plan if plan.num_scheduled else None
        self._admit_waiting(queues, plan, self._num_seqs(queues.running if running is None else running), budget, now)
        return plan if plan.num_scheduled else None

    def _plan_running(self, plan: StepPlan, queues: Queues, budget: int) -> tuple[list[ReqState] | None, int]:
        """The running requests' next tokens: the all-decode step in one pass (`_decode_all`),
        else the general loop, which may preempt. Returns this step's running set as the plan
        leaves it (None when that is `queues.running` unchanged: no copy made) and the budget left."""
        if self._decode_all(plan, queues, budget):
            return None, budget - plan.num_scheduled
        running = list(queues.running)  # this step's running set, as the plan changes it
        return running, self._schedule_running(plan, running, budget, queues)

    def _new_plan(self) -> StepPlan:
        self._emitting_groups = []
        self._filling_prefix = []
        return StepPlan()

    def _decode_all(self, plan: StepPlan, queues: Queues, budget: int) -> bool:
        """The common step: every running request is a plain decode (one sequence, one token)
        and the budget and the free blocks take them all. Schedules them as one `DecodeRun`
        (what `_schedule_running` would plan, in fewer array operations) and returns True;
        otherwise returns False and changes nothing. A request needs a new block exactly when
        its computed tokens fill whole blocks. Their computed tokens sum to the allocator's
        written GPU slots: every sequence on the GPU belongs to a running request (finished
        and recompute-preempted ones were freed, swapped ones sit on the CPU), here one each."""
        slots = queues.running_slots()
        num = len(slots)
        if not num or num > budget:
            return False
        store = queues.store
        if np.count_nonzero(store.plain[slots]) != num:
            return False
        computed = store.computed[slots]
        alloc = self.allocator
        full = np.logical_not(block_residues(computed, alloc.block_size)).nonzero()[0]  # last block full
        if len(full) > alloc.num_free_blocks:
            return False
        rows = self._seq_index[slots]
        # each attends to computed + 1 (sequences still loading KV, remote or from the CPU tier, are not running)
        context_tokens = alloc.num_gpu_tokens - self.parked_tokens - self._offload_tokens + num
        alloc.append_decodes(rows, rows[full].tolist() if len(full) else [])
        plan.add_decode_run(slots.copy(), store, computed, context_tokens)
        self._decode_all_rows = plan, rows  # a decode span of this plan appends to these rows
        return True

    def _schedule_running(self, plan: StepPlan, running: list[ReqState], budget: int, queues: Queues) -> int:
        """Running requests in admission order, each its next tokens under the budget; when
        one cannot get a block, preempt from the tail (itself last). Returns the budget left.

        Consecutive plain decodes (one sequence, one token, its slot fits) are scheduled as one
        `DecodeRun`: they need a new block exactly when their computed tokens fill whole
        blocks, so the run goes as far as the budget and the free blocks allow, and takes
        those blocks in the order one append per request would. Everything else (prefill
        chunks, forked requests, the first request whose block does not fit) takes the path
        below, one request at a time."""
        num_running = len(running)
        if not num_running or budget <= 0:
            return budget
        alloc, store = self.allocator, queues.store
        slots = queues.running_slots().copy()
        computed = store.computed[slots]
        plain = store.plain[slots]
        if np.count_nonzero(plain) == num_running:  # the common step: every request decodes
            stops = [num_running]
        else:
            stops = np.logical_not(plain).nonzero()[0].tolist()
            stops.append(num_running)
        needs_block = np.logical_not(computed % alloc.block_size)  # last block full
        seq_index = self._seq_index
        stop = 0
        i = 0
        while i < len(running) and budget > 0:
            while stops[stop] < i:
                stop += 1
            end = min(stops[stop], len(running), i + budget)
            if end > i:  # a run of plain decodes: as far as the free blocks go
                need = needs_block[i:end]
                free = alloc.num_free_blocks
                if np.count_nonzero(need) > free:
                    end = i + int(np.searchsorted(np.cumsum(need), free, side="right"))
                    need = needs_block[i:end]
                if end > i:
                    run, run_computed = slots[i:end], computed[i:end]
                    rows = seq_index[run]
                    alloc.append_decodes(rows, rows[need].tolist())
                    plan.add_decode_run(run, store, run_computed, int(run_computed.sum()) + (end - i))
                    budget -= end - i
                    i = end
                    continue
            st = running[i]
            seq_ids = self.groups.seq_ids(st)
            k = len(seq_ids)
            if k == 1:
                num_new = min(st.num_tokens - st.num_computed_tokens, budget)
            else:
                num_new = 1  # a forked request only decodes
                if k > budget:
                    break
            scheduled = self._grow(seq_ids, num_new)
            while not scheduled:
                victim = running.pop()
                self._preempt(victim, plan)
                if victim is st:
                    break
                scheduled = self._grow(seq_ids, num_new)
            if not scheduled:
                break
            self._add(plan, st, num_new, k)
            budget -= num_new * k
            i += 1
        return budget

    def _grow(self, seq_ids: list[int], num_new: int) -> bool:
        """`num_new` slots for a one-sequence request, or one decode slot for every sequence of
        a forked one; all or nothing."""
        alloc = self.allocator
        if len(seq_ids) == 1:
            return alloc.append_slots(seq_ids[0], num_new)
        need = sum(alloc.num_blocks_needed(s, 1) for s in seq_ids)
        if need > alloc.num_free_blocks:
            return False
        for seq_id in seq_ids:
            alloc.append_slots(seq_id, 1)
        return True

    def _add(self, plan: StepPlan, st: ReqState, num_new: int, k: int, num_computed: int | None = None) -> None:
        computed = st.num_computed_tokens if num_computed is None else num_computed
        if num_new == 1 and st.num_generated:
            plan.add_decode(st, k)
        else:
            plan.add_prefill(st, num_new, computed)
            if self.enable_prefix_caching and (computed < st.request.num_prefix_tokens or st.request.tokens is not None):
                self._filling_prefix.append(st)
        if group_width(st) > 1 and computed + num_new == st.num_tokens:
            self._emitting_groups.append(st)

    def _prefix_hashes(self, st: ReqState) -> list:
        """Content keys of the request's full blocks that may be cached (none if caching is off or
        the request shares nothing): a conversation turn's every full block, chained as vLLM
        hashes them (simcore.prefix_hash); else the blocks inside a declared shared prefix,
        block i of prefix p being (p, i)."""
        req = st.request
        if not self.enable_prefix_caching or self.groups.is_forked(st):
            return []
        if req.tokens is not None:
            return req.tokens.block_hashes(self.allocator.block_size, st.num_tokens // self.allocator.block_size)
        if req.prefix_id is None:
            return []
        return [(req.prefix_id, i) for i in range(req.num_prefix_tokens // self.allocator.block_size)]

    def _cache_blocks(self, st: ReqState) -> None:
        """Register the request's computed full blocks in the GPU prefix cache, and write them
        through to the CPU tier when there is one (vLLM caches and offloads every full block
        a step computes, output blocks included)."""
        if self.groups.is_forked(st):
            return
        hashes = self._prefix_hashes(st)
        if not hashes:
            return
        alloc = self.allocator
        alloc.cache_full_blocks(st.request_id, hashes)
        if self.host_tier is not None:
            self.host_tier.store(hashes[:alloc.num_tokens(st.request_id) // alloc.block_size])

    def _num_seqs(self, running: Sequence[ReqState]) -> int:
        return len(running) + self.groups.num_extra_seqs()

    def _swap_in(self, queues: Queues, plan: StepPlan, running: list[ReqState], budget: int) -> int:
        alloc, swapped = self.allocator, queues.swapped
        j = 0
        while j < len(swapped) and budget > 0 and self._num_seqs(running) < self.max_num_seqs:
            st = swapped[j]
            seq_ids = self.groups.seq_ids(st)
            k = len(seq_ids)
            if k == 1:  # exactly the blocks it will hold after this step's tokens (and a round's lookahead)
                num_new = min(st.num_tokens - st.num_computed_tokens, budget)
                need = alloc.blocks_for(st.num_computed_tokens + num_new if not self._round_lookahead
                                        else self._lookahead_target(st.num_computed_tokens + num_new))
            else:  # its blocks, plus a new or copied-on-write block per sequence
                num_new = 1
                need = len(alloc.distinct_blocks(seq_ids)) + 2 * k
                if not running:
                    need = min(need, alloc.num_gpu_blocks)
            # vLLM's budget.can_schedule: the group's every sequence within max_num_seqs
            if (alloc.num_free_blocks - self._round_reserved < need or k > budget
                    or self._num_seqs(running) + k > self.max_num_seqs):
                break
            plan.num_swap_blocks += alloc.swap_in(seq_ids)
            plan.swapped_in.append(st)
            running.append(st)
            j += 1
            ok = self._grow(seq_ids, num_new)
            assert ok, "swap-in checked room for the next token"
            if self._round_lookahead:  # the rest of its lookahead blocks held back for the round
                self._round_reserved += need - len(alloc.block_table(st.request_id))
            self._add(plan, st, num_new, k)
            budget -= num_new * k
        return budget

    def _admit_waiting(self, queues: Queues, plan: StepPlan, num_seqs: int, budget: int, now: float = 0.0) -> None:
        """Waiting requests in order while the budget, `max_num_seqs` (`num_seqs` already
        scheduled or running) and the blocks allow; chunked when the budget ends in a prompt.
        A request whose prefix continues in the CPU tier starts loading it instead and is
        passed over until the load is done, as vLLM skips requests waiting for remote KV; and
        as vLLM puts the requests it skipped back at the front of its queue, those loading are
        looked at first, in the order their loads started (so a request preempted to the head of
        the queue cannot wait forever for blocks the loads behind it hold)."""
        if not queues.waiting:
            return
        alloc = self.allocator
        order = queues.waiting
        if self._offloads:
            loads = [load[4] for load in self._offloads.values()]
            started = set(self._offloads)
            order = chain(loads, (st for st in queues.waiting if st.request_id not in started))
        for st in order:
            if budget <= 0 or num_seqs + group_width(st) > self.max_num_seqs:
                break
            if st.request_id in self._offloads:
                ready_s, num_cached, num_loaded, rest, _, start_s = self._offloads[st.request_id]
                if ready_s > now:
                    continue
                num_new = st.num_tokens - num_cached
                if num_new > budget:
                    if not self.enable_chunked_prefill:
                        break
                    num_new = budget
                if not alloc.append_slots(st.request_id, num_new):
                    break
                del self._offloads[st.request_id]
                if st.first_scheduled_s < 0:  # a load in its time to first token (TTFT split: simulate)
                    self.offload_wait_s += ready_s - start_s
                self._load_reserved -= rest
                self._offload_tokens -= num_cached
                num_seqs += self._take_admitted(plan, st, num_new, num_cached, True, num_loaded)
                budget -= num_new
                continue
            remote = st.request.remote_prefill_tokens
            if remote:  # its prompt's KV comes from a prefill instance (module docstring)
                rid = st.request_id
                if rid in self._loading:
                    continue  # WAITING_FOR_REMOTE_KVS: skipped
                if rid in self._loaded:
                    self._admit_loaded(plan, st, remote)
                    num_seqs += 1
                    budget -= 1
                    continue
                if not alloc.allocate_slots(rid, remote):
                    break
                self._loading[rid] = remote
                self.parked_tokens += remote
                self.remote_loader(st)
                continue
            hashes = self._prefix_hashes(st)
            hit_blocks = 0
            if hashes:  # look up the cached prefix; at least one prompt token is still computed
                hit_blocks = min(alloc.num_cached_prefix_blocks(hashes), (st.num_tokens - 1) // alloc.block_size)
                if self.host_tier is not None and self._start_load(st, hashes, hit_blocks, now):
                    continue
            num_cached = hit_blocks * alloc.block_size
            num_new = st.num_tokens - num_cached
            if num_new > budget:
                if not self.enable_chunked_prefill:
                    break
                num_new = budget
            if not alloc.allocate_slots(st.request_id, num_new, hashes[:hit_blocks]):
                break
            num_seqs += self._take_admitted(plan, st, num_new, num_cached, bool(hashes) or (st.request.tokens is not None
                                                                             and self.enable_prefix_caching))
            budget -= num_new

    def _start_load(self, st: ReqState, hashes: list, hit_blocks: int, now: float) -> bool:
        """If the request's prefix continues in the CPU tier after its `hit_blocks` GPU hits, take
        GPU blocks for the GPU hits and the loaded blocks and queue the load on the host link;
        True when a load started (the request then waits for it)."""
        alloc, tier = self.allocator, self.host_tier
        tier.touch(hashes)  # vLLM's get_num_new_matched_tokens touches the request's blocks
        num_loaded = min(tier.num_hits(hashes, hit_blocks), (st.num_tokens - 1) // alloc.block_size - hit_blocks)
        if num_loaded <= 0:
            return False
        bs = alloc.block_size
        need = alloc.num_blocks_to_allocate(st.num_tokens - hit_blocks * bs, hashes[:hit_blocks])
        if need + self._load_reserved > alloc.num_free_blocks:
            # its whole prompt does not fit now, beside what the queued loads' prompts still need:
            # it waits, as without the tier, and looks again. (A load holds its blocks while it
            # waits; without that reserve, loads could hold every block with nothing running to
            # free one: a deadlock vLLM's scheduler, which checks only the loaded blocks, can reach.)
            return False
        if not alloc.allocate_slots(st.request_id, num_loaded * bs, hashes[:hit_blocks]):
            return False
        # (the loaded blocks are registered in the GPU cache once the request runs, as vLLM delays
        # caching blocks that are still loading)
        ready_s = max(now, self._link_free_s) + num_loaded * self.load_block_s
        self._link_free_s = ready_s
        num_cached = (hit_blocks + num_loaded) * bs
        rest = alloc.blocks_for(st.num_tokens) - len(alloc.block_table(st.request_id))
        self._offloads[st.request_id] = (ready_s, num_cached, num_loaded * bs, rest, st, now)
        self._load_reserved += rest
        self._offload_tokens += num_cached
        self.offload_loaded_blocks += num_loaded
        return True

    def remote_loaded(self, request_id: int) -> None:
        """The transfer into this instance's blocks is done: admissible at the next step."""
        self._loaded.add(request_id)
        del self._loading[request_id]

    def _admit_loaded(self, plan: StepPlan, st: ReqState, num_remote: int) -> None:
        """Admit a request whose prompt KV arrived: its blocks hold every prompt token; it
        computes the last one again (vLLM's scheduler: `num_computed_tokens -= 1` on a full hit)
        to sample its first token. From here on it is a local request (a recompute preemption
        prefills its whole prompt here)."""
        self._loaded.discard(st.request_id)
        self.parked_tokens -= num_remote
        st.request.remote_prefill_tokens = 0
        if st.slot >= len(self._seq_index):
            self._seq_index = np.concatenate([self._seq_index, np.zeros(st.slot + 1, dtype=np.int64)])
        self._seq_index[st.slot] = self.allocator.seq_index(st.request_id)
        plan.admit(st, num_remote - 1)
        plan.add_prefill(st, 1, num_remote - 1)

    def release_held(self, request_id: int) -> None:
        """The consumer has read a finished request's KV: its blocks go back (NixlConnector)."""
        self.parked_tokens -= self._held.pop(request_id)
        self.allocator.free(request_id)

    @property
    def num_held(self) -> int:
        """Finished requests whose KV this (prefill) instance still keeps for a transfer."""
        return len(self._held)

    def _take_admitted(self, plan: StepPlan, st: ReqState, num_new: int, num_cached: int, shares_prefix: bool,
                       num_loaded: int = 0) -> int:
        """Count its prefix-cache hit (`num_loaded` of the cached tokens came from the CPU tier),
        admit and schedule a request whose slots are allocated; returns the sequences it adds
        to the step."""
        self.prefix_query_tokens += st.num_tokens if shares_prefix else 0
        self.prefix_hit_tokens += num_cached - num_loaded
        self.offload_hit_tokens += num_loaded
        if st.slot >= len(self._seq_index):
            self._seq_index = np.concatenate([self._seq_index, np.zeros(st.slot + 1, dtype=np.int64)])
        self._seq_index[st.slot] = self.allocator.seq_index(st.request_id)
        plan.admit(st, num_cached)
        self._add(plan, st, num_new, 1, num_cached)
        return group_width(st)

    def _preempt(self, st: ReqState, plan: StepPlan) -> None:
        alloc = self.allocator
        seq_ids = self.groups.seq_ids(st)
        if self.swap and alloc.can_swap_out(seq_ids):
            plan.num_swap_blocks += alloc.swap_out(seq_ids)
            plan.preempt(st, by_swap=True)
        else:
            if st.request.tokens is not None and self.enable_prefix_caching:
                self._cache_blocks(st)  # its computed blocks stay cached when freed (vLLM)
            self._release(st)
            plan.preempt(st, by_swap=False)

    # -- decode spans (simcore.span) ------------------------------------------------------
    def decode_span(self, plan: StepPlan, queues: Queues) -> SpanShape | None:
        """How many steps, this one first, step-by-step scheduling would plan exactly like
        `plan` (every running request decodes one token, nothing joins or leaves), or None
        when that is one step. Holds while no request finishes, no append can fail (one block
        stays free) and the queue cannot move: it is empty (the engine cuts the span at an
        arrival), or its head was refused this step for a reason that only gets worse as the
        batch grows (budget, max_num_seqs, blocks). Not with forked requests, swapped ones, or
        a head that could adopt cached prefix blocks (evictions change what it needs)."""
        if (plan.prefill_chunks or plan.num_preempted or plan.swapped_in or plan.admitted
                or self.groups.active or self._emitting_groups or queues.swapped
                or self._loading or self._loaded or self._held):  # a transfer ends between steps
            return None
        num_running = len(queues.running)
        if not num_running or plan.num_decode_seqs != num_running:
            return None
        waiting = queues.waiting
        if waiting and self.enable_prefix_caching and self._prefix_hashes(waiting[0]):
            return None
        if self._offloads:  # a load from the CPU tier that completes lets a request in
            return None
        parts = plan.parts
        if len(parts) == 1 and type(parts[0]) is not tuple:  # one DecodeRun (the all-decode step): its slots and computed tokens
            slots, computed = parts[0].slots, parts[0].computed
        elif any(type(part) is tuple for part in parts):
            # a decode outside a DecodeRun (a recomputed request's one-token last chunk is not
            # `plain`): emit_span takes DecodeRuns only, so this plan runs as one step
            return None
        else:
            slots, computed = queues.running_slots(), None
        store = queues.store
        remaining = store.remaining[slots]
        min_remaining = int(remaining[remaining.argmin()])  # argmin: no ufunc-reduction set-up
        if min_remaining < MIN_SPAN_STEPS:
            return None  # a request finishes within a step or two: single steps are cheaper
        if computed is None:
            computed = store.computed[slots]
        alloc = self.allocator
        used = alloc.num_used_blocks
        # nothing shared (no fork; no cached block, which a request could hold with others): the
        # running requests hold every used block, so their last blocks' unfilled slots are the
        # used slots less the written ones (as in end_step)
        internal_first = None if alloc.cached else used * alloc.block_size - alloc.num_gpu_tokens
        shape = span_shape(computed, min_remaining, alloc.block_size, alloc.num_free_blocks,
                           internal_first=internal_first)
        if shape.num_steps < 2:
            return None
        shape.used_blocks = used
        return shape

    def extend_span(self, plan: StepPlan, num_steps: int) -> None:
        """The KV of steps 2..num_steps of a decode span (step 1's was taken by `schedule`):
        one append per request instead of one per request per step. Which physical blocks a
        sequence gets differs from step-by-step appends; how many, and which cached blocks are
        evicted, does not."""
        if num_steps < 2:
            return
        last = self._decode_all_rows
        rows = last[1] if last is not None and last[0] is plan else self._seq_index[plan.decode_slots()]
        self.allocator.append_runs(rows, num_steps - 1)

    # -- commit ----------------------------------------------------------------------------
    def _release(self, st: ReqState) -> None:
        if self.groups.is_forked(st):
            self.groups.release(st)
        else:
            self.allocator.free(st.request_id)

    def end_step(self, plan: StepPlan, finished: list[ReqState], queues: Queues) -> MemorySnapshot:
        alloc, groups = self.allocator, self.groups
        for st in self._emitting_groups:
            if st.num_generated >= st.num_output_target:
                continue
            if not groups.is_forked(st):
                groups.fork(st)
            elif st.request.beam_width > 1:
                groups.reselect_beams(st)
        for st in self._filling_prefix:
            self._cache_blocks(st)
        for st in finished:  # a turn's answer blocks are cached for the conversation's next turn
            if st.request.tokens is not None and self.enable_prefix_caching:
                self._cache_blocks(st)
        bs = alloc.block_size
        allocated = alloc.num_used_blocks * bs
        # Only last blocks can be partly filled, and those are never shared across requests,
        # so live = allocated - unfilled slots of last blocks (right even when prefixes are shared).
        if groups.active:
            internal, saved = groups.internal_and_saved()
            internal += sum([(-st.num_computed_tokens) % bs for st in queues.running if not groups.is_forked(st)])
        elif alloc.cached:  # running requests may share cached prefix blocks
            internal, saved = int(((-queues.store.computed[queues.running_slots()]) % bs).sum()), 0
        else:  # no block is shared (a block is shared only by a fork or while it is cached): the
            # sequences on the GPU (the running requests) hold every used block, each exactly
            # blocks_for(its written slots), so the unfilled slots are allocated - written slots
            internal, saved = allocated - alloc.num_gpu_tokens, 0
        mem = MemorySnapshot(allocated, allocated - internal, internal=internal, unshared=allocated + saved)
        for st in finished:
            if st.request.hold_kv and not groups.is_forked(st):  # kept for the decode instance to read
                tokens = self.allocator.num_tokens(st.request_id)
                self._held[st.request_id] = tokens
                self.parked_tokens += tokens
                continue
            self._release(st)
        return mem
