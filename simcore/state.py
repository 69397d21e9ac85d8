"""Per-request simulation state, shared by the engine, the policies and the metrics."""

from __future__ import annotations

from enum import IntEnum

import simpy

from simcore.request import Request


class RequestStatus(IntEnum):
    """Ordered so that `status >= FINISHED` means the request has left the engine."""

    WAITING = 0  # queued, or preempted by recompute (its KV was dropped)
    RUNNING = 1  # holds KV on the GPU and is scheduled every step
    SWAPPED = 2  # preempted by swap: its KV sits in the CPU pool
    FINISHED = 3  # produced its last token
    REJECTED = 4  # can never be served (reason in `reject_reason`)


class ReqState:
    """One request inside an engine. Written by the engine and its policy only.

    Token arithmetic follows vLLM: `num_tokens` = prompt + tokens generated so far, and
    `num_computed_tokens` catches up to it. A step that makes them equal emits a token:

        prompt p0..p4 | out o0 o1        num_tokens = 7
        computed: p0..p4 o0              num_computed_tokens = 6 -> next step computes o1
    """

    __slots__ = (
        "request", "request_id", "seq_ids", "status", "num_prompt_tokens",
        "num_output_target", "num_tokens", "num_computed_tokens", "num_generated",
        "first_scheduled_s", "first_token_s", "last_token_s", "finish_s", "num_preemptions",
        "reject_reason", "done", "reserved_tokens", "padded_len",
    )

    def __init__(self, request: Request, done: simpy.Event, max_model_len: int):
        self.request = request
        self.request_id = request.request_id
        self.seq_ids = [request.request_id]  # allocator ids; one per live sample
        self.status = RequestStatus.WAITING
        self.num_prompt_tokens = request.num_prompt_tokens
        # vLLM stops a sequence at max_model_len (finish reason "length").
        self.num_output_target = max(
            1, min(request.num_output_tokens, max_model_len - request.num_prompt_tokens)
        )
        self.num_tokens = request.num_prompt_tokens  # grows by one per emitted token
        self.num_computed_tokens = 0  # tokens whose KV is written, <= num_tokens
        self.num_generated = 0  # output tokens emitted so far
        self.first_scheduled_s = -1.0
        self.first_token_s = -1.0
        self.last_token_s = -1.0
        self.finish_s = -1.0
        self.num_preemptions = 0
        self.reject_reason = ""
        self.done = done  # succeeds when the request leaves (finished or rejected)
        self.reserved_tokens = 0  # contiguous reservation size, 0 for paged
        self.padded_len = 0  # static batching: padded prompt length of its batch

    @property
    def seq_id(self) -> int:
        return self.seq_ids[0]

    @property
    def final_len(self) -> int:
        """Prompt + every output token the request will have written as KV."""
        return self.num_prompt_tokens + self.num_output_target - 1
