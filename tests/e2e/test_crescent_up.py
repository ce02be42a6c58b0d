"""`crescent up` as a user runs it: serves, then leaves no process behind after SIGTERM."""

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from crescent.cluster.processes import free_port

pytestmark = pytest.mark.e2e


def test_sigterm_stops_every_process_of_the_cluster(tmp_path):
    port = free_port()
    crescent = Path(sys.executable).parent / "crescent"
    up = subprocess.Popen([str(crescent), "up", "--engine", "emulated", "--port", str(port), "--workdir",
                           str(tmp_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert up.poll() is None, up.stdout.read()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                    if json.load(response)["live_instances"] == {"prefill": 1, "decode": 1, "store": 1}:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "crescent up did not start serving"
            time.sleep(0.2)
        body = json.dumps({"model": "crescent-emulated", "prompt": "Hello, Crescent", "max_tokens": 4}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert len(json.load(response)["choices"][0]["text"]) == 4

        children = psutil.Process(up.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        for part in ("nats-server", "etcd", "crescent.store", "crescent.conductor", "crescent.prefill",
                     "crescent.decode"):
            assert part in names
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
        _, alive = psutil.wait_procs(children, timeout=5)
        assert alive == [], f"left running: {[p.cmdline() for p in alive]}"
        assert "serving at" in up.stdout.read()
    finally:
        if up.poll() is None:
            up.kill()
