"""What a local Hugging Face checkpoint is, read from its files before any engine starts:
is it a Llama-family model, does its tokenizer fit it, how long is its context, and how many
bytes of KV one store block holds (the store's --block-bytes must equal that).

Plain Python and the `tokenizers` package: no torch, no vLLM, so the CLI and the conductor
can call it cheaply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from crescent.common.errors import ConfigError

LLAMA_FAMILY = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


class CheckpointError(ConfigError):
    """A checkpoint directory this engine cannot serve; the message says why."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint {path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class KvGeometry:
    """KV of one token is `2 · num_kv_heads · head_dim` values per layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    def layer_bytes(self, num_tokens: int) -> int:
        return num_tokens * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def block_bytes(self, block_size: int) -> int:
        """A store block: every layer of `block_size` tokens, one layer's slice contiguous."""
        return self.num_layers * self.layer_bytes(block_size)


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    model_type: str
    dtype: str
    vocab_size: int
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_id: int | None
    kv: KvGeometry


def _read_json(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise CheckpointError(path.parent, f"cannot read {what} ({exc.strerror})") from exc
    except ValueError as exc:
        raise CheckpointError(path.parent, f"{what} is not valid JSON: {exc}") from exc


def inspect_checkpoint(directory: str | Path) -> Checkpoint:
    """Read config.json and check the tokenizer; raises CheckpointError on anything unservable."""
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError(path, "no such directory")
    config = _read_json(path / "config.json", "config.json")
    model_type = config.get("model_type", "")
    if model_type not in LLAMA_FAMILY:
        raise CheckpointError(
            path,
            f"model_type {model_type!r} is not Llama family "
            f"(supported: {', '.join(sorted(LLAMA_FAMILY))})",
        )
    try:
        num_heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        geometry = KvGeometry(
            num_layers=int(config["num_hidden_layers"]),
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=int(config.get("head_dim") or hidden // num_heads),
            dtype_bytes=0,
        )
        vocab_size = int(config["vocab_size"])
        max_positions = int(config.get("max_position_embeddings") or 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(path, f"config.json lacks a usable {exc}") from exc
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    if dtype not in DTYPE_BYTES:
        raise CheckpointError(path, f"dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    geometry = KvGeometry(
        geometry.num_layers, geometry.num_kv_heads, geometry.head_dim, DTYPE_BYTES[dtype]
    )
    checkpoint = Checkpoint(
        path=path,
        model_type=model_type,
        dtype=dtype,
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        bos_token_id=config.get("bos_token_id"),
        eos_token_id=_first(config.get("eos_token_id")),
        kv=geometry,
    )
    check_tokenizer(checkpoint)
    return checkpoint


def _first(value):
    return value[0] if isinstance(value, list) and value else value


def check_tokenizer(checkpoint: Checkpoint) -> None:
    """The tokenizer must exist, fit in the model's vocabulary, and agree on BOS/EOS."""
    path = checkpoint.path
    tokenizer_file = path / "tokenizer.json"
    if not tokenizer_file.is_file():
        if (path / "tokenizer.model").is_file():
            return  # a sentencepiece tokenizer: transformers converts it; vLLM checks it at start
        raise CheckpointError(path, "no tokenizer (tokenizer.json or tokenizer.model)")
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # the tokenizers package raises plain Exception on bad files
        raise CheckpointError(path, f"tokenizer.json does not load: {exc}") from exc
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > checkpoint.vocab_size:
        raise CheckpointError(
            path,
            f"the tokenizer has {size} tokens but the model's vocabulary only "
            f"{checkpoint.vocab_size}: tokenizer and model do not match",
        )
    tokenizer_config = path / "tokenizer_config.json"
    if not tokenizer_config.is_file():
        return
    special = _read_json(tokenizer_config, "tokenizer_config.json")
    for name, model_id in (
        ("bos_token", checkpoint.bos_token_id),
        ("eos_token", checkpoint.eos_token_id),
    ):
        token = special.get(name)
        if isinstance(token, dict):
            token = token.get("content")
        if not isinstance(token, str) or model_id is None:
            continue
        token_id = tokenizer.token_to_id(token)
        if token_id != model_id:
            raise CheckpointError(
                path,
                f"the tokenizer's {name} {token!r} is id {token_id}, the model's "
                f"is {model_id}: tokenizer and model do not match",
            )
