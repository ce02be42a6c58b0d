"""What one request's trip through the cluster keeps about itself (flow.py): its deadlines, the
events it yields, the decode side it holds, and the instances it left."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from crescent.common.bus import Stream, within
from crescent.common.errors import RecoverableError, RemoteError
from crescent.common.messages import DecodeStart, PrefillResult, TokenLogprobs
from crescent.conductor.cluster_view import ClusterView

FIRST_ASK_AGAIN_S = 0.1  # a decode instance silent once is asked again after this


@dataclass(frozen=True)
class FlowTimeouts:
    reserve_s: float = 2.0
    prefill_s: float = 120.0
    start_s: float = 5.0
    token_gap_s: float = 30.0
    placement_wait_s: float = 10.0  # how long a request waits for a live instance to exist
    rejoin_wait_s: float = 30.0  # how long it waits for its instance that left to come back


@dataclass(frozen=True)
class Refusal:
    """Why a decode instance did not take a request. `is_unanswered`: it gave no answer (no
    responders, no reply in time), as while it restarts or resubscribes after a NATS restart,
    so it is asked again while the request may still wait for placement."""

    reason: str
    is_unanswered: bool = False

    @classmethod
    def of_error(cls, exc: RecoverableError) -> Refusal:
        """A request that failed: an error reply is the instance's answer; anything else (no
        responders, a timeout, a lost connection) is silence."""
        return cls(str(exc), is_unanswered=not isinstance(exc, RemoteError))


@dataclass(frozen=True)
class Silence:
    """A decode instance that gave a request no answer: since when, and when to ask it again.
    The wait doubles from FIRST_ASK_AGAIN_S at each silence, so that an instance that stays
    silent (dead, not yet seen stale) costs the request few asks, each with a prefill job
    sent and cancelled beside it."""

    since: float
    ask_at: float
    num_silences: int = 1

    @classmethod
    def first(cls, now: float) -> Silence:
        return cls(now, now + FIRST_ASK_AGAIN_S)

    def again(self, now: float) -> Silence:
        wait_s = FIRST_ASK_AGAIN_S * 2**self.num_silences
        return Silence(self.since, now + wait_s, self.num_silences + 1)


@dataclass
class TokenEvent:
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per token, when asked for
    prompt_logprobs: list[TokenLogprobs] | None = None  # on the first event, when asked for
    num_cached_tokens: int | None = None  # on the first event: prompt tokens loaded, not computed


@dataclass
class DecodeSide:
    """Which decode instance holds the request's KV room now, under which attempt id: every
    attempt has its own id, so a late start, cancel or chunk of an earlier one never mixes in."""

    request_id: str
    instance_id: str = ""
    attempt: int = 0
    is_finished: bool = False  # decode released the room itself
    is_moved: bool = False  # decoding went on elsewhere: the prediction no longer applies

    @property
    def attempt_id(self) -> str:
        return self._id_of(self.attempt)

    @property
    def next_attempt_id(self) -> str:
        """The id the attempt after this one (a move) will have."""
        return self._id_of(self.attempt + 1)

    def _id_of(self, attempt: int) -> str:
        return self.request_id if attempt == 0 else f"{self.request_id}-m{attempt}"


@dataclass(frozen=True)
class SentTo:
    """The NATS connection (epoch) and the instance's incarnation when a message went to it."""

    epoch: int
    started_at: float | None


@dataclass
class Attempt:
    """One decode attempt under way: its token stream, open before the start went out (a chunk
    for a stream not yet open would be dropped), and the start's acknowledgement to come."""

    stream: Stream
    sent_to: SentTo
    starting: asyncio.Future  # the decode's Ack

    async def close(self) -> None:
        """Idempotent."""
        if not self.starting.done():
            self.starting.cancel()
            await asyncio.gather(self.starting, return_exceptions=True)
        elif not self.starting.cancelled():
            self.starting.exception()  # retrieved: a failed start is the stream's to report
        await self.stream.close()


@dataclass
class HandedStart:
    """A decode start the prefill instance sends as its first token is out
    (PrefillJob.decode_start), and what the conductor awaits of it from before the job goes
    out: the token stream, and the decode's answer (Replies.expect)."""

    start: DecodeStart
    subject: str  # the decode's start subject
    stream: Stream
    answer: asyncio.Future
    sent_to: SentTo

    def started(self, timeout_s: float) -> Attempt:
        """The attempt once the prefill's result is in: the start went out with it, so the
        answer is due within `timeout_s`."""
        starting = asyncio.ensure_future(within(self.answer, self.subject, timeout_s))
        starting.add_done_callback(lambda _: self.answer.cancel())  # closed before it ran
        return Attempt(self.stream, self.sent_to, starting)

    async def drop(self) -> None:
        """Stop awaiting the start: the job failed or its decode refused the reservation."""
        self.answer.cancel()
        await self.stream.close()


@dataclass
class Prefilled:
    """How a request's prompt was computed: `result` is the prefill instance's (None: the
    decode instance computes the prompt itself); `attempt` is the decode attempt started
    already, by the prefill instance or on decode (None: the conductor starts it)."""

    result: PrefillResult | None
    attempt: Attempt | None


class Gone:
    """Instances a request left because they failed it. An instance is left out only in the
    incarnation that failed: the same id registered again (a restarted process) is usable."""

    def __init__(self, view: ClusterView, role: str) -> None:
        self._view = view
        self._role = role
        self._started_at: dict[str, float | None] = {}

    def add(self, instance_id: str, started_at: float | None) -> None:
        """`instance_id`, in the incarnation that started at `started_at`, failed the request."""
        self._started_at[instance_id] = started_at

    def ids(self) -> set[str]:
        return {
            i
            for i, started in self._started_at.items()
            if self._view.started_at(self._role, i) in (started, None)
        }

    def is_back(self, instance_id: str) -> bool:
        """`instance_id` is registered again in the incarnation that failed the request: the
        same process, only unheard past its lease (paused, cut off), not a restarted one."""
        started = self._started_at.get(instance_id)
        return started is not None and self._view.started_at(self._role, instance_id) == started
