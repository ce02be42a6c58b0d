"""Which failures of an instance move a request to another one, and which fail it: an answer
any instance would give alike is not worth a move, and must not mark a healthy instance gone."""

from crescent.common.errors import ConnectionLostError, NoRespondersError, RemoteError
from crescent.common.messages import REPLY_TOO_LARGE
from crescent.conductor.flow_errors import (
    INVALID_REQUEST,
    JOB_UNKNOWN,
    RequestRefusedError,
    UnsendableReplyError,
    not_to_move,
)


def test_an_engines_refusal_of_the_parameters_fails_the_request_as_the_clients_to_fix():
    failure = not_to_move(RemoteError("prefill.p0.job", INVALID_REQUEST, "max_tokens too big"))
    assert isinstance(failure, RequestRefusedError)
    assert str(failure) == "max_tokens too big"


def test_a_reply_too_large_to_send_fails_the_request_naming_the_limit():
    message = "the reply on prefill.p0.job is 2000000 bytes, over the NATS server's max_payload"
    failure = not_to_move(RemoteError("prefill.p0.job", REPLY_TOO_LARGE, message))
    assert isinstance(failure, UnsendableReplyError)
    assert REPLY_TOO_LARGE in str(failure) and "max_payload" in str(failure)


def test_an_instance_that_failed_or_went_silent_is_left_for_a_move():
    assert not_to_move(RemoteError("prefill.p0.job", JOB_UNKNOWN, "not known")) is None
    assert not_to_move(RemoteError("prefill.p0.job", "internal", "RuntimeError()")) is None
    assert not_to_move(ConnectionLostError("dropped")) is None
    assert not_to_move(NoRespondersError("prefill.p0.job")) is None
