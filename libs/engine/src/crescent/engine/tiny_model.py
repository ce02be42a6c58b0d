"""A tiny Llama checkpoint built on this machine: random weights from a fixed seed and a
byte-level BPE tokenizer trained on fixed text, saved the way Hugging Face saves any model.

Tests, the dev cluster and benchmarks serve it with the real vLLM engine; nothing is
downloaded. The same arguments write the same bytes (`crescent model tiny DIR`). Its chat
template renders tools in the Hermes style (signatures in the system turn, calls as
<tool_call> JSON blocks, results as <tool_response> blocks), so chat, tools and structured
output take the path they take with an instruction-tuned checkpoint.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")

_WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "that",
    "for",
    "it",
    "on",
    "with",
    "as",
    "was",
    "by",
    "be",
    "this",
    "are",
    "or",
    "at",
    "from",
    "an",
    "which",
    "have",
    "not",
    "cache",
    "block",
    "prefix",
    "token",
    "layer",
    "request",
    "decode",
    "prefill",
    "store",
    "node",
    "memory",
    "transfer",
    "batch",
    "model",
    "attention",
    "key",
    "value",
    "hash",
    "chain",
    "router",
    "conductor",
    "schedule",
    "queue",
    "latency",
    "throughput",
    "bandwidth",
    "cluster",
    "disaggregated",
    "serving",
    "engine",
    "kernel",
    "tensor",
    "head",
    "page",
    "slot",
    "segment",
    "lease",
    "watch",
    "commit",
    "allocate",
    "evict",
    "replicate",
    "pin",
    "unpin",
    "stream",
    "first",
    "time",
    "output",
    "input",
    "length",
    "context",
    "window",
    "moon",
    "cake",
    "kimi",
    "paper",
    "figure",
    "table",
    "trace",
    "replay",
    "simulator",
    "policy",
    "threshold",
    "load",
    "balance",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "hundred",
    "thousand",
    "million",
    "zero",
]


CHAT_TEMPLATE = """\
{%- set has_system = messages and messages[0]['role'] in ['system', 'developer'] %}
{%- if has_system or tools %}
<|system|>
{% if has_system %}{{ messages[0]['content'] }}
{% endif %}
{% if tools %}
You can call functions. Their signatures, one JSON object a line, are between <tools> and </tools>:
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools>
To call functions, answer with one block a call: \
<tool_call>{"name": NAME, "arguments": ARGUMENTS}</tool_call>
{% endif %}
{%- endif %}
{%- for message in messages[1 if has_system else 0:] %}
<|{{ message['role'] }}|>
{% if message['role'] == 'tool' %}
<tool_response>{{ message['content'] }}</tool_response>
{% else %}
{% if message['content'] %}{{ message['content'] }}
{% endif %}
{% for call in message.get('tool_calls') or [] %}
<tool_call>{{ {'name': call['function']['name'], \
'arguments': call['function']['arguments']} | tojson }}</tool_call>
{% endfor %}
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|assistant|>
{% endif %}
"""


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model. vLLM's CPU attention needs head_dim in {32, 64, ...}."""

    num_layers: int = 2
    hidden_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    vocab_size: int = 1024
    max_position_embeddings: int = 8192
    initializer_range: float = 0.08  # wide logits: greedy argmax is far from ties
    seed: int = 0


def corpus(seed: int, num_lines: int = 4000) -> list[str]:
    """Fixed English-like lines with digits and punctuation, for training the tokenizer."""
    rng = random.Random(seed)
    lines = []
    for i in range(num_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 24))]
        if i % 3 == 0:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
        line = " ".join(words)
        lines.append(line[0].upper() + line[1:] + rng.choice((".", "?", "!", ",", ";", ":")))
    return lines


def build_tokenizer(spec: TinyModelSpec):
    """A byte-level BPE (any text encodes) wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(spec.seed), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=spec.max_position_embeddings,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_tiny_model(directory: str | Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write config, float32 safetensors weights and tokenizer to `directory`; returns it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.do_sample = False
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
