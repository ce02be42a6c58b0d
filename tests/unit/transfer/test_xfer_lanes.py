"""Lanes and connection pools (transports/lanes.py) with fake connections: retries,
giving up on a dead peer, deadlines, refusals."""

from __future__ import annotations

import threading
import time

from crescent.transfer import (
    Deadline,
    Op,
    PeerUnreachable,
    SegmentDescriptor,
    SegmentNotFound,
    TransferEntry,
    TransferTimeout,
)
from crescent.transfer.plan import Slice, plan_slices
from crescent.transfer.transports.base import WorkItem
from crescent.transfer.transports.lanes import Broken, ConnectionPool, LaneSettings, PeerJob

SETTINGS = LaneSettings(max_group_slices=4, max_group_bytes=1 << 20, max_reconnects=2)


class FakeConnection:
    """Runs groups by recording them; breaks the next `breaks[0]` groups after their first
    slice; refuses the item `refuse` as a server would refuse an unknown segment."""

    def __init__(
        self, log: list[int], breaks: list[int], delay: float = 0.0, refuse: int | None = None
    ) -> None:
        self.log = log
        self.breaks = breaks
        self.delay = delay
        self.refuse = refuse
        self.is_closed = False

    def run_group(self, job: PeerJob, group: list[Slice]) -> None:
        time.sleep(self.delay)
        if self.breaks and self.breaks[0] > 0:
            self.breaks[0] -= 1
            self.log.append(group[0].item)
            raise Broken(1, ConnectionResetError("reset"))
        for piece in group:
            if piece.item == self.refuse:
                job.fail(piece.item, SegmentNotFound("remote", job.peer))
            self.log.append(piece.item)

    def abort(self) -> None:
        self.is_closed = True

    def close(self) -> None:
        self.is_closed = True


def make_job(num_items: int, deadline: float = 10.0) -> PeerJob:
    remote = SegmentDescriptor("remote", "peer", "boot", 1 << 30)
    entries = [TransferEntry(Op.WRITE, "l", 0, "remote", 0, 10) for _ in range(num_items)]
    items = [WorkItem(e, None, remote) for e in entries]  # type: ignore[arg-type]
    return PeerJob("peer:1", items, plan_slices(entries, 10), Deadline.after(deadline), SETTINGS)


def test_all_slices_run_and_succeed() -> None:
    log: list[int] = []
    pool = ConnectionPool("peer:1", lambda d: FakeConnection(log, []), max_idle=2)
    job = make_job(10)
    job.run_lane(pool)
    assert sorted(log) == list(range(10))
    assert job.outcomes() == [None] * 10
    assert pool.num_connects == 1


def test_broken_connection_is_replaced_and_its_slices_retried() -> None:
    log: list[int] = []
    breaks = [1]  # the first group breaks after its first slice
    pool = ConnectionPool("peer:1", lambda d: FakeConnection(log, breaks), max_idle=2)
    job = make_job(8)
    job.run_lane(pool)
    assert job.outcomes() == [None] * 8
    assert job.num_retries == 1
    assert pool.num_connects == 2
    assert sorted(set(log)) == list(range(8))


def test_peer_refusing_connections_fails_with_peer_unreachable() -> None:
    def refuse(deadline: Deadline) -> FakeConnection:
        raise ConnectionRefusedError("refused")

    job = make_job(3)
    job.run_lane(ConnectionPool("peer:1", refuse, max_idle=2))
    outcomes = job.outcomes()
    assert all(isinstance(o, PeerUnreachable) for o in outcomes)
    assert outcomes[0].peer == "peer:1" and outcomes[0].segment == "remote"
    assert "refused" in outcomes[0].cause


def test_lane_gives_up_after_max_reconnects() -> None:
    log: list[int] = []
    breaks = [100]
    pool = ConnectionPool("peer:1", lambda d: FakeConnection(log, breaks), max_idle=2)
    job = make_job(20)
    job.run_lane(pool)
    outcomes = job.outcomes()
    assert job.num_retries == SETTINGS.max_reconnects + 1
    assert any(isinstance(o, PeerUnreachable) for o in outcomes)
    assert all(o is None or isinstance(o, PeerUnreachable) for o in outcomes)


def test_unfinished_slices_time_out_at_the_deadline() -> None:
    log: list[int] = []
    pool = ConnectionPool("peer:1", lambda d: FakeConnection(log, [], delay=0.03), max_idle=2)
    job = make_job(40, deadline=0.05)
    job.run_lane(pool)
    outcomes = job.outcomes()
    assert isinstance(outcomes[-1], TransferTimeout)
    assert outcomes[0] is None


def test_refused_slice_fails_only_its_item() -> None:
    log: list[int] = []
    pool = ConnectionPool("peer:1", lambda d: FakeConnection(log, [], refuse=99), max_idle=2)
    job = make_job(100)
    job.run_lane(pool)
    outcomes = job.outcomes()
    assert isinstance(outcomes[99], SegmentNotFound)
    assert outcomes[:99] == [None] * 99


def test_parallel_lanes_share_the_queue() -> None:
    log: list[int] = []
    pool = ConnectionPool("peer:1", lambda d: FakeConnection(log, [], delay=0.001), max_idle=4)
    job = make_job(200)
    threads = [threading.Thread(target=job.run_lane, args=(pool,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(log) == list(range(200))
    assert job.outcomes() == [None] * 200
    assert pool.num_connects == 4


def test_pool_keeps_at_most_max_idle_and_closes_the_rest() -> None:
    pool = ConnectionPool("peer:1", lambda d: FakeConnection([], []), max_idle=1)
    deadline = Deadline.after(1)
    first, second = pool.checkout(deadline), pool.checkout(deadline)
    assert set(pool.busy()) == {first, second}
    pool.checkin(first, is_healthy=True)
    pool.checkin(second, is_healthy=True)
    assert not first.is_closed and second.is_closed
    assert pool.checkout(deadline) is first
    pool.checkin(first, is_healthy=False)
    assert first.is_closed


def test_a_connection_aborted_by_a_stop_between_groups_is_not_pooled() -> None:
    """A stop aborts the connections lanes hold; one whose group had just finished leaves
    the lane at its next check, and must be closed, not kept: the next batch would take it
    from the pool and find it broken (once per pooled connection, up to giving up)."""
    log: list[int] = []

    class StoppedAfterItsGroup(FakeConnection):
        def run_group(self, job: PeerJob, group: list[Slice]) -> None:
            super().run_group(job, group)
            job.stop()  # the batch is cancelled as this group's reply comes in

    made: list[FakeConnection] = []

    def connect(deadline: Deadline) -> FakeConnection:
        made.append(StoppedAfterItsGroup(log, []))
        return made[-1]

    pool = ConnectionPool("peer:1", connect, max_idle=2)
    job = make_job(8)
    job.run_lane(pool)
    assert made and all(conn.is_closed for conn in made)
    assert pool.checkout(Deadline.after(1)) is not made[0]
