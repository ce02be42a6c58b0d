"""Shared-memory segments, mappings, the registry and the resolver helper."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import numpy as np
import pytest

from crescent.transfer import (
    Deadline,
    DictResolver,
    MemoryKind,
    SegmentDescriptor,
    SegmentNotFound,
    ShmEndpoint,
    ShmSegment,
    TransferError,
    TransferTimeout,
)
from crescent.transfer.peer import parse_size
from crescent.transfer.registry import SegmentRegistry
from crescent.transfer.resolver import resolve
from crescent.transfer.segment import ShmMapping, shm_file_identity


def test_shm_segment_is_zeroed_writable_and_unlinked_on_close() -> None:
    segment = ShmSegment.create("s", 8192)
    path = f"/dev/shm/{segment.shm_name}"
    assert os.path.exists(path)
    assert segment.memory_kind is MemoryKind.HOST
    assert segment.size == 8192 and not segment.array().any()
    segment.view()[:3] = b"abc"
    assert bytes(segment.array()[:3]) == b"abc"
    assert segment.address == segment.array().ctypes.data
    segment.close()
    segment.close()  # idempotent
    assert not os.path.exists(path)
    with pytest.raises(ValueError):
        segment.view()


def test_a_segment_name_that_is_taken_is_refused_and_the_first_file_kept() -> None:
    with ShmSegment.create("s", 4096) as first:
        first.view()[0] = 7
        with pytest.raises(FileExistsError):
            ShmSegment.create("s", 4096, shm_name=first.shm_name)
        assert os.path.exists(f"/dev/shm/{first.shm_name}") and first.view()[0] == 7


def test_shm_segment_rejects_bad_sizes_and_names() -> None:
    with pytest.raises(ValueError):
        ShmSegment.create("s", 0)
    with pytest.raises(ValueError):
        ShmSegment.create("s", 10, shm_name="a/b")


def test_mapping_sees_the_owners_bytes_and_its_liveness() -> None:
    owner = ShmSegment.create("s", 4096)
    mapping = ShmMapping(owner.shm_name, owner.size, owner.device, owner.inode)
    owner.array()[:4] = [1, 2, 3, 4]
    assert list(mapping.view[:4]) == [1, 2, 3, 4]
    mapping.view[4] = 9
    assert owner.array()[4] == 9
    assert mapping.owner_is_alive()
    owner.close()  # releases the owner's lock, as the death of its process would
    assert not mapping.owner_is_alive()
    mapping.close()


def test_mapping_refuses_a_different_file_of_the_same_name() -> None:
    owner = ShmSegment.create("s", 4096)
    device, inode = shm_file_identity(owner.shm_name)
    with pytest.raises(FileNotFoundError):
        ShmMapping(owner.shm_name, 4096, device, inode + 1)
    with pytest.raises(FileNotFoundError):
        ShmMapping(owner.shm_name, 8192, device, inode)  # larger than the file
    owner.close()
    assert shm_file_identity(owner.shm_name) is None


def test_a_mapping_is_not_of_a_new_file_published_under_its_name() -> None:
    """A restarted owner publishes a new file under the segment's old name: a mapping of the
    old file says it does not map the new endpoint (the caches of the shm transport and the
    store client then map the new file)."""
    first = ShmSegment.create("s", 4096)
    mapping = ShmMapping(first.shm_name, first.size, first.device, first.inode)
    first.close()
    with ShmSegment.create("s", 4096, shm_name=first.shm_name) as second:
        assert mapping.maps(ShmEndpoint(first.shm_name, first.device, first.inode))
        assert not mapping.maps(ShmEndpoint(second.shm_name, second.device, second.inode))
    mapping.close()


def test_registry_maps_names_and_never_reuses_ids() -> None:
    registry = SegmentRegistry()
    with ShmSegment.create("a", 4096) as a:
        first = registry.add(a)
        assert registry.get("a") is a and registry.by_id(first) is a
        with pytest.raises(ValueError):
            registry.add(a)
        assert registry.remove("a") is a
        assert registry.by_id(first) is None
        with pytest.raises(SegmentNotFound):
            registry.get("a")
        assert registry.add(a) != first


def descriptor(name: str) -> SegmentDescriptor:
    return SegmentDescriptor(name, "n", "boot", 10)


async def test_resolve_accepts_sync_and_async_resolvers() -> None:
    resolver = DictResolver({"a": descriptor("a")})
    assert await resolve(resolver, "a", Deadline.after(1)) == descriptor("a")

    async def async_resolver(name: str) -> SegmentDescriptor:
        return descriptor(name)

    assert (await resolve(async_resolver, "b", Deadline.after(1))).name == "b"


async def test_resolve_reports_unknown_names() -> None:
    def raising(name: str) -> SegmentDescriptor:
        raise KeyError(name)

    for resolver in (DictResolver(), raising):
        with pytest.raises(SegmentNotFound):
            await resolve(resolver, "x", Deadline.after(1))


async def test_resolve_is_bounded_by_the_deadline() -> None:
    async def hanging(name: str) -> SegmentDescriptor:
        await asyncio.sleep(60)
        raise AssertionError("unreachable")

    with pytest.raises(TransferTimeout):
        await resolve(hanging, "x", Deadline.after(0.05))


async def test_resolve_rejects_wrong_answers() -> None:
    with pytest.raises(TransferError):
        await resolve(lambda name: "nonsense", "x", Deadline.after(1))
    with pytest.raises(TransferError):
        await resolve(lambda name: descriptor("other"), "x", Deadline.after(1))


@pytest.mark.parametrize(
    ("text", "size"),
    [("4096", 4096), ("64KiB", 64 << 10), ("16MiB", 16 << 20), ("1gib", 1 << 30), ("7B", 7)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MiB", "1.5MiB", "3XB"])
def test_parse_size_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_array_views_are_numpy_uint8() -> None:
    with ShmSegment.create("s", 64) as segment:
        assert segment.array().dtype == np.uint8
        assert segment.array().flags.writeable


def test_a_dead_owners_leftover_file_is_not_mapped() -> None:
    code = (
        "import os; from crescent.transfer import ShmSegment; "
        "s = ShmSegment.create('s', 4096); print(s.shm_name, s.device, s.inode, flush=True); "
        "os._exit(0)"  # dies without unlinking its file
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, timeout=30)
    shm_name, device, inode = out.stdout.split()
    try:
        with pytest.raises(ProcessLookupError):
            ShmMapping(shm_name.decode(), 4096, int(device), int(inode))
    finally:
        os.unlink(f"/dev/shm/{shm_name.decode()}")


def test_sweep_removes_only_files_whose_owner_is_gone():
    from crescent.transfer.segment import SHM_DIR, sweep_orphans

    live = ShmSegment.create("live", 4096)
    orphan_path = SHM_DIR / "crescent-test-orphan-file"
    orphan_path.write_bytes(b"\0" * 4096)  # nobody holds its lock, as after a SIGKILL
    try:
        removed = sweep_orphans()
        assert "crescent-test-orphan-file" in removed and not orphan_path.exists()
        assert live.shm_name not in removed and (SHM_DIR / live.shm_name).exists()
    finally:
        live.close()
        orphan_path.unlink(missing_ok=True)
