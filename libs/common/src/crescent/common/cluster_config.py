"""The cluster's settings in etcd (the `config` key, DESIGN §4): the model served, tokens per KV
block and the SLOs.

The first conductor writes it (create-if-absent, so two conductors starting at once agree on
one); every conductor, prefill and decode service reads it at start and refuses to start when
its own flags contradict it (the store has none of these settings: it holds blocks of any model,
keyed by hash, in slots of its own --block-bytes, which the workers check against their model),
because a block size that differs from the conductor's shows only as silent cache misses. A
worker that starts before any conductor follows the key and stops as soon as a contradicting
config appears. The key has no lease: it describes the cluster, not a process.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aetcd

from crescent.common.codec import decode, encode
from crescent.common.errors import FatalError, MessageError
from crescent.common.etcd import MirrorEvent, PrefixMirror
from crescent.common.messages import ClusterConfig
from crescent.common.naming import Keys

log = logging.getLogger(__name__)


class ConfigConflict(FatalError):
    """This service's flags contradict the cluster config in etcd."""

    def __init__(self, key: str, service: str, conflicts: list[str]) -> None:
        super().__init__(
            f"{service} contradicts the cluster config in etcd ({key}, written by the first "
            f"conductor): {'; '.join(conflicts)}. Start it with the cluster's values, or start "
            f"the cluster afresh (an empty etcd) to change them"
        )
        self.conflicts = conflicts


def conflicts(config: ClusterConfig, flags: dict[str, Any]) -> list[str]:
    """One line per setting of `flags` (ClusterConfig field → this service's value) that differs.
    An empty `model` in the config accepts any model."""
    found = []
    for name, mine in flags.items():
        theirs = getattr(config, name)
        if name == "model" and not theirs:
            continue
        if theirs != mine:
            found.append(f"the cluster's {name} is {theirs!r}, this service's is {mine!r}")
    return found


def _decode(value: bytes, key: str) -> ClusterConfig:
    config = decode(value, ClusterConfig)
    if config.block_size < 1:
        raise MessageError("ClusterConfig", f"block_size {config.block_size} in {key} is not >= 1")
    return config


async def publish_config(etcd: aetcd.Client, keys: Keys, mine: ClusterConfig) -> ClusterConfig:
    """Write `mine` unless a config exists; return the one that is in etcd now."""
    key = keys.config().encode()
    is_new, responses = await etcd.transaction(
        compare=[etcd.transactions.version(key) == 0],
        success=[etcd.transactions.put(key, encode(mine))],
        failure=[etcd.transactions.get(key)],
    )
    if is_new:
        log.info(
            "cluster config written",
            extra={"key": keys.config(), "block_size": mine.block_size, "model": mine.model},
        )
        return mine
    [(value, _)] = responses[0]
    return _decode(value, keys.config())


class ConfigFollower:
    """The cluster config as etcd holds it now, checked against this service's flags.

    `start` reads it (a contradiction raises ConfigConflict: the service does not start);
    `run`, a supervised task, follows the key and raises ConfigConflict when a contradicting
    config appears later, which stops the service.
    """

    def __init__(self, etcd: aetcd.Client, keys: Keys, service: str, flags: dict[str, Any]) -> None:
        self._key = keys.config()
        self._service = service
        self._flags = flags
        self._mirror = PrefixMirror(etcd, self._key, self._apply)
        self._conflict: ConfigConflict | None = None
        self._has_conflict = asyncio.Event()
        self._is_malformed_logged = False
        self.config: ClusterConfig | None = None

    def _apply(self, event: MirrorEvent) -> None:
        if event.key != self._key:
            return
        if event.value is None:
            return  # the config outlives its writer; a deleted one is simply not checked
        try:
            config = _decode(event.value, self._key)
        except MessageError as exc:
            if not self._is_malformed_logged:
                self._is_malformed_logged = True
                log.warning(
                    "ignoring a malformed cluster config",
                    extra={"key": self._key, "error": str(exc)},
                )
            return
        found = conflicts(config, self._flags)
        if found:
            self._conflict = ConfigConflict(self._key, self._service, found)
            self._has_conflict.set()
            return
        self.config = config

    async def start(self) -> None:
        await self._mirror.load()
        if self._conflict is not None:
            raise self._conflict

    async def run(self) -> None:
        follow = asyncio.create_task(self._mirror.run(), name="cluster-config watch")
        try:
            await self._has_conflict.wait()
        finally:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
        raise self._conflict
