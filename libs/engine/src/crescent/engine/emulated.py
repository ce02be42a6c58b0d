"""The emulated engine: no model, real timing. Prefill sleeps for the cost model's time;
decode runs one continuous batch whose step time depends on who is in it. Output tokens are a
deterministic function of the prompt, so tests can compare runs token for token.

Each next token is certain, so temperature, top_p, top_k, min_p and seeds change nothing and
are honoured as they are; logprobs are those of a certain token (0, every other token -inf).
What would change a certain token (penalties, biases, grammars, a minimum length) or needs a
model's view of the prompt (prompt logprobs) is refused: see `unsupported`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from crescent.common.bounds import MIN_LOGPROB
from crescent.common.messages import SamplingParams, TokenLogprobs
from crescent.engine.base import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, DecodeStep, PrefillOutput
from crescent.engine.cost_model import CostModel

log = logging.getLogger(__name__)


class KvBlocks(Protocol):
    """What the emulated prefill needs of the stores; emulated_kv.EmulatedKv provides it. A
    protocol, so that importing this module (the conductor does, for `unsupported`) needs no
    store client: crescent-engine's [kv] extra."""

    def hashes(self, token_ids: Sequence[int]) -> list[bytes]: ...

    async def num_cached_tokens(self, hashes: Sequence[bytes]) -> int: ...

    async def save(self, hashes: Sequence[bytes], nodes: Sequence[str]) -> None: ...

    async def finish_saves(self, timeout_s: float) -> None: ...


def emulated_token(previous: int, position: int) -> int:
    """Lowercase letters with a space every few tokens: readable, deterministic output."""
    if position % 6 == 5:
        return ord(" ")
    return ord("a") + (previous * 131 + position * 31) % 26


def unsupported(sampling: SamplingParams) -> list[str]:
    """The SamplingParams fields set in `sampling` that this engine cannot honour."""
    defaults = SamplingParams()
    fields = (
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "min_tokens",
        "prompt_logprobs",
        "structured",
    )
    return [name for name in fields if getattr(sampling, name) != getattr(defaults, name)]


def emulated_logprobs(token: int, num_top: int | None) -> list[TokenLogprobs]:
    """A certain token's logprobs: 0 for it, -inf (MIN_LOGPROB) for the alternatives after it."""
    if num_top is None:
        return []
    others = [(token + i) % 256 for i in range(1, num_top)]
    top_ids = [token, *others][:num_top]
    return [
        TokenLogprobs(
            logprob=0.0, top_ids=top_ids, top_logprobs=[0.0] + [MIN_LOGPROB] * (len(top_ids) - 1)
        )
    ]


@dataclass(frozen=True)
class PrefillPlan:
    """What an emulated prefill will compute: the prompt, its block hashes and the cached prefix."""

    token_ids: Sequence[int]
    hashes: list[bytes]
    num_cached: int


class EmulatedPrefillEngine:
    """Computes one prompt per call in three steps, so the worker's queue holds only the compute:
    `plan` asks this node's store which prefix it holds, `compute` takes the cost model's time,
    `save` has the `save_to` nodes' stores allocate the prompt's blocks and writes them beside
    the request path."""

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self.kv: KvBlocks | None = None

    def predict_s(self, num_tokens: int, num_cached: int = 0) -> float:
        return self.cost.prefill_s(num_tokens, num_cached)

    async def plan(self, token_ids: Sequence[int]) -> PrefillPlan:
        hashes = self.kv.hashes(token_ids) if self.kv else []
        # The last token is always computed: its logits give the first output token.
        num_cached = (
            min(await self.kv.num_cached_tokens(hashes), len(token_ids) - 1) if hashes else 0
        )
        return PrefillPlan(token_ids, hashes, num_cached)

    async def compute(self, plan: PrefillPlan, num_logprobs: int | None = None) -> PrefillOutput:
        seconds = self.predict_s(len(plan.token_ids), plan.num_cached)
        await asyncio.sleep(seconds)
        first = emulated_token(sum(plan.token_ids), len(plan.token_ids))
        logprobs = emulated_logprobs(first, num_logprobs)
        return PrefillOutput(
            first_token=first,
            num_computed_tokens=len(plan.token_ids) - plan.num_cached,
            num_cached_tokens=plan.num_cached,
            compute_s=seconds,
            first_logprobs=logprobs[0] if logprobs else None,
        )

    async def save(self, plan: PrefillPlan, save_to: Sequence[str]) -> None:
        if plan.hashes and save_to:
            await self.kv.save(plan.hashes, save_to)


