"""Checkpoint inspection, KV geometry, the tiny model builder and the HF tokenizer adapter.

The builder and tokenizer need torch/transformers/tokenizers (installed by `make install-vllm`);
without them those tests skip."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from crescent.common.checkpoint import CheckpointError, KvGeometry, inspect_checkpoint


def test_kv_geometry_puts_one_layer_of_a_block_contiguously():
    geometry = KvGeometry(num_layers=2, num_kv_heads=2, head_dim=32, dtype_bytes=4)
    assert geometry.layer_bytes(64) == 64 * 2 * 2 * 32 * 4
    assert geometry.block_bytes(64) == 2 * geometry.layer_bytes(64) == 65536


def test_missing_or_foreign_checkpoints_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="no such directory"):
        inspect_checkpoint(tmp_path / "absent")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 50257}))
    with pytest.raises(CheckpointError, match="is not Llama family"):
        inspect_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        inspect_checkpoint(tmp_path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip(
        "transformers", reason="the tiny model builder needs transformers (make install-vllm)"
    )
    pytest.importorskip("torch", reason="the tiny model builder needs torch (make install-vllm)")
    from crescent.engine.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def digest(directory) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_tiny_model_is_deterministic_and_llama(tiny, tmp_path):
    from crescent.engine.tiny_model import build_tiny_model

    assert digest(build_tiny_model(tmp_path / "again")) == digest(tiny)
    checkpoint = inspect_checkpoint(tiny)
    assert checkpoint.model_type == "llama" and checkpoint.dtype == "float32"
    assert checkpoint.kv == KvGeometry(num_layers=2, num_kv_heads=2, head_dim=32, dtype_bytes=4)
    assert checkpoint.max_position_embeddings == 8192


def test_a_tokenizer_that_does_not_match_the_model_is_refused(tiny, tmp_path):
    bad = shutil.copytree(tiny, tmp_path / "bad")
    config = json.loads((bad / "config.json").read_text())
    config["bos_token_id"] = 2  # the tokenizer's <s> is 1
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="do not match"):
        inspect_checkpoint(bad)
    config["bos_token_id"], config["vocab_size"] = 1, 100  # the tokenizer has 1024 tokens
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="do not match"):
        inspect_checkpoint(bad)


def test_a_stream_decodes_to_the_same_text_however_its_tokens_are_chunked(tiny):
    """The conductor gets an answer's tokens in chunks of any size; a chunk that ends inside a
    character (byte-fallback tokens) must not split it into several U+FFFD. With each chunk
    decoded on its own, chunks of 3 tokens already differed (one CI run saw it: "with��")."""
    from crescent.common.hf_tokenizer import HfTokenizer

    tokenizer = HfTokenizer(tiny)
    ids = tokenizer.encode("stores 42 blocks. Ünïcödé ✓ 漢字 with€ 59840 and 😀!")
    want = tokenizer.decode(ids)
    for size in range(1, 25):
        for first in range(size):
            decoder = tokenizer.stream_decoder()
            chunks = [ids[:first]] + [ids[i : i + size] for i in range(first, len(ids), size)]
            streamed = "".join(decoder.push(chunk) for chunk in chunks) + decoder.flush()
            assert streamed == want, (size, first)


def test_hf_tokenizer_round_trips_and_streams_whole_characters(tiny):
    from crescent.common.hf_tokenizer import HfTokenizer

    tokenizer = HfTokenizer(tiny)
    text = "The prefill node stores 42 KV blocks; the decode node loads them. Ünïcödé ✓"
    ids = tokenizer.encode(text)
    assert max(ids) < tokenizer.vocab_size and tokenizer.decode(ids) == text
    decoder = tokenizer.stream_decoder()
    streamed = "".join(decoder.push([t]) for t in ids) + decoder.flush()
    assert streamed == text
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
