"""Store daemon: one per node, answering on store.<node>.ctl."""

from __future__ import annotations

import time

from crescent.common.config import CommonSettings
from crescent.common.messages import InstanceInfo, InstanceLoad, StoreStats, StoreStatsRequest
from crescent.common.service import Runtime


class StoreDaemon:
    role = "store"

    def __init__(self, settings: CommonSettings) -> None:
        self.settings = settings
        self._runtime: Runtime | None = None

    async def start(self, runtime: Runtime) -> None:
        self._runtime = runtime
        await runtime.bus.serve(runtime.subjects.store_ctl(self.settings.node), StoreStatsRequest, self.stats)

    def instance_info(self) -> InstanceInfo:
        return InstanceInfo(role=self.role, instance_id=self._runtime.instance_id, node=self.settings.node,
                            http_url=self._runtime.http_url, started_at=time.time())

    def health(self) -> dict:
        return {"node": self.settings.node}

    def load(self) -> InstanceLoad:
        return InstanceLoad(role=self.role, instance_id=self._runtime.instance_id, node=self.settings.node,
                            sent_at=time.time(), period_s=self.settings.telemetry_period_s)

    async def stats(self, request: StoreStatsRequest) -> StoreStats:
        return StoreStats(node=self.settings.node, instance_id=self._runtime.instance_id)

    async def drain(self) -> None:
        """Nothing in flight outlives its request yet."""
