"""The SSD tier: one preallocated file of fixed-size slots, read and written in a thread pool
(pread/pwrite release the GIL), so the event loop never waits on a disk."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from crescent.common.errors import ConfigError


class SsdTier:
    def __init__(self, path: Path, num_slots: int, slot_bytes: int, num_threads: int = 4) -> None:
        self.path = path
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(self._fd, num_slots * slot_bytes)
        except OSError as exc:
            raise ConfigError(f"cannot create the SSD tier file {path}: {exc}") from exc
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix="crescent-ssd")

    async def write_all(self, writes: list[tuple[int, memoryview]]) -> None:
        """(slot, data) pairs written in order in one thread hop: a later write to a slot
        wins, as it would one call at a time."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._write_all, writes)

    def _write_all(self, writes: list[tuple[int, memoryview]]) -> None:
        for slot, data in writes:
            self._write(slot, data)

    async def read_all(self, reads: list[tuple[int, memoryview]]) -> None:
        """Each (slot, out) pair's slot read into `out`, in one thread hop."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._read_all, reads)

    def _read_all(self, reads: list[tuple[int, memoryview]]) -> None:
        for slot, out in reads:
            self._read_into(slot, out)

    def _write(self, slot: int, data: memoryview) -> None:
        offset, written = slot * self.slot_bytes, 0
        while written < len(data):
            written += os.pwrite(self._fd, data[written:], offset + written)

    def _read_into(self, slot: int, out: memoryview) -> None:
        offset, done = slot * self.slot_bytes, 0
        while done < len(out):
            n = os.preadv(self._fd, [out[done:]], offset + done)
            if n == 0:
                raise OSError(f"short read of SSD slot {slot}")
            done += n

    def close(self) -> None:
        """The tier does not outlive its store: a restarted store starts empty."""
        self._executor.shutdown(wait=True)
        os.close(self._fd)
        self.path.unlink(missing_ok=True)
