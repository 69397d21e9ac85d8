"""Multi-turn sessions: conversations and agent loops whose every turn resends the whole history.

A session is a sequence of turns. Turn k's prompt is the session's system prompt (shared by
many sessions, or none), every earlier user message and answer, then the new user tokens; the
next turn is sent once the answer has come back, after a think time (a person reading and
typing, or a tool running). Sessions start open-loop (Poisson / Gamma, or the start times of a
session trace) or closed-loop (N clients, each running one session after another).

Each session reads one synthetic token stream (simcore.prefix_hash.TokenStream), so turn k+1's
prompt starts with exactly the tokens of turn k's prompt and answer, and the engine's prefix
cache (block hashes chained as vLLM's) finds them if they were not evicted. A turn whose prompt
would not fit max_model_len ends its session there (a chat front end would truncate or start
over; either way the cached prefix is lost), counted in the run's record.

Lengths and turn counts are drawn per session from named streams of the run's seed; the run
returns the time to first token of every turn by turn number (`turn_summary`), since caching
across turns shows up as later turns' TTFT.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from kvsim.simcore import quantiles
from kvsim.simcore.errors import WorkloadError
from kvsim.simcore.prefix_hash import TokenStream
from kvsim.simcore.request import Request, RequestSink
from kvsim.workloads.arrivals import (
    ClosedLoop,
    GammaArrivals,
    TraceArrivals,
    planned_span_s,
    refuse_long_span,
)
from kvsim.workloads.lengths import LengthDist
from kvsim.workloads.spec import SharedPrefix, streams

if TYPE_CHECKING:
    import simpy

THINK_DISTS = ("fixed", "exponential")
MAX_SESSIONS = 10_000_000  # sessions' start times are drawn up front (and sessions run in the Python engine)
TURN_ROWS = 8  # per-turn TTFT rows in the summary: turns 1..7, then 8 and later together
# At r sessions/s about r x lifetime sessions are in flight at once, so a run must start sessions
# over a few lifetimes to reach the steady state (reports.capacity.SessionRateScaler sizes its
# runs so; `warnings` says when a run is shorter)
STEADY_LIFETIMES = 3.0


@dataclass(frozen=True, slots=True)
class SessionTrace:
    """A session trace: rows of (session id, start time of its first turn, new user tokens, output
    tokens), turns in row order. Later turns' times are ignored: a turn is sent when its answer
    is back plus the think time (the trace's `think_s` column when it has one)."""

    source: str
    session_id: np.ndarray  # int64, one per row
    arrival_s: np.ndarray  # float64, relative to the first row
    num_new_tokens: np.ndarray
    num_output_tokens: np.ndarray
    think_s: np.ndarray | None = None

    def sessions(self) -> list[tuple[float, np.ndarray]]:
        """(start time, row indices) per session, by start time (ties: first row first)."""
        order: dict[int, list[int]] = {}
        for row, sid in enumerate(self.session_id.tolist()):
            order.setdefault(sid, []).append(row)
        out = [(float(self.arrival_s[rows[0]]), np.array(rows)) for rows in order.values()]
        out.sort(key=lambda item: (item[0], int(item[1][0])))
        return out


@dataclass(frozen=True, slots=True)
class SessionWorkload:
    """Multi-turn traffic (workloads/README.md, `sessions:`); a `simcore.request.Workload`."""

    name: str
    num_sessions: int  # >= 1
    arrival: GammaArrivals | ClosedLoop | TraceArrivals  # session starts
    turns: LengthDist | None  # turns per session (None: from the trace)
    prompt_len: LengthDist | None  # new user tokens per turn (tool output, for an agent)
    output_len: LengthDist | None  # answer tokens per turn
    think_time_s: float = 0.0  # mean time from an answer to the next turn
    think_time_dist: str = "exponential"
    first_prompt_len: LengthDist | None = None  # the first user message, when it differs
    shared_prefix: SharedPrefix | None = None  # system prompts, shared by the sessions that carry one
    max_model_len: int | None = None
    trace: SessionTrace | None = None
    description: str = ""
    source: str = ""
    # session start times are multiplied by this: the same sessions at another session rate, each
    # keeping its own turns and think times (reports.capacity.SessionRateScaler; 1 = as drawn)
    start_scale: float = 1.0
    is_session: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if int(self.num_sessions) != self.num_sessions or self.num_sessions < 1:
            raise WorkloadError(f"workload {self.name}: sessions.num_sessions must be an integer >= 1, got {self.num_sessions}")
        if self.trace is None and (self.turns is None or self.prompt_len is None or self.output_len is None):
            raise WorkloadError(f"workload {self.name}: a session workload needs sessions.turns, prompt_len and output_len")
        if not (self.think_time_s >= 0 and np.isfinite(self.think_time_s)):
            raise WorkloadError(f"workload {self.name}: sessions.think_time_s must be >= 0, got {self.think_time_s}")
        if self.think_time_dist not in THINK_DISTS:
            raise WorkloadError(f"workload {self.name}: sessions.think_time_dist must be one of {', '.join(THINK_DISTS)}")
        if isinstance(self.arrival, TraceArrivals) and self.trace is None:
            raise WorkloadError(f"workload {self.name}: arrival process 'trace' needs a session trace")
        if self.trace is not None and self.num_sessions > len(self.trace.sessions()):
            raise WorkloadError(f"session trace {self.trace.source}: asked for {self.num_sessions} sessions but it "
                                f"holds {len(self.trace.sessions())}")
        if self.num_sessions > MAX_SESSIONS:  # their start times are drawn at once: 1e12 would be 7 TiB
            raise WorkloadError(f"workload {self.name}: at most {MAX_SESSIONS:,} sessions, got {int(self.num_sessions):,}")
        if self.max_model_len is not None and self.shared_prefix is not None and self.shared_prefix.prefix_len >= self.max_model_len:
            raise WorkloadError(f"workload {self.name}: the system prompt ({self.shared_prefix.prefix_len} tokens) "
                                f"does not fit max_model_len {self.max_model_len}")
        first = self._shortest_first_prompt()
        if self.max_model_len is not None and first >= self.max_model_len:  # no turn would ever be sent
            raise WorkloadError(f"workload {self.name}: every session's first prompt ({first:,} tokens or more) "
                                f"does not fit max_model_len {self.max_model_len:,}")

    def check_span(self) -> None:
        """Refuse session starts plus a session's think times past arrivals.MAX_SPAN_S (a closed
        loop's clients think through all the turns between them). Called on the workload a run gets."""
        count = int(self.num_sessions)
        think = float(self.think_time_s)
        if isinstance(self.arrival, ClosedLoop):
            span = self.num_requests / int(self.arrival.concurrency) * think
        elif isinstance(self.arrival, GammaArrivals):
            turns = self.turns.mean if self.turns is not None else 1.0
            span = planned_span_s(self.arrival, count) * float(self.start_scale) + max(turns - 1.0, 0.0) * think
        elif self.trace is not None:  # the last start, then the longest session's think times
            traced = self.trace.sessions()[:count]
            thinks = self.trace.think_s
            longest = max((float(thinks[rows].sum()) if thinks is not None else (len(rows) - 1) * think
                           for _, rows in traced), default=0.0)
            span = traced[-1][0] * float(self.start_scale) + longest
        else:
            return
        rate = getattr(self.arrival, "rate", None)
        refuse_long_span(self.name, span, f"{count:,} sessions" + (f" at {rate:g} sessions/s" if rate else "")
                   + (f" with {think:g} s think times" if think else ""))

    def _shortest_first_prompt(self) -> int:
        """The fewest tokens a session's first turn can have (1 when its length is unbounded below)."""
        if self.trace is not None:
            heads = [int(self.trace.num_new_tokens[rows[0]]) for _, rows in self.trace.sessions()[: int(self.num_sessions)]]
            return min(heads, default=1)
        dist = self.first_prompt_len if self.first_prompt_len is not None else self.prompt_len
        least = getattr(dist, "value", None) if hasattr(dist, "value") else getattr(dist, "low", None)
        if least is None and getattr(dist, "values", None) is not None and len(dist.values):
            least = int(np.min(dist.values))
        system = self.shared_prefix.prefix_len if self.shared_prefix is not None and self.shared_prefix.fraction >= 1 else 0
        return int(least or 1) + system

    @property
    def is_closed_loop(self) -> bool:
        return isinstance(self.arrival, ClosedLoop)

    @property
    def num_requests(self) -> int:
        """Turns expected (the run's record says how many were sent): for progress bars."""
        if self.trace is not None:
            return int(sum(len(rows) for _, rows in self.trace.sessions()[: self.num_sessions]))
        return max(1, int(round(self.num_sessions * max(self.turns.mean, 1.0))))

    # --- generation -------------------------------------------------------------------------

    def _plans(self, seed: np.random.SeedSequence | int):
        """Per session, in start order: (start time or None, turns as (new tokens, output, think_s),
        system prompt group or -1, its length). Drawn a session at a time from the seed's streams."""
        rng = streams(seed)
        starts = None
        if self.trace is not None:
            traced = self.trace.sessions()[: int(self.num_sessions)]
            for index, (start, rows) in enumerate(traced):
                think = (self.trace.think_s[rows] if self.trace.think_s is not None
                         else self._think(rng["think"], len(rows)))
                turns = list(zip(self.trace.num_new_tokens[rows].tolist(), self.trace.num_output_tokens[rows].tolist(),
                                 think.tolist(), strict=True))
                group, length = self._system(rng["prefix"])
                yield (start * self.start_scale if isinstance(self.arrival, TraceArrivals) else None), turns, group, length, index
            return
        if isinstance(self.arrival, GammaArrivals):
            starts = (self.arrival.arrival_times(rng["arrivals"], int(self.num_sessions)) * self.start_scale).tolist()
        for index in range(int(self.num_sessions)):
            n = max(1, int(self.turns.sample(rng["trace"], 1)[0]))
            if self.max_model_len is not None:  # turn t's prompt holds >= 2t-1 tokens: later ones are never sent,
                n = min(n, self.max_model_len // 2 + 1)  # and 1e8 drawn turns would take minutes and gigabytes
            new = self.prompt_len.sample(rng["prompt"], n)
            if self.first_prompt_len is not None:
                new[0] = self.first_prompt_len.sample(rng["prompt"], 1)[0]
            out = self.output_len.sample(rng["output"], n)
            think = self._think(rng["think"], n)
            group, length = self._system(rng["prefix"])
            yield (starts[index] if starts else None), list(zip(new.tolist(), out.tolist(), think.tolist(), strict=True)), group, length, index

    def _think(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.think_time_s == 0:
            return np.zeros(n)
        if self.think_time_dist == "exponential":
            return rng.exponential(self.think_time_s, size=n)
        return np.full(n, float(self.think_time_s))

    def _system(self, rng: np.random.Generator) -> tuple[int, int]:
        sp = self.shared_prefix
        if sp is None:
            return -1, 0
        group = int(rng.integers(0, sp.num_groups))
        return (group, sp.prefix_len) if rng.random() < sp.fraction else (-1, 0)

    def process(self, env: simpy.Environment, sink: RequestSink, seed: np.random.SeedSequence
                ) -> Generator[simpy.Event, Any, dict[str, Any]]:
        """Start the sessions (open or closed loop) and return what they did: TTFT per turn, turns
        sent, sessions ended at the context limit."""
        stats: dict[str, Any] = {"sessions": 0, "turns": 0, "rejected": 0, "ended_at_max_model_len": 0,
                                 "ttft_s_by_turn": {}}
        next_id = [0]
        mml = self.max_model_len

        def session(turns: list, group: int, system_len: int, index: int) -> Generator[simpy.Event, Any, None]:
            # session keys odd, system prompt keys even: streams never collide
            tokens = TokenStream(2 * index + 1, 2 * group if group >= 0 else None, system_len)
            context = system_len
            stats["sessions"] += 1
            for turn, (new, out, think) in enumerate(turns, start=1):
                prompt = context + int(new)
                if mml is not None and prompt >= mml:
                    stats["ended_at_max_model_len"] += 1
                    return
                out = int(out) if mml is None else min(int(out), mml - prompt)
                request = Request(next_id[0], 0.0, prompt, out, tokens=tokens, session_id=index, turn=turn)
                next_id[0] += 1
                stats["turns"] += 1
                st = yield sink.submit(request)
                if st is None or st.first_token_s < 0:  # rejected: the session ends
                    stats["rejected"] += 1
                    return
                stats["ttft_s_by_turn"].setdefault(turn, []).append(st.first_token_s - request.arrival_s)
                context = prompt + out
                if turn < len(turns) and think > 0:
                    yield env.timeout(think)

        plans = self._plans(seed)
        if isinstance(self.arrival, ClosedLoop):
            between = streams(seed)["sampling"]  # a client's pause between its sessions (the loop's think time)

            def client() -> Generator[simpy.Event, Any, None]:
                for _, turns, group, length, index in plans:  # shared: a free client takes the next session
                    yield from session(turns, group, length, index)
                    if self.arrival.think_time_s > 0:
                        yield env.timeout(float(self.arrival.think_times(between, 1)[0]))

            clients = [env.process(client()) for _ in range(min(self.arrival.concurrency, int(self.num_sessions)))]
            yield env.all_of(clients)
        else:
            begun = env.now
            running = []
            for start, turns, group, length, index in plans:
                at = begun + (start or 0.0)
                if at > env.now:
                    yield env.timeout(at - env.now)
                running.append(env.process(session(turns, group, length, index)))
            yield env.all_of(running)
        return stats

    # --- reporting --------------------------------------------------------------------------

    @staticmethod
    def turn_summary(stats: dict[str, Any] | None) -> dict[str, Any]:
        """Summary keys: TTFT of first turns and of later turns (mean, median, ms), and a table by turn."""
        by_turn = (stats or {}).get("ttft_s_by_turn") or {}
        if not by_turn:
            return {}
        out: dict[str, Any] = {}
        first = np.asarray(by_turn.get(1, []), dtype=np.float64)
        later = np.concatenate([np.asarray(v, dtype=np.float64) for t, v in by_turn.items() if t > 1] or [np.zeros(0)])
        for label, values in (("first_turn", first), ("later_turns", later)):
            if len(values):
                out[f"mean_ttft_ms_{label}"] = float(values.mean()) * 1000
                out[f"median_ttft_ms_{label}"] = quantiles.median(values) * 1000
        rows = []
        for turn in range(1, TURN_ROWS + 1):
            values = [v for t, vs in by_turn.items() if (t == turn or (turn == TURN_ROWS and t > turn)) for v in vs]
            if values:
                v = np.asarray(values) * 1000
                rows.append({"turn": f"{turn}+" if turn == TURN_ROWS else str(turn), "count": len(v),
                             "mean_ms": round(float(v.mean()), 3), "median_ms": round(float(np.median(v)), 3),
                             "p99_ms": round(float(np.percentile(v, 99)), 3)})
        out["ttft_by_turn"] = rows
        return out

    def generation_stats(self, seed: Any) -> dict[str, Any]:
        """Nothing is known before the run: turns depend on answers and the context limit."""
        return {}

    def draw(self, seed: np.random.SeedSequence | int, limit: int | None = None) -> tuple[list[Request], None]:
        """The first turns the sessions would send, in session order (`kvsim workloads show`), each
        stamped with its session's start; prompts grow as the run would grow them."""
        out: list[Request] = []
        for start, turns, _, system_len, index in self._plans(seed):
            context = system_len
            for turn, (new, answer, _) in enumerate(turns, start=1):
                prompt = context + int(new)
                if self.max_model_len is not None and prompt >= self.max_model_len:
                    break
                answer = int(answer) if self.max_model_len is None else min(int(answer), self.max_model_len - prompt)
                out.append(Request(len(out), float(start or 0.0), prompt, answer, session_id=index, turn=turn))
                context = prompt + answer
                if limit is not None and len(out) >= limit:
                    return out, None
        return out, None

    def sample_requests(self, seed: np.random.SeedSequence | int, limit: int | None = None) -> list[Request]:
        return self.draw(seed, limit)[0]

    def steady_sessions(self) -> tuple[int, float, float] | None:
        """(sessions a run needs to reach the steady state, session rate, lifetime s) for Poisson /
        Gamma starts: STEADY_LIFETIMES x rate x lifetime, the lifetime's lower bound being (turns -
        1) x think time (answers take time too); None for a closed loop or a trace."""
        if not isinstance(self.arrival, GammaArrivals) or self.turns is None:
            return None
        rate = float(self.arrival.rate) / self.start_scale
        lifetime = max(self.num_requests / int(self.num_sessions) - 1.0, 0.0) * float(self.think_time_s)
        return int(np.ceil(STEADY_LIFETIMES * rate * lifetime)), rate, lifetime

    def warnings(self, stats: dict[str, Any] | None = None) -> list[str]:
        lines = []
        ended = (stats or {}).get("ended_at_max_model_len", 0)
        if ended and ended >= 0.1 * max((stats or {}).get("sessions", 1), 1):
            lines.append(f"{ended} of {stats['sessions']} sessions ended early: their next prompt would not fit "
                         f"max_model_len {self.max_model_len}")
        steady = self.steady_sessions()
        if steady is not None and int(self.num_sessions) < steady[0]:
            need, rate, lifetime = steady
            lines.append(f"{int(self.num_sessions):,} sessions at {rate:g} sessions/s all start within "
                         f"{int(self.num_sessions) / rate:.0f} s, too few to reach the steady state (a session "
                         f"lasts at least {lifetime:.0f} s): about {STEADY_LIFETIMES:g} x rate x lifetime = "
                         f"{need:,} sessions are needed (--num-requests {need}); the figures describe a server "
                         "still filling up, and can hide overload")
        return lines

    def notes(self, stats: dict[str, Any] | None = None) -> list[str]:
        return []

    def describe(self, stats: dict[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "num_requests": int(stats["turns"]) if stats else self.num_requests,
            "sessions": {
                "num_sessions": int(self.num_sessions),
                "turns": self.turns.describe() if self.turns is not None else "trace",
                "think_time_s": float(self.think_time_s),
                "think_time_dist": self.think_time_dist,
            },
            "arrival": self.arrival.describe(),
            "prompt_len": self.prompt_len.describe() if self.prompt_len is not None else "trace",
            "first_prompt_len": self.first_prompt_len.describe() if self.first_prompt_len is not None else None,
            "output_len": self.output_len.describe() if self.output_len is not None else "trace",
            "shared_prefix": self.shared_prefix.describe() if self.shared_prefix else None,
            "max_model_len": self.max_model_len,
        }
        if self.start_scale != 1.0:
            out["start_time_scale"] = self.start_scale
        if self.trace is not None:
            out["trace"] = {"path": self.trace.source, "format": "kvsim-sessions", "rows": len(self.trace.session_id)}
        if stats:
            out["generation"] = {k: v for k, v in stats.items() if k != "ttft_s_by_turn"}
        return out
