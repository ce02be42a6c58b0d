"""One engine at a time measures itself on a machine: the others wait, then load its profile.

Engines that start together on one machine would otherwise all profile at once, each slowed by
the others by a different amount at each prompt length, and publish models of different
shapes for the same hardware (on a 2-core machine three tiny-model engines profiled at once
fitted per-token costs three times apart). The lock is the directory of stored profiles itself
(flock on it: no file of its own, released by the kernel if its holder dies); a worker that
cannot take it within `timeout_s` measures anyway, noisier, rather than not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

log = logging.getLogger(__name__)

POLL_S = 0.2


@contextlib.asynccontextmanager
async def profile_lock(directory: Path, timeout_s: float) -> AsyncIterator[bool]:
    """Hold the lock on `directory` (made if missing) while the body runs; yields whether the
    lock was taken."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        deadline = time.monotonic() + timeout_s
        is_locked = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                is_locked = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    log.warning(
                        "another engine held the profiling lock too long; measuring anyway",
                        extra={"directory": str(directory), "waited_s": timeout_s},
                    )
                    break
                await asyncio.sleep(POLL_S)
        try:
            yield is_locked
        finally:
            if is_locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
