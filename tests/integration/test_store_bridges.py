"""The vLLM connector's store bridges (crescent.engine.kv_store) against a real NATS and etcd:
the two roles of one engine core share one bridge in one process, and the scheduler role on
its own holds a NATS connection alone (no etcd client, no data plane). Connections are counted
on the NATS server's /connz endpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import urllib.request

import nats
import pytest

from crescent.common.naming import Subjects
from crescent.engine.kv_store import BlockOps, BridgeConfig, KvStoreError, SharedBridges
from crescent.storeclient.client import StoreClient


def connection_names(connz_url: str) -> list[str]:
    with urllib.request.urlopen(connz_url, timeout=5) as response:
        return sorted(
            connection.get("name", "") for connection in json.load(response)["connections"]
        )


def closed_names(connz_url: str, timeout_s: float = 10.0) -> list[str]:
    """The connection names once the server has seen closed connections go (it notices a
    closed socket a moment after the client drained); what is left after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (names := connection_names(connz_url)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return names


def worker_config(nats_url: str, etcd_url: str, cluster: str) -> BridgeConfig:
    return BridgeConfig(
        nats_url=nats_url,
        etcd_url=etcd_url,
        cluster=cluster,
        node="n0",
        name="n0-prefill-kv",
        timeout_s=5.0,
        staging_bytes=1 << 20,
    )


def test_both_roles_in_one_process_share_one_bridge(infra, monitored_nats, cluster_name):
    nats_url, connz_url = monitored_nats
    worker = worker_config(nats_url, infra.etcd_url, cluster_name)
    worker_bridge = SharedBridges.acquire(worker)
    scheduler_bridge = SharedBridges.acquire(dataclasses.replace(worker, has_data_plane=False))
    try:
        assert scheduler_bridge is worker_bridge
        assert worker_bridge.client is not None
        assert connection_names(connz_url) == ["n0-prefill-kv"]
    finally:
        SharedBridges.release(scheduler_bridge)
        assert connection_names(connz_url) == ["n0-prefill-kv"]  # the worker side still uses it
        SharedBridges.release(worker_bridge)
    assert closed_names(connz_url) == []


def test_a_bridge_whose_store_client_fails_to_close_still_closes_its_connection(
    infra, monitored_nats, cluster_name, monkeypatch
):
    nats_url, connz_url = monitored_nats
    bridge = SharedBridges.acquire(worker_config(nats_url, infra.etcd_url, cluster_name))
    assert connection_names(connz_url) == ["n0-prefill-kv"]

    async def failing_close(self) -> None:
        raise RuntimeError("the data plane would not stop")

    monkeypatch.setattr(StoreClient, "close", failing_close)
    SharedBridges.release(bridge)
    assert closed_names(connz_url) == []


def test_the_scheduler_role_alone_holds_a_nats_connection_only(infra, monitored_nats, cluster_name):
    nats_url, connz_url = monitored_nats
    config = dataclasses.replace(
        worker_config(nats_url, infra.etcd_url, cluster_name), has_data_plane=False
    )
    bridge = SharedBridges.acquire(config)
    try:
        assert bridge.client is None
        assert connection_names(connz_url) == ["n0-prefill-kv-lookup"]
        ops = BlockOps(bridge, cluster_name, "m", timeout_s=1.0)
        with pytest.raises(KvStoreError, match="no data plane"):
            ops.mapped("n0")
        with pytest.raises(KvStoreError):  # no store on n0 answers: an error, not a hang
            bridge.call(ops.lookup("n0", [b"\0" * 16]), 5)
    finally:
        SharedBridges.release(bridge)
    assert closed_names(connz_url) == []


async def test_a_store_call_under_way_when_nats_drops_ends_then_not_at_its_deadline(
    infra, cluster_name
):
    """An engine thread waiting on its store when the NATS connection drops: the reply can no
    longer come, so the call ends with the drop instead of holding the engine until its
    deadline (KvStoreError, on which a lookup computes the prompt and a save is skipped)."""
    config = dataclasses.replace(
        worker_config(infra.nats_url, infra.etcd_url, cluster_name), has_data_plane=False
    )
    bridge = await asyncio.to_thread(SharedBridges.acquire, config)
    silent_store = await nats.connect(infra.nats_url, allow_reconnect=False)
    received = asyncio.Event()

    async def take_and_never_answer(_msg) -> None:
        received.set()

    await silent_store.subscribe(Subjects(cluster_name).store_ctl("n0"), cb=take_and_never_answer)
    await silent_store.flush()
    try:
        ops = BlockOps(bridge, cluster_name, "m", timeout_s=120)
        lookup = ops.lookup("n0", [b"\0" * 16])
        calling = asyncio.ensure_future(asyncio.to_thread(bridge.call, lookup, 120))
        await asyncio.wait_for(received.wait(), 10)
        infra.nats.stop()
        with pytest.raises(KvStoreError, match="connection dropped"):
            await asyncio.wait_for(calling, 60)  # not its 120 s deadline
    finally:
        await silent_store.close()
        await asyncio.to_thread(SharedBridges.release, bridge)
