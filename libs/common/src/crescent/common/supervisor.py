"""Background tasks a service owns: each one named, watched, and awaited on close.

A background task is supposed to run until the service stops. If one returns or raises
early, the service is broken in a way it cannot see from the outside, so the supervisor
records the failure and wakes whoever waits on `failed`; the service then exits non-zero and
its process manager restarts it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class TaskSupervisor:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()
        self._is_closing = False
        self.failed = asyncio.Event()
        self.failure: str | None = None

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._on_done)
        return task

    def _on_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if self._is_closing or task.cancelled():
            return
        error = task.exception()
        self.failure = f"task {task.get_name()} {'failed: ' + repr(error) if error else 'exited'}"
        log.error(
            "background task ended early",
            extra={"task": task.get_name(), "error": repr(error)},
            exc_info=error,
        )
        self.failed.set()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Cancel every task and wait for them; idempotent."""
        self._is_closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=timeout_s)
            for task in stuck:
                log.error("task ignored cancellation", extra={"task": task.get_name()})
