"""Hot-spot replication on an emulated cluster whose instances each have a node and a store: a
long shared system prompt, asked about one request at a time, is computed once and then reused
on the prefill node that holds it; the conductor's hot-spot pass gives it a replica on the other
prefill node, where no request ever ran (paper §4.2). The orders are counted on both sides."""

import asyncio
import time

import aiohttp
import pytest
from expected import expected_text
from scrape import metric

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.codec import decode
from crescent.common.etcd import connect_etcd
from crescent.common.hashing import block_hashes
from crescent.common.messages import InstanceInfo
from crescent.common.naming import Keys
from crescent.common.ports import free_port
from crescent.common.tokenizer import ByteTokenizer

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
SYSTEM_PROMPT = (
    "You are Crescent's test assistant. Answer briefly and precisely. " * 128
)  # 8,448 bytes
SPARE_NODE = "node-prefill-1"
TELEMETRY_PERIOD_S = 0.2  # the services' default


@pytest.fixture
def cluster(tmp_path):
    spec = ClusterSpec(
        workdir=tmp_path,
        api_port=free_port(),
        num_prefill=2,
        num_decode=1,
        node_per_instance=True,
        engine_args=["--emulated-time-scale", "0.2"],
        store_dram_bytes=64 << 20,
        store_ssd_bytes=64 << 20,
        conductor_args=["--hot-spot-period-s", "0.5"],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=90)
    yield cluster
    cluster.stop()


async def holders(cluster, block_hash: bytes) -> set[str]:
    etcd = await connect_etcd(cluster.etcd_url)
    try:
        prefix = Keys(cluster.spec.cluster).blocks(MODEL) + block_hash.hex() + "/"
        return {kv.key.decode().rsplit("/", 1)[-1] for kv in await etcd.get_prefix(prefix.encode())}
    finally:
        await etcd.close()


async def store_url(cluster, node: str) -> str:
    etcd = await connect_etcd(cluster.etcd_url)
    try:
        entry = await etcd.get(
            Keys(cluster.spec.cluster).instance("store", f"store-{node}").encode()
        )
        return decode(entry.value, InstanceInfo).http_url
    finally:
        await etcd.close()


async def test_hot_system_prompt_gets_a_replica_from_the_hot_spot_pass_on_a_node_that_never_ran_it(
    cluster,
):
    first_block = block_hashes(ByteTokenizer().encode(SYSTEM_PROMPT), 512, MODEL)[0]
    async with aiohttp.ClientSession() as session:

        async def ask(i: int) -> None:
            prompt = SYSTEM_PROMPT + f"Question {i}: what is a KV cache?"
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
            async with session.post(f"{cluster.api_url}/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()
                result = await response.json()
            assert result["choices"][0]["text"] == expected_text(prompt, 4)

        for i in range(12):
            await ask(i)
            # One at a time, each once telemetry says the last is done: the prefill instance whose
            # node holds the prefix is then always the best choice, so the other one never runs it.
            await asyncio.sleep(3 * TELEMETRY_PERIOD_S)
        async with session.get(f"{cluster.api_url}/v1/cluster") as response:
            view = await response.json()

    spare_store = await store_url(cluster, SPARE_NODE)

    def hot_spot_blocks_on_spare() -> float:
        return sum(
            metric(
                spare_store,
                "crescent_store_replicated_blocks_total",
                reason="hot-spot",
                source=source,
            )
            for source in ("node-prefill-0", "node-decode-0")
        )

    def hot_spot_orders_done() -> float:
        return metric(
            cluster.api_url, "crescent_replication_orders_total", reason="hot-spot", outcome="ok"
        )

    # A store counts a replication once its source has unpinned the blocks, after the commit
    # that etcd shows, and the conductor counts the order once the store replied: wait for the
    # counters themselves, not for the block's key.
    deadline = time.monotonic() + 10
    while hot_spot_blocks_on_spare() == 0 or hot_spot_orders_done() == 0:
        assert time.monotonic() < deadline, (
            f"no hot-spot replica on {SPARE_NODE} (orders done: {hot_spot_orders_done()}): "
            f"holders {sorted(await holders(cluster, first_block))}, on-demand pulls planned "
            + str(
                metric(
                    cluster.api_url,
                    "crescent_replication_orders_total",
                    reason="on-demand",
                    outcome="ok",
                )
            )
        )
        await asyncio.sleep(0.2)
    assert SPARE_NODE in await holders(cluster, first_block)
    assert (
        metric(spare_store, "crescent_store_replications_total", reason="on-demand", outcome="ok")
        == 0
    )
    assert (
        metric(spare_store, "crescent_store_replications_total", reason="hot-spot", outcome="ok")
        > 0
    )
    assert metric(cluster.api_url, "crescent_replication_order_blocks_total", reason="hot-spot") > 0
    # Most prompt tokens were loaded from a store rather than computed (as the prefills report).
    assert view["cache_hit_rate"] > 0.5, view["cache_hit_rate"]
    assert metric(cluster.api_url, "crescent_prefix_tokens_total", kind="loaded") > 0
