"""Well-typed messages out of range (negative counts, NaN or infinite floats, absurd sizes, ids
that would break a NATS subject) are malformed: decode raises MessageError."""

import math

import msgspec
import pytest

from crescent.common import bounds, messages, store_messages
from crescent.common.codec import Message, decode, encode
from crescent.common.errors import MessageError
from crescent.common.messages import (
    DecodeStart,
    InstanceInfo,
    InstanceLoad,
    PrefillJob,
    PrefillResult,
    Reservation,
    SamplingParams,
    StoreStats,
    StructuredOutput,
    TokenChunk,
    TokenLogprobs,
)
from crescent.common.store_messages import (
    AllocBlocks,
    BlockMeta,
    BlockSlots,
    PinBlocks,
    ReplicateReply,
)

NAN, INF = math.nan, math.inf
VALID = {
    "reservation": Reservation(request_id="cmpl-1", num_prompt_tokens=5, max_tokens=16),
    "start": DecodeStart(request_id="cmpl-1", token_ids=[1, 2], first_token=3, max_tokens=16),
    "job": PrefillJob(
        request_id="cmpl-1", model="m", token_ids=[1, 2, 3], block_size=64, decode_node="n0"
    ),
    "result": PrefillResult(request_id="cmpl-1", first_token=4, num_computed_tokens=3),
    "load": InstanceLoad(
        role="decode", instance_id="decode-0", node="node0", sent_at=1.7e9, period_s=0.2
    ),
    "info": InstanceInfo(role="decode", instance_id="decode-0", node="node0", max_model_len=32768),
    "chunk": TokenChunk(request_id="cmpl-1", seq=0, token_ids=[5], step_at=0.0),
    "stats": StoreStats(node="node0", instance_id="store-node0"),
    "alloc": AllocBlocks(model="m", hashes=[b"\x01" * 16]),
    "pin": PinBlocks(model="m", hashes=[b"\x01" * 16]),
    "slots": BlockSlots(
        segment="node0.store", block_bytes=4096, allocated=[b"\x01" * 16], offsets=[0]
    ),
    "meta": BlockMeta(tier="dram", slot=3, size=4096),
    "replicate": ReplicateReply(num_copied=1, num_present=0),
}


def tampered(name: str, **fields) -> tuple[bytes, type]:
    """The valid example's wire body with `fields` replaced, as a peer could send it."""
    message = VALID[name]
    body = msgspec.msgpack.decode(encode(message))
    body.update(fields)
    return msgspec.msgpack.encode(body), type(message)


OUT_OF_RANGE = [
    ("reservation", {"num_prompt_tokens": -5, "ttl_s": NAN}),
    ("reservation", {"num_prompt_tokens": -5}),
    ("reservation", {"ttl_s": NAN}),
    ("reservation", {"ttl_s": INF}),
    ("reservation", {"ttl_s": 0.0}),
    ("reservation", {"ttl_s": -1.0}),
    ("reservation", {"ttl_s": 1e9}),
    ("reservation", {"max_tokens": 1 << 40}),
    ("reservation", {"request_id": ""}),
    ("start", {"max_tokens": -1}),
    ("start", {"max_tokens": bounds.MAX_SEQUENCE_TOKENS + 1}),
    ("start", {"first_token": -1}),
    ("start", {"token_ids": [1, -2]}),
    ("start", {"token_ids": [1 << 33]}),
    ("start", {"request_id": "*"}),
    ("start", {"request_id": ">"}),
    ("start", {"request_id": "a b"}),
    ("start", {"request_id": "a.b"}),
    ("start", {"request_id": "x" * 300}),
    ("start", {"sampling": {"temperature": NAN}}),
    ("start", {"sampling": {"temperature": -0.5}}),
    ("start", {"sampling": {"temperature": 1e400}}),
    ("start", {"sampling": {"top_p": 1.5}}),
    ("start", {"sampling": {"stop_token_ids": list(range(5000))}}),
    ("start", {"sampling": {"presence_penalty": NAN}}),
    ("start", {"sampling": {"frequency_penalty": 1e9}}),
    ("start", {"sampling": {"repetition_penalty": 0.0}}),
    ("start", {"sampling": {"top_k": -2}}),
    ("start", {"sampling": {"min_p": 2.0}}),
    ("start", {"sampling": {"min_tokens": -1}}),
    ("start", {"sampling": {"logit_bias": {5: 1e9}}}),
    ("start", {"sampling": {"logit_bias": {-5: 1.0}}}),
    ("start", {"sampling": {"logprobs": -1}}),
    ("start", {"sampling": {"prompt_logprobs": 1 << 20}}),
    ("start", {"sampling": {"structured": {"json_schema": "x" * (bounds.MAX_SCHEMA_CHARS + 1)}}}),
    ("result", {"first_logprobs": [NAN, [], []]}),
    ("result", {"first_logprobs": [0.5, [], []]}),
    ("result", {"prompt_logprobs": [[-1.0, [1], [-INF]]]}),
    ("chunk", {"logprobs": [[-1.0, [-1], [-1.0]]]}),
    ("job", {"block_size": -64}),
    ("job", {"decode_node": "node.*"}),
    ("job", {"pull_hashes": [b"\x00" * 1000]}),
    ("result", {"num_computed_tokens": -3}),
    ("result", {"queue_s": NAN}),
    ("result", {"compute_s": -INF}),
    ("load", {"sent_at": NAN}),
    ("load", {"period_s": 0.0}),
    ("load", {"num_running": -1}),
    ("load", {"kv_used_tokens": -5}),
    ("load", {"queue_time_s": INF}),
    ("load", {"recent_tbt_s": NAN}),
    ("load", {"bandwidth": {"node1": NAN}}),
    ("load", {"bandwidth": {"node1": -1.0}}),
    ("info", {"max_model_len": -1}),
    ("info", {"started_at": INF}),
    ("chunk", {"seq": -1}),
    ("stats", {"used_bytes": -1}),
    ("alloc", {"ttl_s": NAN}),
    ("pin", {"ttl_s": 0.0}),
    ("slots", {"offsets": [-4096]}),
    ("meta", {"slot": -1}),
    ("replicate", {"num_copied": -1}),
]


