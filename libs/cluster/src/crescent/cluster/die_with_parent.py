"""`python -m crescent.cluster.die_with_parent PARENT_PID ARGV...`: ask the kernel to send this
process SIGTERM when its parent dies (PR_SET_PDEATHSIG), then exec ARGV, which keeps the setting.

A separate step rather than a `preexec_fn`, because code between fork and exec in a
multi-threaded parent (the benchmarks, the tests) may deadlock on a lock another thread held.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    parent_pid, command = int(argv[0]), argv[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        sys.exit(0)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
