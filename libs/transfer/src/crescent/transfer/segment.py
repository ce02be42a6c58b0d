"""Registered memory: the `Segment` handle and its shared-memory implementation.

A segment is a contiguous region that transports read from and write into directly. Host
memory lives in /dev/shm files so that a process on the same host can map it (the shm
transport then moves bytes with one memcpy); the tcp and rdma transports serve the same
memory to other hosts. `MemoryKind` leaves room for device (GPU) memory, which a
transport must declare it can handle before it is handed such a segment.
"""

from __future__ import annotations

import enum
import fcntl
import mmap
import os
import secrets
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Self

import numpy as np

from crescent.transfer.descriptor import ShmEndpoint

SHM_DIR = Path("/dev/shm")
_SHM_PREFIX = f"{SHM_DIR}/"


class MemoryKind(enum.Enum):
    HOST = "host"
    GPU = "gpu"


class Segment(ABC):
    """A region of memory that transports may read and write.

    Implementations keep the memory mapped until `close()`; a transport holds a
    memoryview while it moves bytes, which keeps the mapping alive even if the owner
    closes the segment mid-transfer (Python refuses to unmap exported buffers).
    """

    def __init__(self, name: str, size: int, memory_kind: MemoryKind) -> None:
        if not name:
            raise ValueError("segment name must not be empty")
        if size <= 0:
            raise ValueError(f"segment size must be positive, got {size}")
        self.name = name
        self.size = size
        self.memory_kind = memory_kind

    @abstractmethod
    def view(self) -> memoryview:
        """Writable bytes of the whole segment (host memory only)."""

    @abstractmethod
    def array(self) -> np.ndarray:
        """The whole segment as a writable 1-D uint8 array (host memory only)."""

    @property
    def address(self) -> int:
        """Virtual address of the first byte, for memory registration with a NIC."""
        return int(self.array().ctypes.data)

    @abstractmethod
    def close(self) -> None:
        """Release the memory. Idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shm_path(shm_name: str) -> Path:
    if not shm_name or "/" in shm_name or shm_name in (".", ".."):
        raise ValueError(f"invalid shm name {shm_name!r}")
    return SHM_DIR / shm_name


class ShmSegment(Segment):
    """Host memory in a /dev/shm file that this process created and owns.

    The owner holds a shared flock on the file for its whole life, so a peer can tell a
    live owner from a dead one (the kernel drops the lock when the process dies); see
    `owner_is_alive`. `close()` unlinks the file.
    """

    def __init__(self, name: str, size: int, shm_name: str, fd: int, buffer: mmap.mmap) -> None:
        super().__init__(name, size, MemoryKind.HOST)
        self.shm_name = shm_name
        self._fd = fd
        self._mmap = buffer
        self._view: memoryview | None = memoryview(buffer)
        self._array: np.ndarray | None = np.frombuffer(self._view, dtype=np.uint8)
        stat = os.fstat(fd)
        self.device = stat.st_dev
        self.inode = stat.st_ino

    @classmethod
    def create(
        cls, name: str, size: int, *, shm_name: str | None = None, populate: bool = True
    ) -> ShmSegment:
        """Create and map a new zero-filled segment.

        `populate` faults every page in now, so the first transfer does not pay for page
        faults; a store's pool should be resident anyway.
        """
        if size <= 0:
            raise ValueError(f"segment size must be positive, got {size}")
        shm_name = shm_name or f"crescent-{secrets.token_hex(8)}"
        path = _shm_path(shm_name)
        # The file gets its name only once it is locked and sized (an unnamed O_TMPFILE, then
        # linked): a sweep never sees a live owner's file unlocked, and a process that dies
        # before the link leaves nothing behind. It is then reopened by name, so that /proc (and
        # lsof, psutil) shows who holds it; its lock is taken again before the first one goes.
        unnamed_fd = os.open(SHM_DIR, os.O_TMPFILE | os.O_RDWR, 0o600)
        fd, is_linked = -1, False
        try:
            fcntl.flock(unnamed_fd, fcntl.LOCK_SH)
            os.ftruncate(unnamed_fd, size)
            _link_unnamed(unnamed_fd, path)
            is_linked = True
            fd = os.open(path, os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_SH)
            flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
            buffer = mmap.mmap(fd, size, flags=flags)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            if is_linked:
                path.unlink(missing_ok=True)
            raise
        finally:
            os.close(unnamed_fd)
        return cls(name, size, shm_name, fd, buffer)

    def view(self) -> memoryview:
        if self._view is None:
            raise ValueError(f"segment {self.name!r} is closed")
        return self._view

    def array(self) -> np.ndarray:
        if self._array is None:
            raise ValueError(f"segment {self.name!r} is closed")
        return self._array

    def close(self) -> None:
        if self._view is None:
            return
        _shm_path(self.shm_name).unlink(missing_ok=True)
        self._array = None
        try:
            self._view.release()
            self._mmap.close()
        except BufferError:
            # Someone still holds a view (an in-flight transfer or the caller): the
            # mapping is freed by the garbage collector once the last view is dropped.
            pass
        self._view = None
        os.close(self._fd)


def _link_unnamed(fd: int, path: Path) -> None:
    """Give the O_TMPFILE `fd` the name `path`; FileExistsError if the name is taken. A dir fd
    makes os.link call linkat with AT_SYMLINK_FOLLOW, which links the file the /proc entry
    points to rather than the entry itself."""
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.link(f"/proc/self/fd/{fd}", path.name, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


class ShmMapping:
    """Another process's /dev/shm segment, mapped into this one."""

    def __init__(self, shm_name: str, size: int, device: int, inode: int) -> None:
        self.shm_name = shm_name
        self.size = size
        self.device = device
        self.inode = inode
        fd = os.open(_shm_path(shm_name), os.O_RDWR)
        try:
            stat = os.fstat(fd)
            if (stat.st_dev, stat.st_ino) != (device, inode) or stat.st_size < size:
                raise FileNotFoundError(f"/dev/shm/{shm_name} is not the published segment")
            if not _is_locked(fd):  # a dead owner's leftover file: do not map it
                raise ProcessLookupError(f"the owner of /dev/shm/{shm_name} is dead")
            # Populate: build the page tables once now rather than fault on first copy.
            buffer = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._mmap = buffer
        self.view = memoryview(buffer)

    def maps(self, endpoint: ShmEndpoint) -> bool:
        """Whether this mapping is of the very file `endpoint` names (a segment's name outlives
        its owner: a restarted owner publishes a new file under it)."""
        return (self.shm_name, self.device, self.inode) == (
            endpoint.shm_name,
            endpoint.device,
            endpoint.inode,
        )

    def owner_is_alive(self) -> bool:
        """Whether the creating process still holds its shared lock on the file (False
        once this mapping is closed: nothing may be copied through it any more)."""
        return self._fd >= 0 and _is_locked(self._fd)

    def close(self) -> None:
        """Idempotent. Memory still viewed by an in-flight copy is unmapped by the garbage
        collector once that copy drops its views."""
        if self._fd < 0:
            return
        try:
            self.view.release()
            self._mmap.close()
        except BufferError:
            pass
        os.close(self._fd)
        self._fd = -1


def _is_locked(fd: int) -> bool:
    """Whether some process holds a lock on the file: taking an exclusive lock succeeds
    only when no live process holds the owner's shared one."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def shm_file_identity(shm_name: str) -> tuple[int, int] | None:
    """(device, inode) of /dev/shm/<shm_name>, or None if there is no such file. (Asked once
    per batch by the shm transport's routing: a plain string path, not a pathlib one, whose
    parsing would cost more than the stat.)"""
    if not shm_name or "/" in shm_name or shm_name in (".", ".."):
        return None
    try:
        stat = os.stat(f"{_SHM_PREFIX}{shm_name}")
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def sweep_orphans() -> list[str]:
    """Unlink /dev/shm/crescent-* files whose owner died without closing them (SIGKILL, OOM):
    otherwise their memory stays taken until reboot. A file is an orphan when no process holds
    its shared lock; `ShmSegment.create` names a file only once it holds that lock, so a live
    owner's file is never taken for one. Returns the names removed."""
    removed = []
    for path in SHM_DIR.glob("crescent-*"):
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        else:
            path.unlink(missing_ok=True)
            removed.append(path.name)
        finally:
            os.close(fd)
    return removed
