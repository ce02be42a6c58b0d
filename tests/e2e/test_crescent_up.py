"""`crescent up` as a user runs it: serves, then leaves no process and no shared memory behind
after SIGTERM or even SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from pathlib import Path

import psutil
import pytest
from scrape import metric

from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e


def start_up(port: int, workdir: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`crescent up` of an emulated cluster, as a user starts it; its output in `stdout`."""
    crescent = Path(sys.executable).parent / "crescent"
    return subprocess.Popen(
        [
            str(crescent),
            "up",
            "--engine",
            "emulated",
            "--port",
            str(port),
            "--workdir",
            str(workdir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


class Output:
    """What `crescent up` prints, read as it comes by a thread of its own."""

    def __init__(self, up: subprocess.Popen) -> None:
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, args=(up.stdout,), daemon=True)
        self._reader.start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self._lines.append(line)

    def text(self, wait_s: float = 0.0) -> str:
        """All said so far; `wait_s`: first wait up to that long for the pipe to close."""
        self._reader.join(wait_s)
        return "".join(self._lines)


def wait_serving(up: subprocess.Popen, port: int) -> Output:
    """Once `crescent up` says it serves (its own start is over: a SIGTERM now stops a
    cluster that served) and the conductor sees every instance live."""
    output = Output(up)
    deadline = time.monotonic() + 60
    while "serving at" not in output.text():
        assert up.poll() is None, output.text(5)
        assert time.monotonic() < deadline, f"crescent up never said it serves: {output.text()}"
        time.sleep(0.1)
    while True:
        assert up.poll() is None, output.text(5)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                if json.load(response)["live_instances"] == {"prefill": 1, "decode": 1, "store": 1}:
                    return output
        except OSError:
            pass
        assert time.monotonic() < deadline, "crescent up did not start serving"
        time.sleep(0.2)


def test_sigterm_stops_every_process_of_the_cluster(tmp_path):
    port = free_port()
    up = start_up(port, tmp_path)
    try:
        output = wait_serving(up, port)
        body = json.dumps(
            {"model": "crescent-emulated", "prompt": "Hello, Crescent", "max_tokens": 4}
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert len(json.load(response)["choices"][0]["text"]) == 4
        # conditional disaggregation is on (auto): the decode computed this short prompt
        assert metric(f"http://127.0.0.1:{port}", "crescent_prefill_on_decode_total") == 1

        children = psutil.Process(up.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        for part in (
            "nats-server",
            "etcd",
            "crescent.store",
            "crescent.conductor",
            "crescent.prefill",
            "crescent.decode",
        ):
            assert part in names
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
        _, alive = psutil.wait_procs(children, timeout=5)
        assert alive == [], f"left running: {[p.cmdline() for p in alive]}"
        assert "stopping the cluster" in output.text(5)
    finally:
        if up.poll() is None:
            up.kill()


def log_tails(workdir: Path) -> str:
    return " ".join(
        f"\n--- {log.name}:\n" + "\n".join(log.read_text().splitlines()[-40:])
        for log in (workdir / "logs").glob("*.log")
    )


def test_sigkill_of_crescent_up_leaves_no_process_and_no_shared_memory(tmp_path):
    """Every child stops as an orphan, its peers (NATS, etcd) stopping at the same moment; each
    stop runs under its deadline (20 s here), so none is left even if a wait hangs."""
    port = free_port()
    up = start_up(
        port,
        tmp_path,
        {**os.environ, "CRESCENT_STOP_TIMEOUT_S": "20", "CRESCENT_DRAIN_TIMEOUT_S": "10"},
    )
    children = []
    try:
        output = wait_serving(up, port)
        children = psutil.Process(up.pid).children(recursive=True)
        segments = {
            f.path
            for child in children
            for f in child.open_files()
            if f.path.startswith("/dev/shm/crescent-")
        }
        assert segments, "the store's DRAM pool is a /dev/shm segment"
        up.kill()
        up.wait(10)
        _, alive = psutil.wait_procs(children, timeout=30)
        assert alive == [], (
            f"left running: {[(p.status(), p.cmdline()) for p in alive]}" + log_tails(tmp_path)
        )
        left = [path for path in segments if os.path.exists(path)]
        assert left == [], f"left in /dev/shm: {left}; up said: {output.text(5)}" + log_tails(
            tmp_path
        )
        for log in (tmp_path / "logs").glob("*.log"):  # stopped, but a wait hung: say where
            if "stop passed its deadline" in (text := log.read_text()):
                warnings.warn(f"{log.name}: {text[text.index('stop passed') :]}", stacklevel=1)
    finally:
        if up.poll() is None:
            up.kill()
        for child in children:
            if child.is_running():
                child.kill()


def test_sigterm_while_starting_stops_at_once(tmp_path):
    """A SIGTERM that arrives while the cluster is still starting ends the start there: the
    cluster never comes up, and nothing is left running."""
    port = free_port()
    up = start_up(port, tmp_path)
    children = []
    try:
        deadline = time.monotonic() + 30
        while not any(
            "crescent.conductor" in " ".join(c.cmdline())
            for c in psutil.Process(up.pid).children(recursive=True)
        ):
            assert up.poll() is None and time.monotonic() < deadline, up.stdout.read()
            time.sleep(0.02)
        children = psutil.Process(up.pid).children(recursive=True)
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
        said = up.stdout.read()
        assert "serving at" not in said
        assert "SIGTERM while starting; stopped" in said
        _, alive = psutil.wait_procs(children, timeout=5)
        assert alive == [], f"left running: {[p.cmdline() for p in alive]}"
    finally:
        if up.poll() is None:
            up.kill()
        for child in children:
            if child.is_running():
                child.kill()
