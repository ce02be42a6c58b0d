"""The `TransferEngine`: registers segments, describes them, and runs batches.

    async with TransferEngine(resolver, TransferConfig(node="n1")) as engine:
        descriptor = engine.register(ShmSegment.create("n1/kv", 1 << 30))
        ...publish descriptor...
        result = await engine.transfer(entries, timeout=5.0)
        result.raise_for_errors()

Bad input is reported per entry, before any byte of that entry moves: an unknown local or
remote segment, a range out of bounds, a bad offset or length, or a remote segment no
transport reaches fail only that entry; the other entries of the batch still run.
`transfer` itself raises only for misuse of the engine (not running, timeout <= 0).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from operator import attrgetter
from typing import Self

from crescent.transfer.batch import BatchResult, Deadline, Op, TransferEntry
from crescent.transfer.config import ALL_TRANSPORTS, TransferConfig, TransportKind
from crescent.transfer.descriptor import Endpoint, SegmentDescriptor
from crescent.transfer.errors import (
    BadEntry,
    EngineNotRunning,
    NoRoute,
    TransferError,
    TransportUnavailable,
)
from crescent.transfer.groups import Columns, EntryGroup, columns_of, fits, misfits, to_columns
from crescent.transfer.hostinfo import host_id
from crescent.transfer.plan import check_range
from crescent.transfer.registry import SegmentRegistry
from crescent.transfer.resolver import Resolver, resolve_all
from crescent.transfer.segment import Segment
from crescent.transfer.transports import (
    Transport,
    TransportContext,
    create_transport,
    is_available,
)

log = logging.getLogger(__name__)

_REMOTE_SEGMENT = attrgetter("remote_segment")

# Transports report by the deadline; this much more covers their cleanup.
GRACE_S = 1.0


class EngineStatus(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass
class TransportCounters:
    """What one transport moved for this engine since it started: entries of this engine's
    batches that succeeded (`num_bytes`, `num_transfers`), and bytes its server moved for
    peers' batches (`num_served_bytes`; transports whose server side never sees the bytes,
    shm and one-sided rdma, report 0)."""

    num_bytes: int = 0
    num_transfers: int = 0
    num_served_bytes: int = 0


class TransferEngine:
    """One process's data plane: its registered segments and its transports."""

    def __init__(self, resolver: Resolver, config: TransferConfig | None = None) -> None:
        self.config = config or TransferConfig()
        self.host_id = host_id()
        self.status = EngineStatus.NEW
        self._resolver = resolver
        self._registry = SegmentRegistry()
        self._endpoints: dict[str, tuple[Endpoint, ...]] = {}
        self._transports: list[Transport] = []
        self._counters: dict[TransportKind, TransportCounters] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._num_in_flight = 0
        self._idle = asyncio.Event()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start every configured transport; TransportUnavailable if one asked for
        explicitly cannot run here. Idempotent while running."""
        if self.status is EngineStatus.RUNNING:
            return
        if self.status is not EngineStatus.NEW:
            raise EngineNotRunning(f"engine is {self.status.value}; build a new one")
        kinds = self.config.transports
        if kinds is None:
            kinds = tuple(k for k in ALL_TRANSPORTS if is_available(k, self.config.rdma_device))
        self._executor = ThreadPoolExecutor(
            self.config.max_threads, thread_name_prefix=f"crescent-transfer-{self.config.node}"
        )
        context = TransportContext(self.config, self._registry, self._executor, self.host_id)
        try:
            for kind in kinds:
                transport = create_transport(kind, context)
                await transport.start()
                self._transports.append(transport)
                self._counters[kind] = TransportCounters()
        except TransportUnavailable:
            await self._close_transports()
            self._executor.shutdown(wait=False)
            raise
        self._idle.set()
        self.status = EngineStatus.RUNNING
        log.info(
            "transfer engine on node %s started with %s",
            self.config.node,
            ", ".join(t.kind.value for t in self._transports),
        )

    async def close(self) -> None:
        """Refuse new batches, wait (bounded) for running ones, unregister every segment
        and stop the transports. Idempotent. Segments are not closed: they belong to
        whoever created them."""
        if self.status in (EngineStatus.NEW, EngineStatus.CLOSED):
            self.status = EngineStatus.CLOSED
            return
        if self.status is EngineStatus.CLOSING:
            return
        self.status = EngineStatus.CLOSING
        try:
            async with asyncio.timeout(self.config.close_timeout):
                await self._idle.wait()
        except TimeoutError:
            log.warning("closing with %d batches still running", self._num_in_flight)
        for segment in self._registry.segments():
            self.unregister(segment.name)
        await self._close_transports()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self.status = EngineStatus.CLOSED

    async def _close_transports(self) -> None:
        for transport in reversed(self._transports):
            try:
                await transport.close()
            except Exception:
                log.exception("closing transport %s failed", transport.kind.value)
        self._transports.clear()

    @property
    def transports(self) -> tuple[TransportKind, ...]:
        """The running transports, in order of preference."""
        return tuple(transport.kind for transport in self._transports)

    def transport(self, kind: TransportKind) -> Transport:
        """A running transport, for introspection (counters, addresses)."""
        for transport in self._transports:
            if transport.kind is kind:
                return transport
        raise TransportUnavailable(kind.value, "not running in this engine")

    def counters(self) -> dict[TransportKind, TransportCounters]:
        """Per transport this engine started, what it moved so far (a snapshot)."""
        served = {t.kind: t.num_served_bytes for t in self._transports}
        return {
            kind: TransportCounters(
                c.num_bytes, c.num_transfers, served.get(kind, c.num_served_bytes)
            )
            for kind, c in self._counters.items()
        }

    def register(self, segment: Segment) -> SegmentDescriptor:
        """Serve `segment` to peers and allow it as a local region of entries."""
        self._check_running()
        segment_id = self._registry.add(segment)
        endpoints = []
        try:
            for transport in self._transports:
                endpoint = transport.expose(segment, segment_id)
                if endpoint is not None:
                    endpoints.append(endpoint)
        except BaseException:
            self._registry.remove(segment.name)
            raise
        self._endpoints[segment.name] = tuple(endpoints)
        return self.descriptor(segment.name)

    def register_local(self, segment: Segment) -> None:
        """Allow `segment` (a caller's buffer, crescent.transfer.buffers.BufferSegment) as the
        local side of entries, never serving it to peers: no id, no endpoints. Entries routed
        to a transport that cannot move such memory (rdma) fail with BadEntry; ask
        `moves_local_buffers` first."""
        self._check_running()
        self._registry.add_local(segment)

    def unregister_local(self, name: str) -> None:
        """Forget a segment of `register_local`; SegmentNotFound if it is not registered."""
        self._registry.remove_local(name)

    def moves_local_buffers(self, remote: SegmentDescriptor) -> bool:
        """Whether entries to `remote` may take a `register_local` segment as their local side
        (False also when no transport reaches `remote`)."""
        try:
            return self._route(remote).moves_unregistered_memory
        except NoRoute:
            return False

    def unregister(self, name: str) -> None:
        """Stop serving a segment; SegmentNotFound if it is not registered."""
        segment = self._registry.remove(name)
        self._endpoints.pop(name, None)
        for transport in self._transports:
            transport.withdraw(segment)

    def descriptor(self, name: str) -> SegmentDescriptor:
        """What peers need to reach a registered segment (publish it for them)."""
        segment = self._registry.get(name)
        return SegmentDescriptor(
            name=segment.name,
            node=self.config.node,
            host_id=self.host_id,
            size=segment.size,
            endpoints=self._endpoints[name],
        )

    def descriptors(self) -> list[SegmentDescriptor]:
        return [self.descriptor(segment.name) for segment in self._registry.segments()]

    async def transfer(self, entries: Sequence[TransferEntry], *, timeout: float) -> BatchResult:
        """Run a batch; completes when every entry has succeeded or failed, at the latest
        at the deadline (`timeout` seconds from now) plus cleanup. Never raises for an
        entry's failure: see BatchResult and the module docstring."""
        self._check_running()
        deadline = Deadline.after(timeout)
        self._num_in_flight += 1
        self._idle.clear()
        try:
            return await self._run(entries, deadline)
        finally:
            self._num_in_flight -= 1
            if self._num_in_flight == 0:
                self._idle.set()

    async def _run(self, entries: Sequence[TransferEntry], deadline: Deadline) -> BatchResult:
        failures: dict[int, TransferError] = {}
        names = dict.fromkeys(map(_REMOTE_SEGMENT, entries))
        remotes = await resolve_all(self._resolver, names, deadline)
        try:
            columns = to_columns(entries)
        except TypeError:  # a field of the wrong type: find it entry by entry
            columns = self._columns_of_sound(entries, remotes, failures)
        work: dict[Transport, list[EntryGroup]] = {}
        for group_columns in columns:
            group = self._group(entries, group_columns, remotes, failures)
            if group is not None:
                work.setdefault(group[0], []).append(group[1])
        for transport_failures in (await self._execute(work, deadline)).values():
            failures.update(transport_failures)
        if not failures:
            return BatchResult((None,) * len(entries))
        outcomes: list[TransferError | None] = [None] * len(entries)
        for index, error in failures.items():
            outcomes[index] = error
        return BatchResult(tuple(outcomes))

    def _columns_of_sound(
        self,
        entries: Sequence[TransferEntry],
        remotes: dict[str, SegmentDescriptor | TransferError],
        failures: dict[int, TransferError],
    ) -> list[Columns]:
        """Columns of the entries that pass the per-entry check; the others fail with the
        precise error."""
        sound = []
        for index, entry in enumerate(entries):
            try:
                self._check(entry, remotes)
            except TransferError as exc:
                failures[index] = exc
            else:
                sound.append(index)
        return columns_of(entries, sound)

    def _group(
        self,
        entries: Sequence[TransferEntry],
        columns: Columns,
        remotes: dict[str, SegmentDescriptor | TransferError],
        failures: dict[int, TransferError],
    ) -> tuple[Transport, EntryGroup] | None:
        """Check one group's entries in a few C-level passes and route it; entries that fail
        get their error in `failures` (through _check, which names the fault). None when
        nothing of the group is left to move."""
        op, local_name, remote_name = columns.key
        local = self._registry.find(local_name)
        remote = remotes.get(remote_name)
        if type(op) is not Op or local is None or not isinstance(remote, SegmentDescriptor):
            self._fail_each(entries, columns.indices, remotes, failures)
            return None
        if not fits(columns, local.size, remote.size):
            bad, empty = misfits(columns, local.size, remote.size)
            self._fail_each(entries, [columns.indices[row] for row in bad], remotes, failures)
            skipped = {*bad, *empty}  # zero-length entries are done before anything moves
            columns = columns.take(
                [row for row in range(len(columns.lengths)) if row not in skipped]
            )
            if not columns.lengths:
                return None
        try:
            transport = self._route(remote)
            if not transport.moves_unregistered_memory and self._registry.is_local_only(local.name):
                raise BadEntry(
                    f"local segment {local.name!r} is not registered memory, which "
                    f"{transport.kind.value} needs to reach {remote.name!r}"
                )
        except TransferError as exc:
            for index in columns.indices:
                failures[index] = exc
            return None
        return transport, EntryGroup(
            op,
            local,
            remote,
            columns.indices,
            columns.local_offsets,
            columns.remote_offsets,
            columns.lengths,
        )

    async def _execute(
        self, work: dict[Transport, list[EntryGroup]], deadline: Deadline
    ) -> dict[Transport, dict[int, TransferError]]:
        """Run each transport's groups. Awaited in place rather than as tasks when there is
        one transport (the common case: a task costs an event-loop iteration). A transport
        that breaks its deadline contract by more than GRACE_S is cancelled and its entries
        time out; one that raises fails its entries."""
        if not work:
            return {}
        calls = [transport.execute(groups, deadline) for transport, groups in work.items()]
        raw: list[dict[int, TransferError] | BaseException | None] = [None] * len(calls)
        try:
            async with asyncio.timeout(deadline.remaining() + GRACE_S):
                if len(calls) == 1:
                    raw = [await _settle(calls[0])]
                else:
                    raw = await asyncio.gather(*calls, return_exceptions=True)
        except TimeoutError:
            log.error("transports missed the batch deadline by more than %.1f s", GRACE_S)
        results = {}
        for (transport, groups), outcome in zip(work.items(), raw, strict=True):
            if outcome is None:
                results[transport] = {
                    index: deadline.timeout_error(group.remote.name)
                    for group in groups
                    for index in group.indices
                }
            elif isinstance(outcome, BaseException):
                log.error("transport %s failed a batch", transport.kind.value, exc_info=outcome)
                failure = TransferError(f"transport {transport.kind.value} failed: {outcome!r}")
                results[transport] = {index: failure for group in groups for index in group.indices}
            else:
                results[transport] = outcome
                self._count(transport.kind, groups, outcome)
        return results

    def _count(
        self, kind: TransportKind, groups: Sequence[EntryGroup], failures: dict[int, TransferError]
    ) -> None:
        counters = self._counters[kind]
        for group in groups:
            if failures:
                lengths = [
                    length
                    for index, length in zip(group.indices, group.lengths, strict=True)
                    if index not in failures
                ]
            else:
                lengths = group.lengths
            counters.num_bytes += sum(lengths)
            counters.num_transfers += len(lengths)

    def _fail_each(
        self,
        entries: Sequence[TransferEntry],
        indices: Sequence[int],
        remotes: dict[str, SegmentDescriptor | TransferError],
        failures: dict[int, TransferError],
    ) -> None:
        """Entries the group check refused, each with the precise error _check gives."""
        for index in indices:
            try:
                self._check(entries[index], remotes)
            except TransferError as exc:
                failures[index] = exc
            else:  # the checks disagree: refuse rather than report an unmoved entry as moved
                failures[index] = BadEntry(f"entry {index} failed the batch check")

    def _check(
        self, entry: TransferEntry, remotes: dict[str, SegmentDescriptor | TransferError]
    ) -> None:
        """Raise the precise error of an entry that cannot run."""
        entry.check()
        local = self._registry.get(entry.local_segment)
        check_range(local.name, entry.local_offset, entry.length, local.size)
        remote = remotes[entry.remote_segment]
        if isinstance(remote, TransferError):
            raise remote
        check_range(remote.name, entry.remote_offset, entry.length, remote.size)

    def route(self, remote: SegmentDescriptor) -> TransportKind:
        """The transport a batch to this segment would use now; NoRoute if none."""
        return self._route(remote).kind

    def _route(self, remote: SegmentDescriptor) -> Transport:
        for transport in self._transports:
            if transport.can_reach(remote):
                return transport
        raise NoRoute(remote.name, tuple(kind.value for kind in self.transports))

    def _check_running(self) -> None:
        if self.status is not EngineStatus.RUNNING:
            raise EngineNotRunning(f"transfer engine is {self.status.value}")


async def _settle(
    call: Awaitable[dict[int, TransferError]],
) -> dict[int, TransferError] | Exception:
    """The call's result, or the exception it raised (cancellation still propagates)."""
    try:
        return await call
    except Exception as exc:
        return exc
