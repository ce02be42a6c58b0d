"""A checkpoint's own tokenizer behind the interface of crescent.common.tokenizer.ByteTokenizer
(encode, decode, token_text, stream_decoder, apply_chat_template, tool_call_format, bos/eos
ids, vocab_size), so the conductor can tokenize for a real model the way vLLM does.

Only the `tokenizers` package (tokenizer.json) and jinja2; no torch, no transformers. The chat
template (chat_template.jinja, or tokenizer_config.json's chat_template) renders in the
environment transformers gives templates: trimmed blocks, loop controls, a tojson that keeps
non-ASCII text, raise_exception.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crescent.common.checkpoint import CheckpointError, inspect_checkpoint

REPLACEMENT = "\ufffd"
MAX_UNREAD = 16  # tokens a stream decoder holds back at most (invalid bytes: shown anyway)


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
        template_path = checkpoint.path / "chat_template.jinja"
        self.chat_template: str | None = (
            template_path.read_text() if template_path.is_file() else config.get("chat_template")
        )
        if not isinstance(self.chat_template, (str, type(None))):
            raise CheckpointError(
                checkpoint.path, "only a single chat template (a string) is supported"
            )
        self._special_tokens = {
            name: self.token_text(token_id)
            for name, token_id in (
                ("bos_token", self.bos_token_id),
                ("eos_token", self.eos_token_id),
            )
            if token_id is not None
        }
        self._template = _compile(self.chat_template) if self.chat_template else None

    def encode(self, text: str) -> list[int]:
        """Token ids exactly as vLLM's tokenizer gives them for a completion prompt."""
        return self._tokenizer.encode(text, add_special_tokens=True).ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """One token's text alone (special tokens by name), as logprobs show it."""
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def stream_decoder(self) -> HfStreamDecoder:
        return HfStreamDecoder(self)

    @property
    def tool_call_format(self) -> str | None:
        """ "hermes" when the template renders `tools` and asks for <tool_call> blocks, the one
        format the conductor parses; None when the model takes no tools this way."""
        if self._template is None or "<tool_call>" not in self.chat_template:
            return None
        from jinja2 import meta

        return (
            "hermes"
            if "tools"
            in meta.find_undeclared_variables(self._template.environment.parse(self.chat_template))
            else None
        )

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict] = ()
    ) -> str:
        """The checkpoint's Jinja template when it has one, else the same plain turns as
        ByteTokenizer."""
        if self._template is not None:
            return self._template.render(
                messages=list(messages),
                tools=list(tools) or None,
                add_generation_prompt=True,
                **self._special_tokens,
            )
        turns = "".join(f"<|{m['role']}|>\n{m['content'] or ''}\n" for m in messages)
        return turns + "<|assistant|>\n"


def _compile(source: str):
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators=None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    return environment.from_string(source)


class HfStreamDecoder:
    """Text as tokens arrive, equal to decoding them all at once however they are split.

    Each push decodes a short window of recent tokens: those already shown (for their context:
    a token's text can depend on the one before it) and the new ones, and shows only what the
    new ones add, less the last 1–3 tokens while they end in U+FFFD (a character whose bytes
    have not all arrived). Decoding only the new tokens instead showed such a split character
    as two or three U+FFFD whenever a chunk ended inside it."""

    def __init__(self, tokenizer: HfTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0  # the window's first token
        self._read_offset = 0  # the first token whose text is not shown yet

    def push(self, token_ids: Sequence[int]) -> str:
        self._ids.extend(token_ids)
        prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        # A character is at most 4 bytes: if the text up to each of the last 3 tokens still
        # ends in U+FFFD, the bytes are invalid, not incomplete (shown once MAX_UNREAD pile up).
        for end in range(len(self._ids), max(self._read_offset, len(self._ids) - 4), -1):
            text = self._tokenizer.decode(self._ids[self._prefix_offset : end])
            if len(text) > len(prefix_text) and not text.endswith(REPLACEMENT):
                break
        else:
            if len(self._ids) - self._read_offset < MAX_UNREAD:
                return ""
            end = len(self._ids)
            text = self._tokenizer.decode(self._ids[self._prefix_offset :])
        self._prefix_offset, self._read_offset = self._read_offset, end
        self._trim()
        return text[len(prefix_text) :]

    def flush(self) -> str:
        prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        text = self._tokenizer.decode(self._ids[self._prefix_offset :])
        self._ids, self._prefix_offset, self._read_offset = [], 0, 0
        return text[len(prefix_text) :]

    def _trim(self) -> None:
        """Forget the tokens before the window: a long answer keeps no list of all its ids."""
        if self._prefix_offset:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
