"""Checks of a request against the model that will serve it, once that model is known: token
ids within its vocabulary, tools only where its chat template renders them in a format this
conductor parses, and nothing the model's engine cannot apply (the emulated engine, which has
no model, refuses what would change its certain tokens)."""

from __future__ import annotations

import msgspec

from crescent.conductor.openai_api import GenerationRequest
from crescent.conductor.openai_fields import bad_request
from crescent.engine.emulated import unsupported

# SamplingParams fields as the request named them.
_PARAM_OF_FIELD = {"structured": "response_format", "prompt_logprobs": "echo"}


def _param(request: GenerationRequest, field: str) -> str:
    if (
        field == "structured"
        and request.tool_choice is not None
        and request.tool_choice.mode != "auto"
    ):
        return "tool_choice"
    if field == "structured" and request.api == "responses":
        return "text.format"
    return _PARAM_OF_FIELD.get(field, field)


def check_for_model(request: GenerationRequest, engine: str, tokenizer) -> GenerationRequest:
    """`request` as this model serves it (top_k beyond the vocabulary means every token), or a
    400 naming what it cannot serve."""
    sampling = request.sampling
    vocab_size = tokenizer.vocab_size
    for name, ids in (
        ("logit_bias", sampling.logit_bias),
        ("stop_token_ids", sampling.stop_token_ids),
    ):
        outside = [token_id for token_id in ids if token_id >= vocab_size]
        if outside:
            raise bad_request(
                f"'{name}' names token {outside[0]}, outside the vocabulary (size {vocab_size})",
                param=name,
            )
    if request.tools and tokenizer.tool_call_format is None:
        raise bad_request(
            f"the model '{request.model}' has no chat template that renders tools as "
            "<tool_call> blocks, so tool calls cannot be made or parsed",
            param="tools",
        )
    if engine == "emulated":
        refused = unsupported(sampling)
        if refused == ["prompt_logprobs"]:
            raise bad_request(
                "'echo' with 'logprobs' is not supported by the emulated engine: it has no model "
                "to give the prompt's log-probabilities",
                param="echo",
                code="unsupported_parameter",
            )
        if refused:
            param = _param(request, refused[0])
            raise bad_request(
                f"'{param}' is not supported by the emulated engine: it has no model whose token "
                "probabilities it could change",
                param=param,
                code="unsupported_parameter",
            )
    if sampling.top_k >= vocab_size:
        request.sampling = msgspec.structs.replace(sampling, top_k=0)
    return request
