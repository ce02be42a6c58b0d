"""A checkpoint's own tokenizer behind the interface of crescent.common.tokenizer.ByteTokenizer
(encode, decode, stream_decoder, apply_chat_template, bos/eos ids, vocab_size), so the
conductor can tokenize for a real model the way vLLM does.

Only the `tokenizers` package (tokenizer.json); no torch, no transformers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from crescent.engine.checkpoint import CheckpointError, inspect_checkpoint

REPLACEMENT = "\ufffd"


class HfTokenizer:
    def __init__(self, directory: str | Path) -> None:
        from tokenizers import Tokenizer

        checkpoint = inspect_checkpoint(directory)
        path = checkpoint.path / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(checkpoint.path, "HfTokenizer needs tokenizer.json")
        self._tokenizer = Tokenizer.from_file(str(path))
        self.vocab_size = checkpoint.vocab_size
        self.bos_token_id = checkpoint.bos_token_id
        self.eos_token_id = checkpoint.eos_token_id
        config_path = checkpoint.path / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.chat_template: str | None = config.get("chat_template")

    def encode(self, text: str) -> list[int]:
        """Token ids exactly as vLLM's tokenizer gives them for a completion prompt."""
        return self._tokenizer.encode(text, add_special_tokens=True).ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def stream_decoder(self) -> HfStreamDecoder:
        return HfStreamDecoder(self)

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> str:
        """The checkpoint's Jinja template when it has one, else the same plain turns as
        ByteTokenizer (the tiny model has none)."""
        if self.chat_template:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            template = ImmutableSandboxedEnvironment().from_string(self.chat_template)
            return template.render(messages=list(messages), add_generation_prompt=True)
        turns = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
        return turns + "<|assistant|>\n"


class HfStreamDecoder:
    """Text as tokens arrive: decodes the tokens since the last complete character and holds
    back a trailing partial UTF-8 sequence (shown by the tokenizer as U+FFFD)."""

    def __init__(self, tokenizer: HfTokenizer) -> None:
        self._tokenizer = tokenizer
        self._pending: list[int] = []

    def push(self, token_ids: Sequence[int]) -> str:
        self._pending.extend(token_ids)
        text = self._tokenizer.decode(self._pending)
        if text.endswith(REPLACEMENT) and len(self._pending) < 8:
            return ""
        self._pending = []
        return text

    def flush(self) -> str:
        text = self._tokenizer.decode(self._pending)
        self._pending = []
        return text
