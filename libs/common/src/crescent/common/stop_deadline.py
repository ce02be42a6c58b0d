"""A deadline on a service's stop, kept by a thread of its own.

A stop waits on peers that may be gone: NATS, etcd and the stores stop at the same moment when
`crescent up` is killed, and each child then stops as an orphan that nobody will SIGKILL. A wait
without an end there would keep the process, its ports and its shared memory forever. Past the
deadline this thread writes every thread's stack to the log, which names the wait that hung,
and ends the process. It also covers the interpreter's own exit, which joins executor threads.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

EXIT_CODE = 70  # EX_SOFTWARE: the stop did not finish


class StopDeadline:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._timer = threading.Timer(timeout_s, self._expire)
        self._timer.daemon = True
        self._is_started = False

    def start(self) -> None:
        """Idempotent: the first call starts the clock (called from the event loop's thread)."""
        if not self._is_started:
            self._is_started = True
            self._timer.start()

    def _expire(self) -> None:
        log.error(
            "stop passed its deadline; exiting, every thread's stack follows",
            extra={"timeout_s": self.timeout_s},
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(EXIT_CODE)
