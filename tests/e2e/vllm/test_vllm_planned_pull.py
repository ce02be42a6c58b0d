"""The conductor's plan is what runs, on the real model. A prefill instance and a decode
instance on two nodes, a store on each, every byte over tcp (stores and workers alike); one
conductor schedules with kv-centric, one with each baseline policy. A shared prefix is held only
by the decode node's store (the test evicts it from the prefill node's): kv-centric plans a
pull from the decode node and the prefill node's store carries it out over tcp; no baseline
plans one and none happens, so the prompt is computed in full. All answer exactly as plain
vLLM does."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import aiohttp
import pytest
from scrape import metric_value
from vllm_helpers import ENV, prompt_tokens, reference_tokens

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.bus import Bus
from crescent.common.codec import decode
from crescent.common.etcd import connect_etcd
from crescent.common.hashing import block_hashes
from crescent.common.hf_tokenizer import HfTokenizer
from crescent.common.messages import InstanceInfo
from crescent.common.naming import Keys, Subjects
from crescent.common.ports import free_port
from crescent.common.store_messages import EvictBlocks, EvictReply
from crescent.conductor.policy.policies import POLICIES, KvCentricPolicy

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(900)]

BLOCK_SIZE = 64
MAX_TOKENS = 8
PREFILL_NODE, DECODE_NODE = "node-prefill-0", "node-decode-0"
BASELINES = [name for name in POLICIES if name != KvCentricPolicy.name]


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory, tiny_model_dir):
    """conductor-0 runs kv-centric (the default); conductor-<policy> runs each baseline.
    vLLM's own prefix cache is off, so every reused token comes from a store."""
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("vllm-planned-pull"),
        api_port=free_port(),
        engine="vllm",
        model_dir=tiny_model_dir,
        env=ENV,
        node_per_instance=True,
        block_size=BLOCK_SIZE,
        engine_args=["--no-vllm-prefix-caching", "--kv-transports", "tcp"],
        store_args=["--transports", "tcp"],
        store_dram_bytes=64 << 20,
        store_ssd_bytes=64 << 20,
        conductor_args=["--hot-spot-period-s", "0"],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=300)
    try:
        for policy in BASELINES:
            baseline = cluster.conductor_spec(f"conductor-{policy}", free_port())
            baseline.argv += ["--policy", policy, "--hot-spot-period-s", "0"]
            cluster.add_process(baseline)
            cluster.conductor_ports.append(baseline.port)
        cluster.wait_serving(120)
        yield cluster
    finally:
        cluster.stop()


async def store_url(cluster: LocalCluster, node: str) -> str:
    etcd = await connect_etcd(cluster.etcd_url)
    try:
        entry = await etcd.get(
            Keys(cluster.spec.cluster).instance("store", f"store-{node}").encode()
        )
        return decode(entry.value, InstanceInfo).http_url
    finally:
        await etcd.close()


def metrics_of(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        return response.read().decode()


def pulled_blocks(url: str) -> float:
    """Blocks the store at `url` copied from the decode node's, whoever asked."""
    text = metrics_of(url)
    return sum(
        metric_value(
            text, "crescent_store_replicated_blocks_total", reason=reason, source=DECODE_NODE
        )
        for reason in ("on-demand", "hot-spot", "unspecified")
    )


def transfer_bytes(url: str, engine: str, side: str) -> dict[str, float]:
    """transport → bytes `engine` moved on `side` (client: its own batches; served: its peers'),
    from the /metrics at `url`."""
    text = metrics_of(url)
    return {
        transport: metric_value(
            text, "crescent_transfer_bytes_total", engine=engine, transport=transport, side=side
        )
        for transport in ("shm", "tcp")
    }


def moved_bytes(url: str, engine: str) -> dict[str, float]:
    return transfer_bytes(url, engine, "client")


def served_bytes(url: str, engine: str) -> dict[str, float]:
    return transfer_bytes(url, engine, "served")


async def blocks_on(session: aiohttp.ClientSession, conductor_url: str, node: str) -> int:
    async with session.get(f"{conductor_url}/v1/cluster") as response:
        return (await response.json())["blocks_by_node"].get(node, 0)


async def evict_from_prefill_node(
    cluster: LocalCluster, session: aiohttp.ClientSession, model: str, hashes: list[bytes]
) -> None:
    """Drop the prefix from the prefill node's store and wait until both conductors know."""
    before = [await blocks_on(session, url, PREFILL_NODE) for url in cluster.conductor_urls]
    bus = await Bus.connect(cluster.nats_url, "test-evict")
    try:
        reply = await bus.request(
            Subjects(cluster.spec.cluster).store_ctl(PREFILL_NODE),
            EvictBlocks(model=model, hashes=hashes),
            EvictReply,
            10,
        )
    finally:
        await bus.drain()
    assert len(reply.evicted) == len(hashes), reply
    deadline = time.monotonic() + 10
    for url, count in zip(cluster.conductor_urls, before):
        while await blocks_on(session, url, PREFILL_NODE) != count - len(hashes):
            assert time.monotonic() < deadline, f"{url} never saw the eviction"
            await asyncio.sleep(0.05)


async def complete(
    session: aiohttp.ClientSession, conductor_url: str, model: str, prompt: list[int]
) -> str:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
    }
    async with session.post(f"{conductor_url}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        return (await response.json())["choices"][0]["text"]


async def test_only_the_planned_pull_happens_and_every_policy_answers_as_plain_vllm(
    two_node_cluster, tiny_model_dir, reference
):
    cluster = two_node_cluster
    kv_centric, *baselines = cluster.conductor_urls
    model = tiny_model_dir.name
    prefix = prompt_tokens(768, seed=900)
    seed, pulled, *computed = (
        prefix + prompt_tokens(60 + 10 * i, seed=901 + i) for i in range(2 + len(baselines))
    )
    tokenizer = HfTokenizer(tiny_model_dir)
    want = [
        tokenizer.decode(tokens)
        for tokens in reference_tokens(reference, [seed, pulled, *computed], MAX_TOKENS)
    ]
    prefix_hashes = block_hashes(prefix, BLOCK_SIZE, model)
    prefill_store = await store_url(cluster, PREFILL_NODE)

    async with aiohttp.ClientSession() as session:
        # The first request computes the prefix; prefill saves it to both nodes' stores.
        assert await complete(session, kv_centric, model, seed) == want[0]
        # Its saves reached the decode node's store over tcp (a mapped copy counts nowhere).
        saved = served_bytes(await store_url(cluster, DECODE_NODE), "store")
        assert saved["tcp"] > 0, f"the decode node's store served no tcp: {saved}"
        await evict_from_prefill_node(cluster, session, model, prefix_hashes)
        before = pulled_blocks(prefill_store)
        moved_before = moved_bytes(prefill_store, "store")

        # kv-centric: the prefix is on the decode node only, so the plan pulls it, over tcp.
        assert await complete(session, kv_centric, model, pulled) == want[1]
        assert pulled_blocks(prefill_store) == before + len(prefix_hashes)
        moved = moved_bytes(prefill_store, "store")
        assert moved["shm"] == moved_before["shm"], moved
        assert moved["tcp"] > moved_before["tcp"], moved

        # No baseline plans a pull: the prefill node computes the prompt, nothing moves.
        for url, prompt, text in zip(baselines, computed, want[2:]):
            await evict_from_prefill_node(cluster, session, model, prefix_hashes)
            assert await complete(session, url, model, prompt) == text, url
            assert pulled_blocks(prefill_store) == before + len(prefix_hashes), url
