"""The byte tokenizer: one token per UTF-8 byte, plus BOS and EOS.

It serves the emulated engine, which has no vocabulary of its own, and keeps the conductor's
tokenize → hash → route path real without a model on disk.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

NUM_BYTES = 256


class ByteTokenizer:
    bos_token_id = NUM_BYTES
    eos_token_id = NUM_BYTES + 1
    vocab_size = NUM_BYTES + 2

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    tool_call_format = None  # no chat template, so no tools

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if t < NUM_BYTES).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        """One token's text alone, as logprobs show it."""
        if token_id < NUM_BYTES:
            return bytes([token_id]).decode("utf-8", errors="replace")
        return "<s>" if token_id == self.bos_token_id else "</s>"

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder()

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict] = ()
    ) -> str:
        turns = "".join(f"<|{m['role']}|>\n{m['content'] or ''}\n" for m in messages)
        return turns + "<|assistant|>\n"


class StreamDecoder:
    """Turns tokens into text as they arrive without splitting a multi-byte character."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: Sequence[int]) -> str:
        return self._decoder.decode(bytes(t for t in token_ids if t < NUM_BYTES))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