@dataclass
class _Sequence:
    request_id: str
    last_token: int
    context_len: int
    num_left: int
    stop_token_ids: frozenset[int]
    num_logprobs: int | None = None
    prefill_tokens: int = (
        0  # prompt tokens still to compute before its first token (prefill on decode)
    )
    out: asyncio.Queue = field(default_factory=asyncio.Queue)


class EmulatedDecodeEngine:
    """Continuous batching: each step adds waiting sequences, advances all, drops finished ones."""

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self._running: dict[str, _Sequence] = {}
        self._has_work = asyncio.Event()

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_context_tokens(self) -> int:
        return sum(s.context_len for s in self._running.values())

    def predict_step_s(self, extra_batch: int = 0, extra_context: int = 0) -> float:
        return self.cost.decode_step_s(
            self.num_running + extra_batch, self.num_context_tokens + extra_context
        )

    async def generate(
        self,
        request_id: str,
        token_ids: Sequence[int],
        first_token: int | None,
        max_new_tokens: int,
        stop_token_ids: Sequence[int] = (),
        sampling: SamplingParams | None = None,
        save_to: Sequence[str] = (),
    ) -> AsyncIterator[DecodeStep]:
        """Tokens after `first_token`, one DecodeStep per batch step, until a stop or the limit.
        Without a first token the prompt is computed in the next batch step, which takes its
        prefill time longer (the whole batch waits for it, as on a real engine), and yields the
        prompt's first token. `save_to` is accepted for the engines' common call: the emulated
        decode engine keeps no KV."""
        if max_new_tokens < 1:
            yield DecodeStep([], FINISH_LENGTH)
            return
        num_logprobs = sampling.logprobs if sampling is not None else None
        if first_token is None:
            seq = _Sequence(
                request_id,
                sum(token_ids),
                len(token_ids),
                max_new_tokens,
                frozenset(stop_token_ids),
                num_logprobs,
                prefill_tokens=len(token_ids),
            )
        else:
            seq = _Sequence(
                request_id,
                first_token,
                len(token_ids) + 1,
                max_new_tokens,
                frozenset(stop_token_ids),
                num_logprobs,
            )
        self._running[request_id] = seq
        self._has_work.set()
        try:
            while True:
                step = await seq.out.get()
                yield step
                if step.finish_reason is not None:
                    return
        finally:
            self._running.pop(request_id, None)

    def abort(self, request_id: str) -> None:
        seq = self._running.pop(request_id, None)
        if seq is not None:
            seq.out.put_nowait(DecodeStep([], FINISH_ABORT))

    async def run(self) -> None:
        """The batch loop; runs for the life of the worker."""
        while True:
            await self._has_work.wait()
            if not self._running:
                self._has_work.clear()
                continue
            prefill_s = sum(
                self.cost.prefill_s(s.prefill_tokens)
                for s in self._running.values()
                if s.prefill_tokens
            )
            await asyncio.sleep(self.predict_step_s() + prefill_s)
            for seq in list(self._running.values()):
                self._advance(seq)

    def _advance(self, seq: _Sequence) -> None:
        """One token; a prompt computed here gives the token its prefill would (last_token then
        holds the prompt's sum, as EmulatedPrefillEngine.compute takes it): its step says that
        none of the prompt was cached (this engine keeps no KV)."""
        num_cached_tokens = 0 if seq.prefill_tokens else None
        seq.prefill_tokens = 0
        token = emulated_token(seq.last_token, seq.context_len)
        seq.last_token = token
        seq.context_len += 1
        seq.num_left -= 1
        finish = None
        if token in seq.stop_token_ids:
            finish = FINISH_STOP
        elif seq.num_left == 0:
            finish = FINISH_LENGTH
        if finish is not None:
            self._running.pop(seq.request_id, None)
        seq.out.put_nowait(
            DecodeStep(
                [token],
                finish,
                logprobs=emulated_logprobs(token, seq.num_logprobs),
                num_cached_tokens=num_cached_tokens,
            )
        )
