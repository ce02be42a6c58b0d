"""Whatever JSON a client sends, parsing and the model checks raise nothing but a 4xx ApiError
(a 5xx would be the server's fault): bodies built from the fields every endpoint knows, with
plausible and arbitrary values."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crescent.common.tokenizer import ByteTokenizer
from crescent.conductor.model_checks import check_for_model
from crescent.conductor.openai_api import ApiError, parse_chat, parse_completion
from crescent.conductor.openai_responses import parse_responses

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "name",
                    "text",
                    "$schema",
                    "properties",
                    "schema",
                    "json_schema",
                    "function",
                    "parameters",
                    "role",
                    "content",
                    "arguments",
                    "x",
                ]
            )
            | st.text(max_size=4),
            children,
            max_size=4,
        )
    ),
    max_leaves=10,
)
schemas = st.dictionaries(
    st.sampled_from(
        ["type", "$schema", "properties", "required", "pattern", "$ref", "items", "enum", "minimum"]
    ),
    json_values,
    max_size=3,
) | st.fixed_dictionaries({"$schema": json_values})
function = st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "g", "bad name"])},
    optional={"parameters": schemas, "description": json_values},
)
tool = st.fixed_dictionaries({"type": st.just("function"), "function": function}) | json_values
part = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["text", "image_url", "input_text"]),
        "text": st.text(max_size=5) | json_values,
    }
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", "wizard"])},
    optional={
        "content": st.text(max_size=5) | st.lists(part, max_size=2) | json_values,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": json_values,
                    "function": st.fixed_dictionaries(
                        {
                            "name": st.text(max_size=3) | json_values,
                            "arguments": st.text(max_size=8) | json_values,
                        }
                    ),
                }
            ),
            max_size=2,
        )
        | json_values,
        "tool_call_id": json_values,
        "name": json_values,
    },
)
fields = {
    "prompt": st.text(min_size=1, max_size=5) | st.lists(st.integers(-1, 300), max_size=3),
    "messages": st.lists(message, max_size=3),
    "input": st.text(max_size=5) | st.lists(message, max_size=2),
    "n": st.integers(-1, 200),
    "logprobs": st.booleans() | st.integers(-1, 30),
    "top_logprobs": st.integers(-1, 30),
    "echo": st.booleans(),
    "presence_penalty": st.floats(-3, 3),
    "repetition_penalty": st.floats(-1, 12),
    "top_k": st.integers(-3, 10**12),
    "min_p": st.floats(-1, 2),
    "min_tokens": st.integers(-1, 10**20),
    "logit_bias": st.dictionaries(
        st.sampled_from(["0", "97", "300", "-1", "x", "²", "9" * 30]),
        st.floats(-200, 200) | json_values,
        max_size=2,
    ),
    "stop_token_ids": st.lists(st.integers(-1, 2**70) | json_values, max_size=3),
    "response_format": st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema", "x"])},
        optional={
            "json_schema": st.fixed_dictionaries(
                {"name": st.just("x")}, optional={"schema": schemas}
            )
        },
    ),
    "text": st.fixed_dictionaries(
        {
            "format": st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "json_schema"])},
                optional={"name": json_values, "schema": schemas},
            )
        }
    ),
    "tools": st.lists(tool, min_size=1, max_size=2),
    "tool_choice": st.sampled_from(["none", "auto", "required"])
    | st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "h"])}),
        }
    )
    | json_values,
    "parallel_tool_calls": json_values,
    "best_of": json_values,
    "store": json_values,
    "instructions": json_values,
}
# A valid request for every endpoint with up to three fields given plausible or arbitrary values.
VALID = {
    "model": "m",
    "prompt": "hi",
    "messages": [{"role": "user", "content": "hi"}],
    "input": "hi",
}
bodies = (
    st.lists(st.sampled_from(sorted(fields)), max_size=3, unique=True)
    .flatmap(
        lambda names: st.fixed_dictionaries({name: fields[name] | json_values for name in names})
    )
    .map(lambda changed: {**VALID, **changed})
)


@settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(body=bodies, engine=st.sampled_from(["vllm", "emulated"]))
def test_any_body_is_a_request_or_a_4xx(body, engine):
    tokenizer = ByteTokenizer()
    for parse in (parse_completion, parse_chat, parse_responses):
        try:
            request = check_for_model(parse(body), engine, tokenizer)
            if request.is_chat:
                tokenizer.apply_chat_template(request.messages, request.tools)
        except ApiError as error:
            assert 400 <= error.status < 500 and error.message