@pytest.mark.parametrize("name, fields", OUT_OF_RANGE, ids=lambda x: str(x)[:60])
def test_out_of_range_fields_are_malformed(name, fields):
    body, message_type = tampered(name, **fields)
    with pytest.raises(MessageError) as raised:
        decode(body, message_type)
    field = next(iter(fields))
    assert field in str(raised.value), f"the error names the field: {raised.value}"


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_examples_decode(name):
    assert decode(encode(VALID[name]), type(VALID[name])) == VALID[name]


ACCEPTED_EXTREMES = [
    ("reservation", {"max_tokens": bounds.MAX_SEQUENCE_TOKENS, "ttl_s": bounds.MAX_TTL_S}),
    ("reservation", {"num_prompt_tokens": 0, "max_tokens": 0}),
    (
        "start",
        {"token_ids": [0, bounds.MAX_TOKEN_ID], "sampling": {"temperature": 0.0, "top_p": 1.0}},
    ),
    ("start", {"sampling": {"seed": (1 << 64) - 1}}),
    ("start", {"sampling": {"seed": -(1 << 63)}}),
    (
        "start",
        {
            "sampling": {
                "logit_bias": {bounds.MAX_TOKEN_ID: -100.0},
                "top_k": -1,
                "logprobs": 20,
                "repetition_penalty": bounds.MAX_PENALTY,
                "structured": {"json_object": True},
            }
        },
    ),
    ("result", {"first_logprobs": [bounds.MIN_LOGPROB, [7], [0.0]]}),
    ("start", {"request_id": "chatcmpl-0a1b2c_retry-1"}),
    ("job", {"decode_node": "node-prefill-0", "decode_instance": ""}),
    ("info", {"model": "meta-llama/Llama-3.1-8B-Instruct"}),
]


@pytest.mark.parametrize("name, fields", ACCEPTED_EXTREMES, ids=lambda x: str(x)[:60])
def test_values_at_the_limits_decode(name, fields):
    body, message_type = tampered(name, **fields)
    decode(body, message_type)


def _is_bounded(info: msgspec.inspect.Type) -> bool:
    if isinstance(info, msgspec.inspect.UnionType):
        return all(_is_bounded(t) for t in info.types)
    if isinstance(info, (msgspec.inspect.IntType, msgspec.inspect.FloatType)):
        return (info.ge is not None or info.gt is not None) and (
            info.le is not None or info.lt is not None
        )
    if isinstance(info, msgspec.inspect.ListType):
        return info.max_length is not None and _is_bounded(info.item_type)
    if isinstance(info, msgspec.inspect.DictType):
        return _is_bounded(info.value_type)
    return True


UNBOUNDED_ON_PURPOSE = {("Message", "v"), ("SamplingParams", "seed")}  # checked elsewhere / any int


def _all_message_types() -> list[type]:
    found = [SamplingParams, StructuredOutput, TokenLogprobs]
    for module in (messages, store_messages):
        found += [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, Message) and obj is not Message
        ]
    return found


@pytest.mark.parametrize("message_type", _all_message_types(), ids=lambda t: t.__name__)
def test_every_number_and_list_field_has_bounds(message_type):
    for field in msgspec.inspect.type_info(message_type).fields:
        if field.name == "v" or (message_type.__name__, field.name) in UNBOUNDED_ON_PURPOSE:
            continue
        assert _is_bounded(field.type), f"{message_type.__name__}.{field.name} has no range"
