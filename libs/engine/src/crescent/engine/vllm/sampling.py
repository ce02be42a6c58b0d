"""Crescent's SamplingParams to vLLM's, and vLLM's logprobs back to Crescent's TokenLogprobs.

A prefill computes one token (max_tokens=1), so a min_tokens beyond 1 is the decode's to
honour; the conductor tells the decode how many of those are left.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from crescent.common.bounds import MIN_LOGPROB
from crescent.common.messages import SamplingParams as CrescentSampling
from crescent.common.messages import TokenLogprobs


def vllm_params(sampling: CrescentSampling, max_tokens: int, extra_args: dict[str, Any] | None):
    """vLLM SamplingParams for `max_tokens` new tokens, streamed as deltas."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    structured = None
    if sampling.structured is not None:
        if sampling.structured.json_object:
            structured = StructuredOutputsParams(json_object=True)
        else:
            structured = StructuredOutputsParams(json=json.loads(sampling.structured.json_schema))
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min(sampling.min_tokens, max_tokens),
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        seed=sampling.seed,
        stop_token_ids=list(sampling.stop_token_ids),
        ignore_eos=sampling.ignore_eos,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty,
        logit_bias=dict(sampling.logit_bias) or None,
        logprobs=sampling.logprobs,
        prompt_logprobs=sampling.prompt_logprobs,
        structured_outputs=structured,
        output_kind=RequestOutputKind.DELTA,
        extra_args=extra_args,
    )


def _clamped(logprob: float) -> float:
    """-inf (and NaN, which no distribution should hold) as MIN_LOGPROB; never above 0."""
    return min(logprob, 0.0) if logprob >= MIN_LOGPROB else MIN_LOGPROB


def token_logprobs(token_id: int, entries: Mapping[int, Any], num_top: int) -> TokenLogprobs:
    """One position's TokenLogprobs from vLLM's {token id: Logprob(logprob, rank)}, which holds
    the `num_top` best tokens plus the chosen one wherever it ranks."""
    ranked = sorted(
        (entry.rank, tid, entry.logprob)
        for tid, entry in entries.items()
        if entry.rank is not None and entry.rank <= num_top
    )[:num_top]
    chosen = entries.get(token_id)
    return TokenLogprobs(
        logprob=_clamped(chosen.logprob) if chosen is not None else MIN_LOGPROB,
        top_ids=[tid for _, tid, _ in ranked],
        top_logprobs=[_clamped(lp) for _, _, lp in ranked],
    )


def output_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any]] | None, num_top: int | None
) -> list[TokenLogprobs]:
    """TokenLogprobs of each new output token ([] when the request asked for none)."""
    if num_top is None or logprobs is None:
        return []
    return [token_logprobs(tid, entries, num_top) for tid, entries in zip(token_ids, logprobs)]


def prompt_logprobs(
    prompt: Sequence[int], logprobs: Sequence[Mapping[int, Any] | None] | None, num_top: int | None
) -> list[TokenLogprobs]:
    """TokenLogprobs of prompt tokens 1..n-1 (the first has nothing before it to be predicted
    from)."""
    if num_top is None or not logprobs:
        return []
    return [
        token_logprobs(tid, entries or {}, num_top)
        for tid, entries in zip(prompt[1:], logprobs[1:])
    ]
