"""What arrives at an engine, and the two small protocols between workloads and the engine."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:  # annotations only: SimPy is imported by the Python engine (simcore.simulate)
    import simpy


@dataclass(slots=True)
class Request:
    """One client request. The engine generates exactly `num_output_tokens` tokens (as with
    `ignore_eos`); reservation-based policies only know `max_tokens`, the client's cap."""

    request_id: int  # unique within a run, assigned by the workload
    arrival_s: float  # simulated time it reached the engine; stamped by `RequestSink.submit`
    num_prompt_tokens: int  # >= 1
    num_output_tokens: int  # >= 1, the true output length
    max_tokens: int = 0  # >= num_output_tokens; 0 means "equal to num_output_tokens"
    n: int = 1  # parallel samples sharing the prompt (vLLM's SamplingParams.n)
    beam_width: int = 1  # beam search width; 1 means no beam search
    prefix_id: int | None = None  # requests with the same id share their first prefix tokens
    num_prefix_tokens: int = 0  # length of that shared prefix (<= num_prompt_tokens)
    # a conversation's turn (workloads.sessions): the synthetic token stream its prompt and
    # answer are read from (simcore.prefix_hash.TokenStream), so its blocks are hashed as vLLM
    # hashes them and a later turn finds them in the prefix cache; None for a lone request
    tokens: Any = None
    session_id: int = -1  # the conversation, -1 for none
    turn: int = 0  # 1-based turn within the conversation, 0 for none
    # disaggregated prefill/decode (simcore.disagg): a decode instance loads the KV of the
    # request's first `remote_prefill_tokens` tokens from a prefill instance instead of computing
    # them; a prefill instance keeps the KV of a `hold_kv` request after it finishes, until the
    # transfer has read it (vLLM's NixlConnector: kv_consumer / kv_producer)
    remote_prefill_tokens: int = 0
    hold_kv: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            self.max_tokens = self.num_output_tokens


class RequestSink(Protocol):
    """Where a workload's arrival process hands requests (an engine or a router)."""

    def submit(self, request: Request) -> simpy.Event:
        """Stamp `arrival_s = env.now`, enqueue, and return an event that fires when the
        request finishes or is rejected (a closed loop of clients waits on it). An engine also
        takes `submit(request, arrival_s)` for a request its `hold_arrivals` delayed."""
        ...

    # A sink may also offer `send(request[, arrival_s]) -> None`: `submit` without the completion
    # event, for a caller that never waits (an open loop; see `Engine.send`). Optional, so it is
    # not part of the protocol; workloads.arrivals falls back to `submit`.


class Workload(Protocol):
    """A description of traffic that can start its SimPy arrival process."""

    name: str

    def process(
        self, env: simpy.Environment, sink: RequestSink, seed: np.random.SeedSequence
    ) -> Generator[simpy.Event, Any, Any]:
        """Submit every request to `sink`, then return what the generation counted (clipped
        lengths, ...), which `describe` takes back, or None. All randomness comes from `seed`."""
        ...

    def describe(self, stats: Any = None) -> dict[str, Any]:
        """The workload's parameters, with a generation's `stats` when `process` returned some,
        recorded in every result."""
        ...
