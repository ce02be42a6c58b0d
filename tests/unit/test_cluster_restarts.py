"""The supervisor's restart schedule; children are started from the main thread only."""

import sys
import threading

import pytest

from crescent.cluster.processes import ManagedProcess, ProcessError, ProcessSpec
from crescent.cluster.restarts import Backoff, RestartSchedule


def test_every_crash_in_a_row_gets_a_restart_with_a_doubling_capped_delay():
    schedule = RestartSchedule(Backoff(first_s=0.5, max_s=4.0, stable_s=30.0))
    now, delays = 100.0, []
    for _ in range(6):
        delays.append(schedule.add_crash("prefill-0", ran_s=1.0, now=now))
        assert schedule.is_pending("prefill-0")
        assert not schedule.take_due("prefill-0", now + delays[-1] - 0.01)
        assert schedule.is_pending("prefill-0"), "a restart that is not due yet stays pending"
        assert schedule.take_due("prefill-0", now + delays[-1])
        assert not schedule.is_pending("prefill-0")
        now += delays[-1] + 1.0
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_crash_after_a_stable_run_starts_the_backoff_over():
    schedule = RestartSchedule(Backoff(first_s=0.5, max_s=10.0, stable_s=30.0))
    for _ in range(3):
        schedule.add_crash("decode-0", ran_s=2.0, now=0.0)
    assert schedule.add_crash("decode-0", ran_s=45.0, now=0.0) == 0.5
    assert schedule.num_crashes("decode-0") == 1


def test_processes_keep_their_own_counts_and_a_forgotten_restart_is_dropped():
    schedule = RestartSchedule(Backoff(first_s=1.0, max_s=10.0))
    schedule.add_crash("a", ran_s=0.0, now=0.0)
    schedule.add_crash("a", ran_s=0.0, now=0.0)
    assert schedule.add_crash("b", ran_s=0.0, now=0.0) == 1.0
    schedule.forget("a")
    assert not schedule.is_pending("a") and not schedule.take_due("a", now=1e9)


def test_a_child_cannot_be_started_off_the_main_thread(tmp_path):
    spec = ProcessSpec(name="noop", argv=[sys.executable, "-c", "pass"])
    process = ManagedProcess(spec, tmp_path)
    errors = []

    def start():
        try:
            process.start()
        except ProcessError as exc:
            errors.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join(10)
    assert errors and "main thread" in str(errors[0])
    assert process.popen is None


@pytest.mark.parametrize(
    "num_crashes, delay_s", [(1, 0.5), (2, 1.0), (5, 8.0), (6, 10.0), (60, 10.0)]
)
def test_default_backoff(num_crashes, delay_s):
    assert Backoff().delay_s(num_crashes) == delay_s
