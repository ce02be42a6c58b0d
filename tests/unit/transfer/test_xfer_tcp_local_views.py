"""The tcp client's local side of a request: pieces that lie back to back in one segment go
to the socket as one buffer, in order, whatever the remote side's order."""

from __future__ import annotations

import numpy as np

from crescent.transfer import Deadline, Op, SegmentDescriptor, TransferEntry
from crescent.transfer.buffers import BufferSegment
from crescent.transfer.plan import plan_slices
from crescent.transfer.transports.base import WorkItem
from crescent.transfer.transports.lanes import LaneSettings, PeerJob
from crescent.transfer.transports.tcp_client import _local_views

REMOTE = SegmentDescriptor("remote", "peer", "boot", 1 << 20)


def job_of(entries: list[TransferEntry], locals_: dict[str, BufferSegment]) -> PeerJob:
    items = [WorkItem(entry, locals_[entry.local_segment], REMOTE) for entry in entries]
    settings = LaneSettings(max_group_slices=64, max_group_bytes=1 << 20, max_reconnects=0)
    return PeerJob("peer:1", items, plan_slices(entries, 1 << 20), Deadline.after(5), settings)


def test_back_to_back_pieces_of_one_segment_are_one_buffer() -> None:
    array = np.arange(4096, dtype=np.uint8)
    segment = BufferSegment("a", memoryview(array))
    remote_offsets = [3072, 0, 1024, 2048]  # the remote order does not matter
    entries = [
        TransferEntry(Op.WRITE, "a", i * 1024, "remote", remote, 1024)
        for i, remote in enumerate(remote_offsets)
    ]
    job = job_of(entries, {"a": segment})
    views = _local_views(job, list(job.queue.drain()))
    assert len(views) == 1 and bytes(views[0]) == array.tobytes()


def test_gaps_other_segments_and_going_back_start_a_new_buffer() -> None:
    first = BufferSegment("a", memoryview(np.arange(4096, dtype=np.uint8)))
    second = BufferSegment("b", memoryview(np.full(4096, 7, dtype=np.uint8)))
    entries = [
        TransferEntry(Op.WRITE, "a", 0, "remote", 0, 100),
        TransferEntry(Op.WRITE, "a", 100, "remote", 100, 100),  # joins the first
        TransferEntry(Op.WRITE, "a", 300, "remote", 200, 100),  # a gap
        TransferEntry(Op.WRITE, "b", 400, "remote", 300, 100),  # another segment, same offset
        TransferEntry(Op.WRITE, "a", 0, "remote", 400, 100),  # back to the start
    ]
    job = job_of(entries, {"a": first, "b": second})
    views = _local_views(job, list(job.queue.drain()))
    assert [len(view) for view in views] == [200, 100, 100, 100]
    joined = b"".join(bytes(view) for view in views)
    expected = b"".join(
        bytes((first if e.local_segment == "a" else second).view()[e.local_offset :][: e.length])
        for e in entries
    )
    assert joined == expected
