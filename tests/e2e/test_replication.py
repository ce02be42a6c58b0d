"""KV-centric scheduling on an emulated cluster whose instances each have a node and a store:
a long shared system prompt is computed once, then reused, and gains replicas on several
prefill nodes by itself (paper §4.2)."""

import asyncio
import time

import aiohttp
import pytest

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.cluster.processes import free_port
from crescent.common.etcd import connect_etcd
from crescent.common.hashing import block_hashes
from crescent.common.naming import Keys
from crescent.common.tokenizer import ByteTokenizer
from expected import expected_text

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
SYSTEM_PROMPT = "You are Crescent's test assistant. Answer briefly and precisely. " * 128  # 8,448 bytes


@pytest.fixture
def cluster(tmp_path):
    spec = ClusterSpec(workdir=tmp_path, api_port=free_port(), num_prefill=4, num_decode=4, node_per_instance=True,
                       engine_args=["--emulated-time-scale", "0.2"], store_dram_bytes=64 << 20,
                       store_ssd_bytes=64 << 20, conductor_args=["--hot-spot-period-s", "0.5"])
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


async def test_shared_system_prompt_is_reused_and_gains_replicas_on_several_prefill_nodes(cluster):
    first_block = block_hashes(ByteTokenizer().encode(SYSTEM_PROMPT), 512, MODEL)[0]
    async with aiohttp.ClientSession() as session:

        async def ask(i: int) -> dict:
            prompt = SYSTEM_PROMPT + f"Question {i}: what is a KV cache?"
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
            async with session.post(f"{cluster.api_url}/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()
                result = await response.json()
            assert result["choices"][0]["text"] == expected_text(prompt, 4)
            return result

        await ask(0)
        first_holders = await holders(cluster, first_block)
        assert any(node.startswith("node-prefill") for node in first_holders)
        for wave in range(4):
            await asyncio.gather(*(ask(100 * wave + i) for i in range(1, 9)))
        deadline = time.monotonic() + 10
        while True:
            prefill_nodes = {n for n in await holders(cluster, first_block) if n.startswith("node-prefill")}
            if len(prefill_nodes) >= 2:
                break
            assert time.monotonic() < deadline, f"the system prompt is only on {prefill_nodes}"
            await asyncio.sleep(0.2)
        async with session.get(f"{cluster.api_url}/v1/cluster") as response:
            view = await response.json()
    # Most prompt tokens were scheduled onto a cached prefix rather than computed.
    assert view["cache_hit_rate"] > 0.5, view["cache_hit_rate"]
