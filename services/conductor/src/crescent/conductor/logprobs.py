"""Token log-probabilities in OpenAI's two shapes.

Completions: four parallel lists over the tokens (text, logprob, {text: logprob} of the top
alternatives, offset of the token's text in the choice's text). Chat: one object per token
with its text, logprob, UTF-8 bytes and a list of top alternatives. A token's text is the
tokenizer's decoding of that token alone, as vLLM shows it. The first prompt token of an echo
has no logprob (nothing predicts it): null, as OpenAI gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from crescent.common.messages import TokenLogprobs


class TokenTexts(Protocol):
    def token_text(self, token_id: int) -> str: ...


class CompletionLogprobs:
    """The completions shape, built a few tokens at a time; text offsets run on across calls."""

    def __init__(self, tokenizer: TokenTexts, start_offset: int = 0) -> None:
        self._tokenizer = tokenizer
        self.offset = start_offset

    def part(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs | None]
    ) -> dict[str, list]:
        """The four lists for these tokens (a None entry: a token nothing predicts)."""
        tokens, token_logprobs, top, offsets = [], [], [], []
        for token_id, entry in zip(token_ids, logprobs):
            text = self._tokenizer.token_text(token_id)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
            if entry is None:
                token_logprobs.append(None)
                top.append(None)
                continue
            token_logprobs.append(entry.logprob)
            top.append(
                {
                    self._tokenizer.token_text(i): lp
                    for i, lp in zip(entry.top_ids, entry.top_logprobs)
                }
            )
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top,
            "text_offset": offsets,
        }


def merge_completion_parts(parts: Sequence[dict[str, list]]) -> dict[str, list]:
    merged: dict[str, list] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for part in parts:
        for key, values in part.items():
            merged[key].extend(values)
    return merged


def _entry(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_content(
    tokenizer: TokenTexts, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs]
) -> list[dict[str, Any]]:
    """The chat shape's `content` list for these tokens."""
    content = []
    for token_id, entry in zip(token_ids, logprobs):
        item = _entry(tokenizer.token_text(token_id), entry.logprob)
        item["top_logprobs"] = [
            _entry(tokenizer.token_text(i), lp) for i, lp in zip(entry.top_ids, entry.top_logprobs)
        ]
        content.append(item)
    return content
