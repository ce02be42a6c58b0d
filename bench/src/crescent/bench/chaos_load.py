"""The client side of `crescent bench chaos`: a steady closed-loop load spread over several
conductors, each answer classified against the emulated engine's known tokens.

A request is `rejected_before_work` only when the cluster said so before doing anything: a
429 or 503 answer, or a connection to a conductor that was refused, so that nothing reached it.
Connections are not reused: a request written to a pooled connection whose conductor has just
died could not be told apart from one that died while the conductor worked on it.

A conductor holds its clients' connections, so a conductor that dies takes the answers it was
writing with it. Clients do what the official `openai` SDK does by default (it retries a
connection error): a request whose connection was refused or dropped before any answer came is
sent once more, to the next conductor, and counted in `retried`; only a request that still gets
no answer then is `failed`.
"""

from __future__ import annotations

import asyncio
import enum
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from crescent.common.tokenizer import ByteTokenizer
from crescent.engine.emulated import emulated_token

MODEL = "crescent-emulated"
# Shared by every prompt, one full 64-token block and more, so prefixes are reused via the store.
SHARED_PREFIX = "You are the chaos benchmark of Crescent. Answer each question briefly. " * 2


class Status(enum.Enum):
    OK = "ok"
    WRONG = "wrong"  # answered 200 with other tokens than the engine's
    REJECTED = "rejected_before_work"
    FAILED = "failed"


@dataclass(frozen=True)
class Outcome:
    started_at: float  # time.monotonic()
    ended_at: float
    status: Status
    cause: str = ""  # for failed and rejected requests: status code and message, or the exception
    num_attempts: int = 1  # 2: the first connection was refused or dropped, and the client retried

    @property
    def latency_s(self) -> float:
        return self.ended_at - self.started_at


def expected_text(prompt: str, max_tokens: int) -> str:
    """What the emulated engine answers: its token function applied as prefill, then decode."""
    tokenizer = ByteTokenizer()
    prompt_ids = tokenizer.encode(prompt)
    token, context_len = emulated_token(sum(prompt_ids), len(prompt_ids)), len(prompt_ids) + 1
    tokens = [token]
    for _ in range(max_tokens - 1):
        token = emulated_token(token, context_len)
        tokens.append(token)
        context_len += 1
    return tokenizer.decode(tokens)


@dataclass
class SteadyLoad:
    """`concurrency` clients, each sending its next request once the previous one is answered;
    request n goes to conductor n mod len(urls) with a prompt of its own."""

    urls: Sequence[str]
    concurrency: int = 4
    max_tokens: int = 48
    timeout_s: float = 20.0  # a request still unanswered by then is failed (it hung)
    outcomes: list[Outcome] = field(default_factory=list)
    num_sent: int = field(default=0, init=False)

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        connector = aiohttp.TCPConnector(force_close=True, limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            await asyncio.gather(*(self._client(session, stop) for _ in range(self.concurrency)))

    def ok_since(self, since: float) -> int:
        """Successive ok answers, counting back from the latest, of requests sent after `since`."""
        recent = sorted(
            (o for o in self.outcomes if o.started_at >= since), key=lambda o: o.ended_at
        )
        count = 0
        for outcome in reversed(recent):
            if outcome.status is not Status.OK:
                break
            count += 1
        return count

    async def _client(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            number = self.num_sent
            self.num_sent += 1
            self.outcomes.append(await self._request(session, number))

    async def _request(self, session: aiohttp.ClientSession, number: int) -> Outcome:
        prompt = f"{SHARED_PREFIX}Question {number}: what comes next?"
        body = {"model": MODEL, "prompt": prompt, "max_tokens": self.max_tokens, "temperature": 0}
        started = time.monotonic()
        for attempt in range(2):
            url = f"{self.urls[(number + attempt) % len(self.urls)]}/v1/completions"
            try:
                async with session.post(url, json=body) as response:
                    payload = await response.read()
                    status_code = response.status
                break
            except aiohttp.ClientConnectorError as exc:
                status, cause = Status.REJECTED, f"connect: {exc.os_error!r}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                status, cause = Status.FAILED, f"{type(exc).__name__}: {exc}"[:120]
        else:
            return Outcome(started, time.monotonic(), status, cause, num_attempts=2)
        ended = time.monotonic()
        if status_code == 200:
            try:
                text = json.loads(payload)["choices"][0]["text"]
            except (ValueError, KeyError, IndexError, TypeError):
                return Outcome(
                    started, ended, Status.FAILED, "200 with no completion in its body", attempt + 1
                )
            is_right = text == expected_text(prompt, self.max_tokens)
            return Outcome(
                started, ended, Status.OK if is_right else Status.WRONG, num_attempts=attempt + 1
            )
        status = Status.REJECTED if status_code in (429, 503) else Status.FAILED
        return Outcome(
            started, ended, status, f"{status_code}: {_error_message(payload)}", attempt + 1
        )


def _error_message(payload: bytes) -> str:
    try:
        return str(json.loads(payload)["error"]["message"])[:120]
    except (ValueError, KeyError, TypeError):
        return payload[:120].decode(errors="replace")
