"""Which kernel we run on: two processes with the same boot id share one kernel, which is
the first condition for moving bytes through shared memory instead of a socket."""

from __future__ import annotations

import socket
from pathlib import Path

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def host_id() -> str:
    """The kernel's boot id; the hostname where /proc does not provide one."""
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return f"host:{socket.gethostname()}"
