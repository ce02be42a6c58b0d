"""Supervised child processes outlive neither their supervisor nor a SIGKILL of it."""

import subprocess
import sys

import psutil

SUPERVISOR = """
import sys, time
from pathlib import Path
from crescent.cluster.processes import ManagedProcess, ProcessSpec
child = ManagedProcess(ProcessSpec(name="sleeper", argv=["sleep", "600"]), Path(sys.argv[1]))
child.start()
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_child_gets_sigterm_when_its_supervisor_is_sigkilled(tmp_path):
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    child = None
    try:
        child = psutil.Process(int(supervisor.stdout.readline()))
        assert child.is_running() and child.ppid() == supervisor.pid
        supervisor.kill()
        supervisor.wait(10)
        child.wait(10)  # psutil.TimeoutExpired if the child outlived its supervisor
    finally:
        supervisor.kill()
        if child is not None and child.is_running():
            child.kill()
