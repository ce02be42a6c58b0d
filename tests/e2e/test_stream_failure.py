"""A stream that cannot go on (its decode instance died and none took it over in time) ends with
an error event after its 200, and the conductor counts it as an error, not as served: replay
clients such as aiperf count such a stream a success, so the conductor's count is the one that
tells."""

import json
import signal

import aiohttp
import pytest
from scrape import metric

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"


@pytest.fixture
def cluster(tmp_path):
    spec = ClusterSpec(
        workdir=tmp_path,
        api_port=free_port(),
        engine_args=["--emulated-time-scale", "0.5"],
        conductor_args=["--placement-wait-s", "1"],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


async def test_a_stream_that_fails_midway_is_counted_as_an_error(cluster):
    body = {"model": MODEL, "prompt": "a long answer", "max_tokens": 400, "stream": True}
    events = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async with session.post(f"{cluster.api_url}/v1/completions", json=body) as response:
            assert response.status == 200
            await response.content.readline()
            cluster.process("decode-0").signal(signal.SIGKILL)  # not restarted: nothing calls
            async for line in response.content:  # the supervisor in this test
                line = line.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[len("data: ") :]))
    assert "error" in events[-1], events[-1]
    requests = "crescent_requests_total"
    assert metric(cluster.api_url, requests, endpoint="completions", outcome="error") == 1
    assert metric(cluster.api_url, requests, endpoint="completions", outcome="ok") == 0
