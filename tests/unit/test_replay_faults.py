"""Faults on a schedule while a replay runs (crescent.bench.replay_faults)."""

import signal
import threading
import time

import pytest

from crescent.bench.replay_faults import Fault, run_with_faults


class Recorder:
    """The processes' signals and the supervisor's calls, with when they came."""

    def __init__(self) -> None:
        self.started_at = time.monotonic()
        self.signals: list[tuple[float, str, int]] = []
        self.supervised = 0
        self.threads: set[str] = set()

    def process(self, name: str):
        recorder = self

        class Process:
            def signal(self, sig: int) -> None:
                recorder.threads.add(threading.current_thread().name)
                recorder.signals.append((time.monotonic() - recorder.started_at, name, sig))

        return Process()

    def supervise(self) -> None:
        self.supervised += 1


def replay_for(seconds: float):
    def replay() -> dict:
        time.sleep(seconds)
        return {"requests": 3, "errors": 0}

    return replay


def test_faults_are_sent_in_time_order_from_the_main_thread_while_the_replay_runs():
    recorder = Recorder()
    faults = (Fault(0.4, "kill", "prefill-1"), Fault(0.1, "pause", "decode-0", pause_s=0.2))
    row = run_with_faults(replay_for(0.8), faults, recorder.process, recorder.supervise)
    assert [(name, sig) for _, name, sig in recorder.signals] == [
        ("decode-0", signal.SIGSTOP),
        ("decode-0", signal.SIGCONT),
        ("prefill-1", signal.SIGKILL),
    ]
    (stop_at, _, _), (cont_at, _, _), (kill_at, _, _) = recorder.signals
    assert 0.1 <= stop_at < 0.4 and cont_at - stop_at >= 0.2 and kill_at >= 0.4
    assert recorder.threads == {threading.main_thread().name}
    assert recorder.supervised >= 3  # every period while the replay ran
    assert row == {
        "requests": 3,
        "errors": 0,
        "faults": ["0.1 s: SIGSTOP decode-0 for 0.2 s", "0.4 s: kill -9 prefill-1"],
    }


def test_a_replay_that_ends_first_lifts_its_pause_and_skips_what_was_not_due():
    recorder = Recorder()
    faults = (Fault(0.05, "pause", "vllm-0", pause_s=30.0), Fault(30.0, "kill", "vllm-1"))
    row = run_with_faults(replay_for(0.4), faults, recorder.process, recorder.supervise)
    assert [(name, sig) for _, name, sig in recorder.signals] == [
        ("vllm-0", signal.SIGSTOP),
        ("vllm-0", signal.SIGCONT),
    ]
    assert row["faults"] == ["0.05 s: SIGSTOP vllm-0 for 30 s"]


def test_a_failed_replay_is_raised_to_the_caller():
    def replay() -> dict:
        raise RuntimeError("aiperf exited with 2")

    recorder = Recorder()
    with pytest.raises(RuntimeError, match="aiperf exited with 2"):
        run_with_faults(replay, (), recorder.process, recorder.supervise)


@pytest.mark.parametrize(
    "fault",
    [
        {"at_s": 1.0, "action": "pause", "target": "decode-0"},  # a pause needs its length
        {"at_s": 1.0, "action": "kill", "target": "decode-0", "pause_s": 2.0},
        {"at_s": -1.0, "action": "kill", "target": "decode-0"},
        {"at_s": 1.0, "action": "term", "target": "decode-0"},
    ],
)
def test_a_malformed_fault_is_refused(fault):
    with pytest.raises(ValueError):
        Fault(**fault)
