"""The lease keep-alive on a thread of its own.

Dead means the lease expired (DESIGN §10). If the keep-alive ran on the service's event loop, a
loop kept busy by compute (a long engine step) would let the lease expire and a slow instance
would be taken for a dead one. This thread, with its own loop and etcd connection, keeps the
lease alive for as long as the process runs; a stopped or killed process stops it with it.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import aetcd

from crescent.common.errors import UnreachableError
from crescent.common.etcd import LeasedKeys, connect_etcd

log = logging.getLogger(__name__)

STOP_POLL_S = 0.1


class LeaseHeartbeat:
    def __init__(
        self, etcd_url: str, leased: LeasedKeys, ttl_s: float, connect_timeout_s: float
    ) -> None:
        self._etcd_url = etcd_url
        self._leased = leased
        self._period_s = ttl_s / 3
        self._connect_timeout_s = connect_timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Idempotent; waits for the thread to close its connection."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        asyncio.run(self._beat())

    async def _beat(self) -> None:
        try:
            client = await connect_etcd(self._etcd_url, self._connect_timeout_s)
        except UnreachableError as exc:
            log.warning(
                "lease heartbeat has no etcd connection; the event loop keeps the lease",
                extra={"error": str(exc)},
            )
            return
        try:
            while not self._stop.is_set():
                lease = (
                    self._leased.lease
                )  # the loop renews it after a loss; always beat the current one
                if lease is not None:
                    try:
                        await client.refresh_lease(lease.id)
                    except (TimeoutError, aetcd.exceptions.ClientError, OSError) as exc:
                        log.debug("lease heartbeat failed", extra={"error": repr(exc)})
                await self._sleep(self._period_s)
        finally:
            await client.close()

    async def _sleep(self, seconds: float) -> None:
        for _ in range(max(1, round(seconds / STOP_POLL_S))):
            if self._stop.is_set():
                return
            await asyncio.sleep(STOP_POLL_S)
