"""etcd access on aetcd: connect with a start-up deadline, leased keys that survive lease loss,
and a prefix mirror that follows a range through restarts and compaction.

Why a mirror and not a bare watch: a watch alone misses what changed while it was
disconnected, and a watch restarted from a compacted revision fails. When the watch breaks the
mirror re-reads the whole range at one revision, emits exactly the difference against what it
holds, and watches again from that revision, so its listeners never miss or repeat a change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlparse

import aetcd
import aetcd.exceptions
from aetcd.rtypes import EventKind

from crescent.common.errors import ConfigError, UnreachableError

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 5


def _host_port(url: str) -> tuple[str, int]:
    parsed = urlparse(url if "://" in url else f"http://{url}")
    if not parsed.hostname:
        raise ConfigError(f"etcd_url {url!r} has no host")
    return parsed.hostname, parsed.port or 2379


async def connect_etcd(url: str, timeout_s: float = 10.0) -> aetcd.Client:
    """A connected client; retries until `timeout_s`, then raises UnreachableError."""
    host, port = _host_port(url)
    deadline = time.monotonic() + timeout_s
    attempts = 0
    while True:
        attempts += 1
        client = aetcd.Client(host=host, port=port, timeout=RPC_TIMEOUT_S)
        try:
            async with asyncio.timeout(min(2.0, timeout_s)):
                await client.get(b"/")
            return client
        except (TimeoutError, aetcd.exceptions.ClientError, OSError) as exc:
            await client.close()
            if time.monotonic() + 0.5 >= deadline:
                raise UnreachableError("etcd", url, attempts, repr(exc)) from exc
            await asyncio.sleep(0.5)


class LeasedKeys:
    """Keys that live as long as this process: put under one lease, kept alive in `run()`.

    If the lease is lost (etcd restarted, process paused past the TTL), a new lease is granted
    and every key is put again, so a live instance never stays missing from the registry. Once
    revoked (a clean shutdown) it stays so: the keep-alive would otherwise find the lease gone
    and put every key again under a new one, registering a stopping process for another TTL.
    """

    def __init__(self, client: aetcd.Client, ttl_s: int) -> None:
        self._client = client
        self._ttl_s = ttl_s
        self._values: dict[str, bytes] = {}
        self._lease: aetcd.leases.Lease | None = None
        self._is_revoked = False
        # Owners of other keys under this lease (a store's block metadata) re-put them here.
        self.on_renew: list[Callable[[], Awaitable[None]]] = []

    @property
    def lease(self) -> aetcd.leases.Lease | None:
        return self._lease

    async def start(self) -> None:
        self._lease = await self._client.lease(self._ttl_s)

    async def put(self, key: str, value: bytes) -> None:
        if self._is_revoked:
            log.warning("etcd put after the lease was revoked; not written", extra={"key": key})
            return
        self._values[key] = value
        try:
            await self._client.put(key.encode(), value, lease=self._lease)
        except aetcd.exceptions.ClientError as exc:
            if "lease not found" not in str(exc):
                raise
            # The lease lapsed before the keep-alive could run (a start that held the event loop
            # longer than the TTL): take a new one and put every key again, this one included.
            log.warning(
                "etcd lease lost before a put; re-registering", extra={"lease": self._lease.id}
            )
            await self._renew()

    async def run(self) -> None:
        """Keep the lease alive until cancelled; survives etcd outages. After a revoke it idles:
        returning would tell the service's task supervisor that a task died, and a stopping
        service would exit with a failure."""
        while True:
            await asyncio.sleep(self._ttl_s / 3)
            if self._is_revoked:
                continue
            try:
                reply = await self._lease.refresh()
                if reply.TTL <= 0 and not self._is_revoked:
                    log.warning("etcd lease lost; re-registering", extra={"lease": self._lease.id})
                    await self._renew()
            except (TimeoutError, aetcd.exceptions.ClientError, OSError) as exc:
                log.warning("etcd lease refresh failed", extra={"error": repr(exc)})

    async def _renew(self) -> None:
        if self._is_revoked:
            return
        self._lease = await self._client.lease(self._ttl_s)
        for key, value in self._values.items():
            await self._client.put(key.encode(), value, lease=self._lease)
        for callback in self.on_renew:
            await callback()

    async def revoke(self) -> None:
        """Delete every key now (clean shutdown) rather than waiting for the TTL."""
        self._is_revoked = True
        if self._lease is not None:
            try:
                await self._lease.revoke()
            except (TimeoutError, aetcd.exceptions.ClientError, OSError) as exc:
                log.warning(
                    "etcd lease revoke failed; keys expire with the TTL", extra={"error": repr(exc)}
                )


@dataclass(frozen=True)
class MirrorEvent:
    key: str
    value: bytes | None  # None: the key was deleted


MirrorListener = Callable[[MirrorEvent], Awaitable[None] | None]


class PrefixMirror:
    """A local copy of every key under `prefix`, kept current by `run()`.

    Listeners see each change once, in revision order: the initial range read as puts, then
    watch events, then after a reconnect or compaction the difference against a fresh read.
    """

    def __init__(
        self, client: aetcd.Client, prefix: str, listener: MirrorListener, retry_s: float = 0.5
    ) -> None:
        self._client = client
        self._prefix = prefix.encode()
        self._listener = listener
        self._retry_s = retry_s
        self.items: dict[str, tuple[bytes, int]] = {}  # key → (value, mod_revision)
        self.revision = 0
        self.num_resyncs = 0

    async def load(self) -> None:
        """The initial range read; call before run() so callers start from a full view."""
        await self._resync()

    async def run(self) -> None:
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "etcd watch broke; resuming",
                    extra={"prefix": self._prefix.decode(), "error": repr(exc)},
                )
            await self._recover()

    async def _follow(self) -> None:
        async with asyncio.timeout(RPC_TIMEOUT_S):
            watch = await self._client.watch_prefix(self._prefix, start_revision=self.revision + 1)
        try:
            async for event in watch:
                key = event.kv.key.decode()
                revision = event.kv.mod_revision
                if event.kind == EventKind.PUT:
                    self.items[key] = (event.kv.value, revision)
                    await self._emit(MirrorEvent(key, event.kv.value))
                elif self.items.pop(key, None) is not None:
                    await self._emit(MirrorEvent(key, None))
                self.revision = max(self.revision, revision)
        finally:
            try:
                async with asyncio.timeout(1.0):
                    await watch.cancel()
            except Exception:
                log.debug("watch cancel failed", exc_info=True)

    async def _recover(self) -> None:
        """Re-read the range once etcd answers; the diff covers whatever the broken watch missed."""
        while True:
            await asyncio.sleep(self._retry_s)
            try:
                await self._resync()
                return
            except (TimeoutError, aetcd.exceptions.ClientError, OSError) as exc:
                log.info("etcd not reachable yet", extra={"error": repr(exc)})

    async def _resync(self) -> None:
        result = await self._client.get_prefix(self._prefix)
        fresh = {kv.key.decode(): (kv.value, kv.mod_revision) for kv in result}
        for key in [k for k in self.items if k not in fresh]:
            del self.items[key]
            await self._emit(MirrorEvent(key, None))
        for key, (value, revision) in fresh.items():
            if self.items.get(key, (None, 0))[1] != revision:
                self.items[key] = (value, revision)
                await self._emit(MirrorEvent(key, value))
        self.revision = result.header.revision
        self.num_resyncs += 1

    async def _emit(self, event: MirrorEvent) -> None:
        outcome = self._listener(event)
        if outcome is not None:
            await outcome
