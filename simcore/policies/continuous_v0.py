"""Continuous batching over a paged KV cache without chunked prefill: vLLM V0's default
scheduler (`vllm/core/scheduler.py`, `Scheduler._schedule_default`, with `_schedule_prefills`,
`_schedule_running` and `_schedule_swapped`; block admission from `vllm/core/block_manager.py`,
`can_allocate` with `watermark=0.01`).

Prefills and decodes never share a step, and prefills come first:

    swapped queue empty?  admit waiting prompts, FIFO, each whole (prompt + tokens generated
        before a recompute preemption) while  tokens <= max_num_batched_tokens - taken,
        sequences <= max_num_seqs (running ones counted), and
        free blocks - blocks needed >= watermark (1% of the cache); the first that does not
        fit stops admission (LATER).
    any prompt admitted?  the step is those prefills only; running requests wait a step.
    otherwise             a decode step of every running request (preempting from the tail of
        `running` when one cannot get a block, itself last), then, if nobody was preempted,
        swapped-out requests come back in FIFO order while they fit.

So while anything is swapped out no prompt is admitted, and a burst of arrivals stalls every
running decode for one prefill step each time prompts are admitted (the ITL spikes chunked
prefill was introduced to remove).

Simplifications: as in `continuous.py` (no priority scheduling, no `delay_factor`, a swap that
does not fit the CPU pool falls back to recompute); a request that could never pass the
watermark is rejected on arrival (vLLM V0 marks it FINISHED_IGNORED when it reaches the head).

Multi-step scheduling (`num_scheduler_steps` > 1: the `vllm-0.6` preset, vLLM 0.6's
`--num-scheduler-steps 10`; vllm-project/vllm PR #7000, in v0.6.0). `LLMEngine.step` calls the
scheduler only when the cached batch has no steps left (`_has_remaining_steps`), and caches a
batch for more steps only when `scheduler_outputs.num_lookahead_slots > 0`. The V0 scheduler
gives a decode batch `num_scheduler_steps - 1` lookahead slots (`_get_num_lookahead_slots(
is_prefill=False)`) and a prefill batch none, so:

    prefill step   one step, as above (nothing is cached; the next step schedules again)
    decode round   `num_scheduler_steps` steps of the same sequences: the scheduler runs at the
                   first only, so no request is admitted, swapped in or preempted until the round
                   ends. At its start every sequence must get slots for this step's token and the
                   lookahead (`can_append_slots(seq_group, num_lookahead_slots)`, then
                   `append_slots` takes them), else the tail is preempted as above; a swap-in
                   likewise (`can_swap_in(seq_group, num_lookahead_slots)`).
    finishing      the worker advances its frozen batch every step (vllm/worker/
                   multi_step_model_runner.py `_advance_step` over `num_seqs`, at
                   047281dfe599dd1ad5f0172b08ba466e5a6be794), and the output processor drops
                   tokens past max_tokens or EOS (vllm/engine/output_processor/multi_step.py
                   `_process_seq_outputs`, at 01e7d05954fadae24e68e25c44ed38bca5b0f9bb): a sequence
                   that finishes mid-round emits nothing more, but the GPU computes it to the
                   round's end (priced here), and its blocks, freed at once, serve nobody before
                   the next scheduler call.
    all finished   with nothing waiting the engine idles (`has_unfinished_requests`); the cached
                   round's remaining steps run when the next request comes, before it is scheduled.

Multi-step as vLLM 0.6 ran it: one sequence per request (its output processor asserts one
running sequence: "Beam search not supported in multi-step decoding"); requests with n > 1 or
beam search are refused. The round's lookahead blocks are checked and held back at its start and
taken step by step (vLLM takes them at once): decisions are the same, the KV occupancy reported
inside a round is the written slots'. Lookahead past `max_model_len` is not asked for (a sequence
never grows past it), so one request that fits the cache always fits.
"""

from __future__ import annotations

