"""Per-request simulation state. Read by the policies and the metrics; written only by
`simcore.lifecycle.Lifecycle`, through the transitions `LEGAL_TRANSITIONS` allows."""

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


_W, _R, _S = RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.SWAPPED
LEGAL_TRANSITIONS: frozenset[tuple[RequestStatus, RequestStatus]] = frozenset({
    (_W, _R),  # admitted
    (_R, _W),  # preempted by recompute (back to the front of the queue)
    (_R, _S),  # preempted by swap
    (_S, _R),  # swapped back in
    (_R, RequestStatus.FINISHED),  # produced its last token
    (_W, RequestStatus.REJECTED),  # refused on arrival
})


class ReqState:
    """One request inside an engine.

    Token arithmetic follows vLLM: `num_tokens` = prompt + tokens generated so far, and
    `num_computed_tokens` catches up to it. A step that makes them equal emits a token:

        prompt p0..p4 | out o0 o1        num_tokens = 7
        computed: p0..p4 o0              num_computed_tokens = 6 -> next step computes o1
    """

    __slots__ = (
        "request", "request_id", "status", "num_prompt_tokens",
        "num_output_target", "num_tokens", "num_computed_tokens", "num_generated",
        "first_scheduled_s", "first_token_s", "last_token_s", "finish_s", "num_preemptions",
        "reject_reason", "done",
    )

    def __init__(self, request: Request, done: simpy.Event, max_model_len: int):
        self.request = request
        self.request_id = request.request_id
        self.status = RequestStatus.WAITING
        self.num_prompt_tokens = request.num_prompt_tokens
        # vLLM stops a sequence at max_model_len (finish reason "length").
        self.num_output_target = max(
            1, min(request.num_output_tokens, max_model_len - request.num_prompt_tokens)
        )
        self.num_tokens = request.num_prompt_tokens  # grows by one per emitted token
        self.num_computed_tokens = 0  # tokens whose KV is written, <= num_tokens
        self.num_generated = 0  # output tokens emitted so far
        self.first_scheduled_s = -1.0  # first admission; kept across preemptions
        self.first_token_s = -1.0
        self.last_token_s = -1.0
        self.finish_s = -1.0
        self.num_preemptions = 0
        self.reject_reason = ""
        self.done = done  # succeeds when the request leaves (finished or rejected)

    @property
    def final_len(self) -> int:
        """Prompt + every output token the request will have written as KV."""
        return self.num_prompt_tokens + self.num_output_target - 1
