import msgspec
import pytest

from crescent.common.codec import PROTOCOL_VERSION, decode, encode
from crescent.common.errors import MessageError, UnknownVersionError
from crescent.common.messages import (
    DecodeStart,
    ErrorReply,
    InstanceInfo,
    InstanceLoad,
    PrefillJob,
    PrefillResult,
    Reservation,
    ReservationReply,
    SamplingParams,
    TokenChunk,
)

EXAMPLES = [
    InstanceInfo(
        role="prefill", instance_id="p0", node="n0", model="m", http_url="http://x", max_model_len=8
    ),
    InstanceLoad(
        role="decode",
        instance_id="d0",
        node="n0",
        sent_at=1.5,
        period_s=0.2,
        num_running=3,
        kv_used_tokens=10,
        kv_capacity_tokens=100,
    ),
    PrefillJob(
        request_id="r",
        model="m",
        token_ids=[1, 2, 3],
        sampling=SamplingParams(temperature=0.5, seed=7, stop_token_ids=[9]),
        decode_instance="d0",
    ),
    PrefillResult(request_id="r", first_token=5, num_computed_tokens=3, queue_s=0.1, compute_s=0.2),
    Reservation(request_id="r", num_prompt_tokens=3, max_tokens=4),
    ReservationReply(request_id="r", accepted=False, reason="full"),
    DecodeStart(request_id="r", token_ids=[1], first_token=2, max_tokens=3),
    TokenChunk(
        request_id="r", seq=4, token_ids=[7, 8], step_at=1.5, is_final=True, finish_reason="length"
    ),
    ErrorReply(code="bad", message="nope"),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(message):
    assert decode(encode(message), type(message)) == message


def test_union_picks_the_tagged_type():
    reply = decode(encode(ErrorReply(code="c", message="m")), PrefillResult | ErrorReply)
    assert isinstance(reply, ErrorReply)
    reply = decode(encode(EXAMPLES[3]), PrefillResult | ErrorReply)
    assert isinstance(reply, PrefillResult)


@pytest.mark.parametrize(
    "body", [b"", b"\xc1", b"not msgpack at all", msgspec.msgpack.encode([1, 2, 3])]
)
def test_garbage_is_rejected(body):
    with pytest.raises(MessageError):
        decode(body, PrefillJob)


def test_missing_field_is_rejected():
    body = msgspec.msgpack.encode(
        {"type": "PrefillJob", "v": PROTOCOL_VERSION, "request_id": "r", "model": "m"}
    )
    with pytest.raises(MessageError, match="token_ids"):
        decode(body, PrefillJob)


def test_wrong_type_is_rejected():
    body = msgspec.msgpack.encode(
        {
            "type": "PrefillJob",
            "v": PROTOCOL_VERSION,
            "request_id": "r",
            "model": "m",
            "token_ids": ["a"],
        }
    )
    with pytest.raises(MessageError):
        decode(body, PrefillJob)


def test_other_message_type_is_rejected():
    with pytest.raises(MessageError):
        decode(encode(EXAMPLES[4]), PrefillJob)


def test_unknown_version_is_rejected_with_its_own_error():
    body = msgspec.msgpack.encode(
        {"type": "ErrorReply", "v": PROTOCOL_VERSION + 1, "code": "c", "message": "m"}
    )
    with pytest.raises(UnknownVersionError) as info:
        decode(body, ErrorReply)
    assert info.value.version == PROTOCOL_VERSION + 1


def test_unknown_version_with_new_fields_is_reported_as_version():
    body = msgspec.msgpack.encode({"type": "PrefillJob", "v": 99, "request": {"nested": True}})
    with pytest.raises(UnknownVersionError):
        decode(body, PrefillJob)
