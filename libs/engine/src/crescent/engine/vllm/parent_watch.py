"""An engine core process ends when the process that started it is gone.

vLLM's AsyncLLM runs its EngineCore, and the CrescentConnector with it, in a child process
(multiprocessing). When the worker dies abruptly (SIGKILL, the OOM killer), nothing stopped
that child: it kept the model's memory and its store connections, reconnecting to NATS for as
long as it lived, while the restarted worker started a second engine beside it. So a thread
waits on multiprocessing's sentinel for the parent and, once it closes, shuts the process
down: SIGTERM first, on which vLLM's engine core shuts down cleanly, and at once after a grace
period. The sentinel wait has no deadline: it lasts as long as the parent lives.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading

log = logging.getLogger(__name__)

GRACE_S = 10.0  # after SIGTERM, the longest a clean shutdown may take before the process exits

_watch_started = threading.Lock()


def exit_with_parent() -> None:
    """In a process multiprocessing started (vLLM's EngineCore), start watching its parent, once
    per process; in any other process, nothing."""
    parent = multiprocessing.parent_process()
    if parent is None or not _watch_started.acquire(blocking=False):
        return
    threading.Thread(
        target=_watch, args=(parent.pid, parent.sentinel), name="parent-watch", daemon=True
    ).start()


def _watch(parent_pid: int, sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    log.warning(
        "the process that started this engine core is gone; shutting down",
        extra={"parent_pid": parent_pid},
    )
    os.kill(os.getpid(), signal.SIGTERM)
    threading.Event().wait(GRACE_S)
    os._exit(1)
