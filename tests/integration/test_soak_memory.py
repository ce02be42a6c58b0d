"""The soak bench's memory reading counts a service's child processes: vLLM's engine core, where
the connector runs, is a child of the prefill and decode workers."""

import subprocess
import sys
import time

import psutil

from crescent.bench.soak import _tree_usage

CHILD_MB = 200
# A parent that holds almost nothing and starts a child holding CHILD_MB, then waits.
PARENT = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c",
    "import sys, time; block = bytearray({CHILD_MB} << 20); print('ready', flush=True); "
    "time.sleep(60)"], stdout=subprocess.PIPE)
print(child.stdout.readline().decode().strip(), flush=True)
child.wait()
"""


def test_a_process_memory_includes_its_children():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
    try:
        assert parent.stdout.readline().strip() == b"ready"
        own = psutil.Process(parent.pid).memory_info().rss
        assert _tree_usage(parent.pid)[0] >= own + CHILD_MB * 2**20
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait(timeout=10)


def test_a_process_that_is_gone_holds_nothing():
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait(timeout=30)
    time.sleep(0.1)
    assert _tree_usage(exited.pid) == (0, 0.0)