from kvsim.simcore.policies.base import Queues
from kvsim.simcore.policies.continuous import ContinuousPagedPolicy
from kvsim.simcore.sampling import group_width
from kvsim.simcore.state import ReqState
from kvsim.simcore.step import StepPlan

WATERMARK = 0.01  # vLLM V0 BlockSpaceManager(watermark=0.01): share of blocks admission keeps free


class VllmV0PagedPolicy(ContinuousPagedPolicy):
    name = "continuous-v0"  # --policy continuous --allocator paged --no-enable-chunked-prefill

    def __init__(self, *args, num_scheduler_steps: int = 1, max_model_len: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        assert not self.enable_chunked_prefill, "vLLM V0's default scheduler never chunks a prompt"
        self.watermark_blocks = int(WATERMARK * self.allocator.num_gpu_blocks)
        # multi-step scheduling (module docstring): steps per decode round; 1: every step scheduled
        self.num_scheduler_steps = num_scheduler_steps
        self.max_model_len = max_model_len  # lookahead slots stop there
        self._round_left = 0  # steps of the decode round under way still to plan (0: none)
        self._num_ghosts = 0  # sequences of the round that finished; the GPU computes them to its end
        self._ghost_context = 0  # their context tokens at the next step, summed

    def check(self, st: ReqState) -> str:
        reason = super().check(st)
        if reason:
            return reason
        if self.num_scheduler_steps > 1 and group_width(st) > 1:
            return ("runs several sequences (n > 1 or beam search), which vLLM 0.6's multi-step scheduling "
                    "does not (--num-scheduler-steps)")
        usable = self.allocator.num_gpu_blocks - self.watermark_blocks
        need = self.allocator.blocks_for(st.final_len)
        if group_width(st) == 1 and need > usable:
            return (
                f"needs {need} KV blocks but admission keeps a watermark of {self.watermark_blocks} "
                f"of the cache's {self.allocator.num_gpu_blocks} blocks free"
            )
        return ""

    def schedule(self, queues: Queues, now: float) -> StepPlan | None:
        if self._round_left:
            return self._continue_round(queues)
        plan = self._new_plan()
        if not queues.swapped and queues.waiting:
            self._schedule_prefills(queues, plan, self._num_seqs(queues.running))
            if plan.num_scheduled:
                return plan
        if self.num_scheduler_steps > 1:  # a decode round starts: slots for its lookahead too
            self._round_lookahead = self.num_scheduler_steps - 1
            running, budget = self._start_round(plan, queues, self.max_num_batched_tokens)
        else:
            running, budget = self._plan_running(plan, queues, self.max_num_batched_tokens)
        if queues.swapped and not plan.num_preempted:
            self._swap_in(queues, plan, list(queues.running) if running is None else running, budget)
        if self._round_lookahead:
            self._round_lookahead = self._round_reserved = 0
            if plan.num_scheduled:
                self._round_left = self.num_scheduler_steps - 1
                self._num_ghosts = self._ghost_context = 0
        return plan if plan.num_scheduled or plan.num_preempted else None

    # -- multi-step scheduling (module docstring) --------------------------------------------
    def _lookahead_target(self, num_tokens: int) -> int:
        return min(num_tokens + self._round_lookahead, self.max_model_len)

    def _start_round(self, plan: StepPlan, queues: Queues, budget: int) -> tuple[list[ReqState], int]:
        """V0's `_schedule_running` with lookahead: in order, each running request (a one-sequence
        decode) needs blocks for this step's token and the round's lookahead beside those held
        back for the requests before it; while it does not fit, preempt from the tail (itself
        last). It takes this step's slot now and the rest of its blocks are held back
        (`_round_reserved`) until the round's steps take them."""
        alloc = self.allocator
        running = list(queues.running)
        i = 0
        while i < len(running) and budget > 0:
            st = running[i]
            rid = st.request_id
            assert st.num_tokens - st.num_computed_tokens == 1, "V0 runs whole prompts: a running request decodes"
            held = len(alloc.block_table(rid))
            need = alloc.blocks_for(self._lookahead_target(alloc.num_tokens(rid) + 1)) - held
            while need > alloc.num_free_blocks - self._round_reserved:
                victim = running.pop()
                self._preempt(victim, plan)
                if victim is st:
                    break
            else:
                ok = alloc.append_slots(rid, 1)
                assert ok, "its lookahead fits"
                self._round_reserved += need - (len(alloc.block_table(rid)) - held)
                self._add(plan, st, 1, 1)
                budget -= 1
                i += 1
                continue
            break
        return running, budget

    def _continue_round(self, queues: Queues) -> StepPlan | None:
        """A step of the round under way: its requests still running decode (their blocks were
        held back at its start), and those that finished are computed too (`_num_ghosts`). With
        nothing running, waiting or swapped the engine idles and the round waits (module
        docstring)."""
        if not queues.running and not queues.waiting and not queues.swapped:
            return None
        self._round_left -= 1
        plan = self._new_plan()
        if queues.running:
            self._plan_running(plan, queues, self.max_num_batched_tokens)
            assert not plan.num_preempted, "the round's blocks were held back at its start"
        num = self._num_ghosts
        if num:
            plan.num_tokens += num
            plan.num_decode_seqs += num
            plan.num_sampled += num
            plan.decode_context_tokens += self._ghost_context
            self._ghost_context += num  # each attends to one more token at the next step
        return plan

    def decode_span(self, plan: StepPlan, queues: Queues):
        """As ContinuousPagedPolicy's, ending at the round's last step at the latest (the next
        round's lookahead may preempt where single steps would not)."""
        shape = super().decode_span(plan, queues)
        if shape is None or self.num_scheduler_steps == 1:
            return shape
        most = self._round_left + 1  # this step and the round's steps after it
        if most < 2:
            return None
        if shape.num_steps > most:
            shape.num_steps = most
            shape.new_blocks_cum = shape.new_blocks_cum[:most]
        return shape

    def extend_span(self, plan: StepPlan, num_steps: int) -> None:
        super().extend_span(plan, num_steps)
        if self._round_left and num_steps > 1:
            self._round_left -= num_steps - 1

    def end_step(self, plan: StepPlan, finished: list[ReqState], queues: Queues):
        if self._round_left and finished:  # finished mid-round: still computed until the round ends
            self._num_ghosts += len(finished)
            self._ghost_context += sum(st.num_computed_tokens + 1 for st in finished)
        return super().end_step(plan, finished, queues)

    def _schedule_prefills(self, queues: Queues, plan: StepPlan, num_seqs: int) -> None:
        """Whole waiting prompts in order while the budget, `max_num_seqs` (`num_seqs` running)
        and the blocks above the watermark allow."""
        alloc = self.allocator
        budget = self.max_num_batched_tokens
        for st in queues.waiting:
            num_tokens = st.num_tokens
            # the budget and sequence checks come first here (vLLM checks blocks first): each
            # refusal stops admission and changes nothing, so the order decides nothing
            if num_tokens > budget or num_seqs + group_width(st) > self.max_num_seqs:
                break
            hashes = self._prefix_hashes(st)
            hit_blocks = 0
            if hashes:
                hit_blocks = min(alloc.num_cached_prefix_blocks(hashes), (num_tokens - 1) // alloc.block_size)
                need = alloc.num_blocks_to_allocate(num_tokens - hit_blocks * alloc.block_size, hashes[:hit_blocks])
            else:
                need = alloc.blocks_for(num_tokens)
            if alloc.num_free_blocks - need < self.watermark_blocks:
                break  # AllocStatus.LATER
            num_cached = hit_blocks * alloc.block_size
            num_new = num_tokens - num_cached
            ok = alloc.allocate_slots(st.request_id, num_new, hashes[:hit_blocks])
            assert ok, "the watermark check left room"
            num_seqs += self._take_admitted(plan, st, num_new, num_cached, bool(hashes))
            budget -= num_tokens  # V0 counts the whole prompt against the budget
