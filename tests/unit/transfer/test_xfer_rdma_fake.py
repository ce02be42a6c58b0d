"""The rdma transport's data path against a fake pyverbs that performs one-sided verbs
in-process (ctypes.memmove between registered addresses). Real RDMA is covered by the
contract suite, which skips where there is no device; this checks the posting, completion
and retry logic everywhere."""

from __future__ import annotations

import ctypes
import socket
import sys
import types
from collections.abc import Iterator

import numpy as np
import pytest

from crescent.transfer import (
    Deadline,
    Op,
    PeerUnreachable,
    RdmaEndpoint,
    SegmentDescriptor,
    ShmSegment,
    TransferEntry,
)
from crescent.transfer.plan import plan_slices
from crescent.transfer.transports.base import WorkItem
from crescent.transfer.transports.lanes import Broken, ConnectionPool, LaneSettings, PeerJob
from crescent.transfer.transports.rdma import RdmaConnection

WRITE, READ, SIGNALED, SUCCESS, RETRY_EXCEEDED = 0, 4, 2, 0, 12


class FakeSendWR:
    def __init__(self, wr_id: int, opcode: int, num_sge: int, sg: list, send_flags: int):
        self.wr_id, self.opcode, self.sg = wr_id, opcode, sg

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        self.rkey, self.remote_addr = rkey, addr


class FakeQP:
    """Executes each work request at once; fails from the `fail_at`-th one on (RC: every
    later request of the QP is flushed in error too)."""

    def __init__(self, fail_at: int | None) -> None:
        self.fail_at = fail_at
        self.num_posted = 0
        self.completions: list[types.SimpleNamespace] = []

    def post_send(self, wr: FakeSendWR) -> None:
        self.num_posted += 1
        failed = self.fail_at is not None and self.num_posted > self.fail_at
        if not failed:
            (sge,) = wr.sg
            src, dst = (
                (sge.addr, wr.remote_addr) if wr.opcode == WRITE else (wr.remote_addr, sge.addr)
            )
            ctypes.memmove(dst, src, sge.length)
        status = RETRY_EXCEEDED if failed else SUCCESS
        self.completions.append(types.SimpleNamespace(wr_id=wr.wr_id, status=status))

    def close(self) -> None:
        pass


class FakeCQ:
    def __init__(self, qp: FakeQP) -> None:
        self.qp = qp

    def poll(self, num_entries: int) -> tuple[int, list]:
        taken = self.qp.completions[:num_entries]
        del self.qp.completions[:num_entries]
        return len(taken), taken

    def close(self) -> None:
        pass


@pytest.fixture
def fake_pyverbs(monkeypatch: pytest.MonkeyPatch) -> None:
    enums = types.SimpleNamespace(
        IBV_WR_RDMA_WRITE=WRITE,
        IBV_WR_RDMA_READ=READ,
        IBV_SEND_SIGNALED=SIGNALED,
        IBV_WC_SUCCESS=SUCCESS,
    )
    wr = types.SimpleNamespace(
        SGE=lambda addr, length, lkey: types.SimpleNamespace(addr=addr, length=length),
        SendWR=FakeSendWR,
    )
    package = types.ModuleType("pyverbs")
    package.enums, package.wr = enums, wr  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyverbs", package)
    monkeypatch.setitem(sys.modules, "pyverbs.enums", enums)
    monkeypatch.setitem(sys.modules, "pyverbs.wr", wr)


@pytest.fixture
def segments() -> Iterator[tuple[ShmSegment, ShmSegment]]:
    with (
        ShmSegment.create("local", 1 << 20) as local,
        ShmSegment.create("remote", 1 << 20) as remote,
    ):
        yield local, remote


def make_pool(local: ShmSegment, failures: list[int | None]) -> ConnectionPool[RdmaConnection]:
    """Each new connection's QP fails at the next position in `failures` (None: never)."""
    sockets: list[socket.socket] = []

    def connect(deadline: Deadline) -> RdmaConnection:
        qp = FakeQP(failures.pop(0) if failures else None)
        ours, theirs = socket.socketpair()  # stands in for the handshake connection
        sockets.append(theirs)
        mrs = {local.name: types.SimpleNamespace(lkey=1)}
        return RdmaConnection(ours, qp, FakeCQ(qp), "owner:1", mrs)

    return ConnectionPool("owner:1", connect, max_idle=2)


def make_job(local: ShmSegment, remote: ShmSegment, entries: list[TransferEntry]) -> PeerJob:
    endpoint = RdmaEndpoint("fake0", 1, 0, "::1", 0, remote.address, 7, "owner", 1)
    descriptor = SegmentDescriptor("remote", "owner", "boot", remote.size, (endpoint,))
    items = [WorkItem(e, local, descriptor) for e in entries]
    settings = LaneSettings(max_group_slices=8, max_group_bytes=1 << 20, max_reconnects=2)
    return PeerJob("owner:1", items, plan_slices(entries, 4096), Deadline.after(5), settings)


def test_writes_and_reads_land_byte_exact(fake_pyverbs, segments) -> None:
    local, remote = segments
    local.array()[:65536] = np.arange(65536, dtype=np.uint32).view(np.uint8)[:65536]
    write = TransferEntry(Op.WRITE, "local", 0, "remote", 1000, 65536)
    job = make_job(local, remote, [write])
    job.run_lane(make_pool(local, []))
    assert job.outcomes() == [None]
    assert np.array_equal(remote.array()[1000 : 1000 + 65536], local.array()[:65536])
    read = TransferEntry(Op.READ, "local", 200_000, "remote", 1000, 65536)
    job = make_job(local, remote, [read])
    job.run_lane(make_pool(local, []))
    assert job.outcomes() == [None]
    assert np.array_equal(local.array()[200_000 : 200_000 + 65536], local.array()[:65536])


def test_completion_error_retries_on_a_new_queue_pair(fake_pyverbs, segments) -> None:
    local, remote = segments
    local.array()[:32768] = 7
    entry = TransferEntry(Op.WRITE, "local", 0, "remote", 0, 32768)
    job = make_job(local, remote, [entry])
    pool = make_pool(local, [3])  # the first QP fails its 4th work request
    job.run_lane(pool)
    assert job.outcomes() == [None]
    assert job.num_retries == 1 and pool.num_connects == 2
    assert np.all(remote.array()[:32768] == 7)


def test_queue_pairs_that_keep_failing_make_the_peer_unreachable(fake_pyverbs, segments) -> None:
    local, remote = segments
    job = make_job(local, remote, [TransferEntry(Op.WRITE, "local", 0, "remote", 0, 8192)])
    job.run_lane(make_pool(local, [0, 0, 0, 0]))
    (outcome,) = job.outcomes()
    assert isinstance(outcome, PeerUnreachable)
    assert outcome.segment == "remote" and "status 12" in outcome.cause


def test_owner_hanging_up_breaks_the_connection(fake_pyverbs, segments) -> None:
    local, remote = segments
    qp = FakeQP(None)
    ours, theirs = socket.socketpair()
    conn = RdmaConnection(ours, qp, FakeCQ(qp), "owner:1", {"local": types.SimpleNamespace(lkey=1)})
    theirs.close()  # the owner's process died: its end of the handshake closes
    qp.post_send = lambda wr: None  # and nothing completes any more
    job = make_job(local, remote, [TransferEntry(Op.WRITE, "local", 0, "remote", 0, 10)])
    group = job.queue.take(8, 1 << 20)
    with pytest.raises(Broken) as info:
        conn.run_group(job, group)
    assert info.value.num_done == 0 and "owner closed" in str(info.value.cause)
    ours.close()
