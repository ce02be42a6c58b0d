"""What the emulated engine must answer, computed independently of the cluster."""

from crescent.common.tokenizer import ByteTokenizer
from crescent.engine.emulated import emulated_token


def expected_first_token(prompt: str) -> int:
    """The emulated engine's first token for `prompt` (the prefill's)."""
    prompt_ids = ByteTokenizer().encode(prompt)
    return emulated_token(sum(prompt_ids), len(prompt_ids))


def expected_text(prompt: str, max_tokens: int) -> str:
    """What the emulated engine must answer: its token function, applied as prefill + decode
    would."""
    prompt_ids = ByteTokenizer().encode(prompt)
    token = emulated_token(sum(prompt_ids), len(prompt_ids))
    tokens, context = [token], len(prompt_ids) + 1
    for _ in range(max_tokens - 1):
        token = emulated_token(token, context)
        tokens.append(token)
        context += 1
    return ByteTokenizer().decode(tokens)
