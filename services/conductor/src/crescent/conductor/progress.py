"""Where a request's generation stands, and how a decode instance goes on from there.

Continuing from the tokens so far, placed in the decode's prompt, suits every sampling parameter
the engine applies to the context as a whole (temperature, top-k/p, min-p, repetition penalty,
logit bias; min_tokens is counted down). Presence and frequency penalties and grammars count only
the engine's own output, and tokens in the prompt are not output: a request that uses them is
*replayed* instead. Its decode always generates from the prompt itself (the prefill's token only
fills the KV, and is not streamed), and a decode that takes it over after a failure regenerates
the tokens already streamed, which the flow checks and skips. Replay needs the same tokens
again, so such a request sampled at a temperature gets a seed when it has none.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import msgspec

from crescent.common.errors import RecoverableError
from crescent.common.messages import DecodeStart, SamplingParams, TokenLogprobs


class ReplayDivergedError(RecoverableError):
    """A decode that took over a replayed request generated other tokens than those already
    streamed, so the stream cannot go on."""


@dataclass
class Progress:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    generated: list[int] = field(default_factory=list)

    @property
    def is_replayed(self) -> bool:
        return self.sampling.depends_on_output

    def decode_start(self, attempt_id: str, stream_owner: str = "") -> DecodeStart:
        """Go on from the last generated token: the prompt and all earlier output are context.
        A replayed request starts from the prompt, its last token standing in as the first; a
        request with no output yet (prefilled on decode) starts from the prompt alone.
        `stream_owner`: the conductor that reads the tokens (DecodeStart.stream_owner)."""
        if not self.generated and not self.is_replayed:
            return DecodeStart(
                request_id=attempt_id,
                token_ids=self.prompt,
                first_token=None,
                max_tokens=self.max_tokens,
                sampling=msgspec.structs.replace(self.sampling, prompt_logprobs=None),
                stream_owner=stream_owner,
            )
        if self.is_replayed:
            return DecodeStart(
                request_id=attempt_id,
                token_ids=self.prompt[:-1],
                first_token=self.prompt[-1],
                max_tokens=self.max_tokens + 1,
                sampling=msgspec.structs.replace(self.sampling, prompt_logprobs=None),
                stream_owner=stream_owner,
            )
        return self._continued(attempt_id, stream_owner, self.generated[:-1], self.generated[-1])

    def start_after_prefill(self, attempt_id: str, stream_owner: str) -> DecodeStart | None:
        """The start a prefill instance sends the decode once its first token is out, which it
        fills in (PrefillJob.decode_start), with the prompt, the job's own (so the job carries
        the prompt once): decode_start() as it will be after that token. None where the
        conductor starts the decode itself: a replayed request (its decode generates from the
        prompt), or one whose first token is its last."""
        if self.is_replayed or self.generated or self.max_tokens <= 1:
            return None
        start = self._continued(attempt_id, stream_owner, [], None)
        return msgspec.structs.replace(start, token_ids=[], from_prefill=True)

    def _continued(
        self, attempt_id: str, stream_owner: str, earlier: list[int], last_token: int | None
    ) -> DecodeStart:
        """Go on after the output `earlier` + [last_token] (None: filled in by the sender)."""
        sampling = msgspec.structs.replace(
            self.sampling,
            prompt_logprobs=None,
            min_tokens=max(0, self.sampling.min_tokens - len(earlier) - 1),
        )
        return DecodeStart(
            request_id=attempt_id,
            token_ids=self.prompt + earlier,
            first_token=last_token,
            max_tokens=self.max_tokens - len(earlier),
            sampling=sampling,
            stream_owner=stream_owner,
        )


def replayable(sampling: SamplingParams) -> SamplingParams:
    """`sampling`, with a seed if the request is replayed and sampled at a temperature."""
    if sampling.depends_on_output and sampling.temperature > 0 and sampling.seed is None:
        return msgspec.structs.replace(sampling, seed=secrets.randbits(63))
    return sampling


class Replay:
    """The tokens a decode that takes over a replayed request regenerates before it adds any:
    each is checked against what was streamed, and only what comes after is new."""

    def __init__(self, streamed: list[int]) -> None:
        self._left = list(streamed)

    def new_part(
        self, token_ids: list[int], logprobs: list[TokenLogprobs], is_final: bool
    ) -> tuple[list[int], list[TokenLogprobs]]:
        """The part of a chunk (its tokens and their logprobs) the client does not have yet."""
        num_again = min(len(self._left), len(token_ids))
        if token_ids[:num_again] != self._left[:num_again]:
            raise ReplayDivergedError(
                f"the new decode regenerated {token_ids[:num_again]} where "
                f"{self._left[:num_again]} was streamed"
            )
        self._left = self._left[num_again:]
        if is_final and self._left:
            raise ReplayDivergedError(
                f"the new decode ended {len(self._left)} tokens before the output already streamed"
            )
        return token_ids[num_again:], logprobs[num_again:]
