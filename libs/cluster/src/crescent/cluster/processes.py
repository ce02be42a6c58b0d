"""Child processes with a log file, a readiness check and a clean stop.

Each child gets its own session (process group), so stopping it also stops anything it
started, and a SIGKILL of the supervisor's group does not race the children's own shutdown.
Each child also asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG), so a
supervisor killed by SIGKILL or the OOM killer leaves no orphans: they shut down as on a
clean stop, and unlink their shared memory on the way out.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from crescent.cluster.restarts import RestartSchedule
from crescent.common.errors import FatalError

log = logging.getLogger(__name__)


class ProcessError(FatalError):
    def __init__(self, name: str, message: str, log_tail: str = "") -> None:
        super().__init__(
            f"{name}: {message}"
            + (f"\n--- last lines of its log ---\n{log_tail}" if log_tail else "")
        )
        self.name = name


def is_port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


@dataclass
class ProcessSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    port: int | None = None  # ready once this loopback port accepts connections
    stop_timeout_s: float = 10.0


class ManagedProcess:
    def __init__(self, spec: ProcessSpec, log_dir: Path) -> None:
        self.spec = spec
        self.log_path = log_dir / f"{spec.name}.log"
        self.popen: subprocess.Popen | None = None
        self.num_starts = 0
        self.started_at: float | None = None  # time.monotonic() of the latest start
        self.is_stopped = True  # not started yet, or stopped on purpose: not a crash

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    @property
    def is_running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> None:
        """Start (or restart) the process. Only from the main thread: the kernel signals the
        child when the thread that forked it exits, not when the whole process does."""
        if threading.current_thread() is not threading.main_thread():
            raise ProcessError(
                self.spec.name,
                "must be started from the main thread (its "
                "parent-death signal follows the forking thread)",
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "crescent.cluster.die_with_parent",
            str(os.getpid()),
            *self.spec.argv,
        ]
        with open(self.log_path, "ab") as log_file:
            self.popen = subprocess.Popen(
                argv,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.spec.env},
                start_new_session=True,
            )
        self.num_starts += 1
        self.started_at = time.monotonic()
        self.is_stopped = False

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.spec.port is not None and not is_port_open(self.spec.port):
            if not self.is_running:
                raise ProcessError(
                    self.spec.name,
                    f"exited with code {self.popen.returncode} before it was ready",
                    self.log_tail(),
                )
            if time.monotonic() > deadline:
                raise ProcessError(
                    self.spec.name,
                    f"port {self.spec.port} not open after {timeout_s}s",
                    self.log_tail(),
                )
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        if self.is_running:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        """SIGTERM without waiting (the process drains and exits on its own); it is stopped on
        purpose, so the supervisor does not restart it."""
        self.is_stopped = True
        self.signal(signal.SIGTERM)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after stop_timeout_s; returns the exit code."""
        self.is_stopped = True
        if self.popen is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(self.spec.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.popen.wait(5)

    def log_tail(self, num_lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])
        except FileNotFoundError:
            return ""


def restart_exited(
    processes: Iterable[ManagedProcess],
    restarts: RestartSchedule,
    on_crash: Callable[[ManagedProcess, float], None] = lambda process, delay_s: None,
) -> None:
    """Restart every process that exited without being stopped, after the schedule's backoff
    (`on_crash` hears of each crash once, with that delay). Call this periodically, from the
    main thread (see ManagedProcess.start)."""
    now = time.monotonic()
    for process in processes:
        name = process.spec.name
        if process.is_running or process.is_stopped:
            restarts.forget(name)  # restarted or stopped by hand meanwhile
        elif not restarts.is_pending(name):
            on_crash(process, restarts.add_crash(name, now - process.started_at, now))
        elif restarts.take_due(name, now):
            log.info("restarting %s", name)
            process.start()
