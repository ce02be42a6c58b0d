"""What a client is told when no decode instance takes its request: which instances failed it
or did not answer, and a 503 (their failure) rather than a 429 (load) when none of them
answered; a 429 for want of room is not worded as an SLO miss."""

from crescent.conductor.flow import with_refusals
from crescent.conductor.generation import rejection_error
from crescent.conductor.policy import Rejection, RejectReason

NO_ROOM = Rejection(RejectReason.NO_DECODE, "no live decode instance has room for 40 tokens", 1.0)


def test_instances_that_did_not_answer_make_the_rejection_unavailable_and_are_named():
    rejection = with_refusals(
        NO_ROOM,
        {"decode-0": "left the cluster mid-request", "decode-1": "no reply within 5s"},
        unanswered={"decode-0", "decode-1"},
    )
    assert rejection.is_unavailable
    assert rejection.detail == (
        "decode-0 did not answer: left the cluster mid-request; "
        "decode-1 did not answer: no reply within 5s; "
        "no other live decode instance has room for 40 tokens"
    )
    error = rejection_error(rejection, "r1", has_live_decode=True)
    assert error.status == 503 and error.code == "no_capacity"


def test_an_instance_that_refused_for_room_keeps_it_a_429_not_worded_as_an_slo():
    rejection = with_refusals(
        NO_ROOM,
        {"decode-0": "left the cluster mid-request", "decode-1": "no KV room"},
        unanswered={"decode-0"},
    )
    assert not rejection.is_unavailable
    assert "decode-1 refused it: no KV room" in rejection.detail
    error = rejection_error(rejection, "r1", has_live_decode=True)
    assert error.status == 429 and error.code == "no-decode"
    assert str(error).startswith("no decode instance can take this request now: ")
    assert "SLO" not in str(error)


def test_a_move_that_finds_no_decode_names_the_one_that_failed_the_stream():
    rejection = with_refusals(NO_ROOM, {}, failed={"decode-0"})
    assert rejection.detail == (
        "decode-0 failed it mid-stream; no other live decode instance has room for 40 tokens"
    )


def test_a_rejection_for_the_slos_says_so_and_one_with_nothing_asked_is_unchanged():
    slo = Rejection(RejectReason.TBT_SLO, "decode-0 predicts 0.2 s between tokens", 1.0)
    assert with_refusals(slo, {"decode-0": "x"}) is slo
    assert with_refusals(NO_ROOM, {}) is NO_ROOM
    error = rejection_error(slo, "r1", has_live_decode=True)
    assert error.status == 429 and "within its SLOs" in str(error)
    assert rejection_error(NO_ROOM, "r1", has_live_decode=False).status == 503
