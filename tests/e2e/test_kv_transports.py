"""`--kv-transports` on the emulated engine: the prefill worker's KV takes the named transport
(here tcp, so not even its own node's store is mapped), and its /metrics says which transport
moved the bytes."""

import asyncio
import json
import time
import urllib.request

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("cluster"),
        api_port=free_port(),
        engine_args=["--emulated-time-scale", "0", "--kv-transports", "tcp"],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


def read_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def prefill_kv_bytes(http_url: str) -> dict[str, float]:
    """transport → bytes the prefill's own batches moved (engine="prefill-kv", side="client")."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        s.labels["transport"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "crescent_transfer_bytes_total"
        and s.labels["engine"] == "prefill-kv"
        and s.labels["side"] == "client"
    }


async def test_prefill_kv_moves_over_the_named_transport_and_says_so(cluster):
    (prefill_url,) = [
        i["http_url"]
        for i in read_json(f"{cluster.api_url}/v1/cluster")["instances"]
        if i["role"] == "prefill"
    ]
    before = prefill_kv_bytes(prefill_url)
    body = {"model": "crescent-emulated", "prompt": "x" * 3000, "max_tokens": 2}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{cluster.api_url}/v1/completions", json=body) as response,
    ):
        assert response.status == 200, await response.text()
    deadline = time.monotonic() + 10  # the blocks are written beside the request path
    while True:
        after = prefill_kv_bytes(prefill_url)
        moved = {kind: after.get(kind, 0) - before.get(kind, 0) for kind in after}
        if moved.get("tcp", 0) > 0:
            break
        assert time.monotonic() < deadline, f"no KV over tcp: {after}"
        await asyncio.sleep(0.05)
    assert {kind for kind, num_bytes in moved.items() if num_bytes} == {"tcp"}, moved
