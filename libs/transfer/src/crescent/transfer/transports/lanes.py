"""Connection-oriented transports (tcp, rdma) share this: pools of connections per peer,
and lanes, worker threads that each hold one connection and work a peer's slices.

Blocking calls in threads rather than asyncio streams: the socket and verbs calls release
the GIL, so lanes move bytes in parallel while the event loop only waits for them, and the
hot path pays no per-chunk event-loop round trip.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from crescent.transfer.batch import Deadline
from crescent.transfer.errors import PeerUnreachable, TransferError
from crescent.transfer.plan import Slice, SliceQueue, plan_slices
from crescent.transfer.transports.base import WorkItem

log = logging.getLogger(__name__)

# After the deadline, lanes get this long to notice it and hand their connections back.
CLEANUP_GRACE_S = 0.5


class Broken(Exception):
    """A connection failed while running a group: the first `num_done` slices finished,
    the rest must run again elsewhere."""

    def __init__(self, num_done: int, cause: BaseException) -> None:
        super().__init__(f"connection broke after {num_done} slices: {cause!r}")
        self.num_done = num_done
        self.cause = cause


class Connection(Protocol):
    def run_group(self, job: PeerJob, group: list[Slice]) -> None:
        """Move every slice of the group; report refused slices with job.fail; raise
        Broken when the connection itself fails."""

    def abort(self) -> None:
        """Unblock the lane using this connection, from another thread."""

    def close(self) -> None: ...


C = TypeVar("C", bound=Connection)


class ConnectionPool(Generic[C]):
    """Open connections to one peer: lanes check one out for a batch and back in after.

    At most `max_idle` idle connections are kept; concurrent batches to the same peer open
    more, which are closed when handed back.
    """

    def __init__(self, peer: str, connect: Callable[[Deadline], C], max_idle: int) -> None:
        self.peer = peer
        self._connect = connect
        self._max_idle = max_idle
        self._idle: list[C] = []
        self._busy: set[C] = set()
        self._lock = threading.Lock()
        self._is_closed = False
        self.num_connects = 0

    def checkout(self, deadline: Deadline) -> C:
        """An idle connection, else a new one; OSError when the peer cannot be reached."""
        with self._lock:
            if self._is_closed:
                raise ConnectionAbortedError("connection pool is closed")
            if self._idle:
                conn = self._idle.pop()
                self._busy.add(conn)
                return conn
        conn = self._connect(deadline)
        with self._lock:
            self.num_connects += 1
            self._busy.add(conn)
        return conn

    def checkin(self, conn: C, is_healthy: bool) -> None:
        with self._lock:
            self._busy.discard(conn)
            if is_healthy and not self._is_closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def busy(self) -> list[C]:
        """Connections lanes are using right now."""
        with self._lock:
            return list(self._busy)

    def close(self) -> None:
        with self._lock:
            self._is_closed = True
            idle, self._idle = self._idle, []
            busy = list(self._busy)
        for conn in busy:
            conn.abort()
        for conn in idle:
            conn.close()


@dataclass(frozen=True, slots=True)
class LaneSettings:
    max_group_slices: int
    max_group_bytes: int
    max_reconnects: int


class PeerJob:
    """One batch's slices for one peer, worked by several lanes at once.

    Outcomes are per item (entry): the first error of any of its slices wins, and an item
    with a slice that never finished fails too: with PeerUnreachable if a lane gave up on
    the peer (it refused connections, or broke more than `max_reconnects` times), else
    with TransferTimeout.
    """

    def __init__(
        self,
        peer: str,
        items: Sequence[WorkItem],
        slices: Sequence[Slice],
        deadline: Deadline,
        settings: LaneSettings,
    ) -> None:
        self.peer = peer
        self.items = items
        self.deadline = deadline
        self.settings = settings
        self.queue = SliceQueue(slices)
        self.abort = threading.Event()
        self.num_retries = 0
        self._errors: list[TransferError | None] = [None] * len(items)
        self._num_left = [0] * len(items)
        for piece in slices:
            self._num_left[piece.item] += 1
        self._lock = threading.Lock()
        self._peer_failure: str | None = None
        self._connections: set[Connection] = set()

    def fail(self, item: int, error: TransferError) -> None:
        with self._lock:
            if self._errors[item] is None:
                self._errors[item] = error

    def outcomes(self) -> list[TransferError | None]:
        """One outcome per item; call once no lane runs any more."""
        with self._lock:
            outcomes = list(self._errors)
            for item, num_left in enumerate(self._num_left):
                if outcomes[item] is not None or num_left == 0:
                    continue
                segment = self.items[item].remote.name
                if self._peer_failure is not None:
                    outcomes[item] = PeerUnreachable(self.peer, segment, self._peer_failure)
                else:
                    outcomes[item] = self.deadline.timeout_error(segment)
            return outcomes

    def run_lane(self, pool: ConnectionPool[C]) -> None:
        """Work slices on one connection until none are left, the deadline passes, or the
        peer is gone. Runs in a worker thread; never raises."""
        conn: C | None = None
        num_reconnects = 0
        try:
            while not self.abort.is_set() and not self.deadline.is_expired():
                group = self.queue.take(
                    self.settings.max_group_slices, self.settings.max_group_bytes
                )
                if not group:
                    break
                if conn is None:
                    try:
                        conn = pool.checkout(self.deadline)
                    except OSError as exc:
                        self.queue.put_back(group)
                        self._give_up(f"connect failed: {exc!r}")
                        break
                    self._track(conn, is_in_use=True)
                try:
                    conn.run_group(self, group)
                except Broken as broken:
                    self._finished(group[: broken.num_done])
                    self.queue.put_back(group[broken.num_done :])
                    self._track(conn, is_in_use=False)
                    pool.checkin(conn, is_healthy=False)
                    conn = None
                    if self.deadline.is_expired() or self.abort.is_set():
                        break
                    num_reconnects += 1
                    with self._lock:
                        self.num_retries += 1
                    log.info("lane to %s broke (%r), retrying its slices", self.peer, broken.cause)
                    if num_reconnects > self.settings.max_reconnects:
                        self._give_up(f"connection lost {num_reconnects} times: {broken.cause!r}")
                        break
                else:
                    self._finished(group)
        except Exception as exc:  # a bug must fail the batch, not vanish with the thread
            log.exception("lane to %s failed", self.peer)
            self._give_up(f"internal error: {exc!r}")
        finally:
            if conn is not None:
                self._track(conn, is_in_use=False)
                # A stop aborts the connections lanes hold, this one too if it came between
                # two groups: pooled, it would break the next batch that took it.
                pool.checkin(conn, is_healthy=not self.abort.is_set())

    def stop(self) -> None:
        """Make every lane stop soon: no new groups, and the connections in use are
        aborted, which unblocks lanes waiting on them. Any thread may call it."""
        self.abort.set()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.abort()

    def _track(self, conn: Connection, is_in_use: bool) -> None:
        with self._lock:
            if is_in_use:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _finished(self, group: Sequence[Slice]) -> None:
        with self._lock:
            for piece in group:
                self._num_left[piece.item] -= 1

    def _give_up(self, cause: str) -> None:
        with self._lock:
            self._peer_failure = cause


@dataclass(frozen=True, slots=True)
class LanePlan:
    """How a connection-oriented transport runs a batch: where each item goes, and the
    pool of connections to each peer."""

    peer_of: Callable[[WorkItem], tuple[str, int]]
    pool_of: Callable[[str, int], ConnectionPool[Any]]
    settings: LaneSettings
    num_connections: int
    slice_bytes: int


async def execute_by_peer(
    items: Sequence[WorkItem], deadline: Deadline, plan: LanePlan, executor: Executor
) -> tuple[list[TransferError | None], int]:
    """Group items by peer, run one PeerJob per peer with up to `num_connections` lanes,
    and return one outcome per item plus the number of slice groups retried."""
    by_peer: dict[tuple[str, int], list[int]] = defaultdict(list)
    for index, item in enumerate(items):
        by_peer[plan.peer_of(item)].append(index)
    jobs = []
    for (host, port), indices in by_peer.items():
        peer_items = [items[i] for i in indices]
        slices = plan_slices([item.entry for item in peer_items], plan.slice_bytes)
        job = PeerJob(f"{host}:{port}", peer_items, slices, deadline, plan.settings)
        num_lanes = min(plan.num_connections, len(slices))
        jobs.append((job, plan.pool_of(host, port), num_lanes, indices))
    await _run_jobs(
        [(job, pool, num_lanes) for job, pool, num_lanes, _ in jobs], executor, deadline
    )
    outcomes: list[TransferError | None] = [None] * len(items)
    num_retries = 0
    for job, _, _, indices in jobs:
        num_retries += job.num_retries
        for index, outcome in zip(indices, job.outcomes(), strict=True):
            outcomes[index] = outcome
    return outcomes, num_retries


async def _run_jobs(
    jobs: Sequence[tuple[PeerJob, ConnectionPool[C], int]],
    executor: Executor,
    deadline: Deadline,
) -> None:
    """Start `num_lanes` lanes per job and wait for all of them, never past the deadline
    plus a short grace. Lanes still running then are aborted (their connections are shut
    down, which unblocks them at once); `PeerJob.outcomes` fails their unfinished items."""
    loop = asyncio.get_running_loop()
    futures = [
        loop.run_in_executor(executor, job.run_lane, pool)
        for job, pool, num_lanes in jobs
        for _ in range(num_lanes)
    ]
    if not futures:
        return
    try:
        _, pending = await asyncio.wait(futures, timeout=deadline.remaining() + CLEANUP_GRACE_S)
    except asyncio.CancelledError:
        _abort(jobs)
        raise
    if pending:
        _abort(jobs)
        await asyncio.wait(pending, timeout=CLEANUP_GRACE_S)


def _abort(jobs: Sequence[tuple[PeerJob, ConnectionPool[C], int]]) -> None:
    for job, _, _ in jobs:
        job.stop()
