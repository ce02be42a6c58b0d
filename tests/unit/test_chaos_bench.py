"""How `crescent bench chaos` turns request outcomes into a case's row."""

from crescent.bench.chaos import CaseWindow, Fault, case_result, moves_between
from crescent.bench.chaos_load import Outcome, Status

FAULT = Fault("kill-prefill", "kill", "prefill-0")
WINDOW = CaseWindow(FAULT, started_at=100.0, fault_at=101.0, ended_at=110.0, moved=3)


def test_a_case_counts_requests_started_in_its_window_and_recovers_after_the_last_bad_one():
    outcomes = [
        Outcome(99.0, 100.5, Status.FAILED, "started before the window"),
        Outcome(100.2, 100.4, Status.OK),
        Outcome(100.8, 101.5, Status.FAILED, "502: prefill-0 left the cluster mid-request"),
        Outcome(101.1, 101.2, Status.REJECTED, "503: no capacity"),
        Outcome(101.3, 101.6, Status.OK),  # sent before the last bad request: not yet recovered
        Outcome(101.4, 104.0, Status.FAILED, "ServerDisconnectedError"),  # hung, then failed
        Outcome(101.5, 102.5, Status.OK),  # started before it: does not count either
        Outcome(101.7, 102.9, Status.WRONG),  # the last request that did not succeed
        Outcome(
            103.0, 103.4, Status.OK, num_attempts=2
        ),  # the first success after the last bad one
        Outcome(103.1, 103.3 + 5, Status.OK),
        Outcome(110.0, 110.2, Status.OK),  # the next case's
    ]
    row = case_result(WINDOW, outcomes)
    assert row == {
        "case": "kill-prefill",
        "sent": 9,
        "ok": 5,
        "rejected_before_work": 1,
        "failed": 2,
        "wrong": 1,
        "retried": 1,
        "max_latency_s": 5.2,
        "recovery_s": 2.4,
        "moved": 3,
    }


def test_a_case_without_errors_recovers_with_its_first_success_after_the_fault():
    outcomes = [Outcome(100.5, 101.2, Status.OK), Outcome(101.1, 101.4, Status.OK)]
    assert case_result(WINDOW, outcomes)["recovery_s"] == 0.4


def test_a_case_that_never_succeeds_again_has_no_recovery():
    outcomes = [Outcome(100.5, 100.6, Status.OK), Outcome(101.5, 102.0, Status.FAILED, "502")]
    row = case_result(WINDOW, outcomes)
    assert row["recovery_s"] is None and row["failed"] == 1


def test_moves_count_from_zero_for_a_conductor_restarted_in_the_window():
    before = {"a": 5.0, "b": 7.0}
    after = {"a": 9.0, "b": 2.0, "c": 1.0}  # b restarted; c answered only at the end
    assert moves_between(before, after) == 4 + 2 + 1
