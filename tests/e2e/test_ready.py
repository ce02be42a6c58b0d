"""Readiness vs liveness (issue 12, item 4): the conductor's /ready answers 200 only while it sees
a live prefill and a live decode instance of a served model; /health (liveness) stays 200
whatever the workers do."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request

import pytest

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
DEADLINE_S = 30.0  # stale after 3 telemetry periods; generous for a loaded machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("ready"),
        api_port=free_port(),
        engine_args=["--emulated-time-scale", "0"],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


def get(cluster, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"{cluster.api_url}{path}", timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def listed(cluster) -> list[str]:
    return [model["id"] for model in get(cluster, "/v1/models")[1]["data"]]


def wait_ready(cluster, status: int, live: dict[str, int]) -> None:
    """Until /ready answers `status` with these live instance counts of the model."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        answer = get(cluster, "/ready")
        if answer == (status, {"ready": status == 200, "models": {MODEL: live}}):
            return
        assert time.monotonic() < deadline, answer
        time.sleep(0.1)


def test_ready_only_while_both_roles_are_live(cluster):
    prefill, decode = cluster.process("prefill-0"), cluster.process("decode-0")
    wait_ready(cluster, 200, {"prefill": 1, "decode": 1})

    assert listed(cluster) == [MODEL]
    decode.stop()  # deregisters: gone at once
    wait_ready(cluster, 503, {"prefill": 1, "decode": 0})
    assert listed(cluster) == []  # a model is offered only with a decode to serve it
    assert get(cluster, f"/v1/models/{MODEL}")[0] == 404
    prefill.stop()
    deadline = time.monotonic() + DEADLINE_S
    while get(cluster, "/ready")[0] != 503 or get(cluster, "/v1/models")[1]["data"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert get(cluster, "/health")[0] == 200  # liveness: the conductor itself is fine

    prefill.start()  # one role back is not enough
    wait_ready(cluster, 503, {"prefill": 1, "decode": 0})
    assert listed(cluster) == []
    decode.start()
    wait_ready(cluster, 200, {"prefill": 1, "decode": 1})
    assert listed(cluster) == [MODEL]

    decode.signal(signal.SIGKILL)  # no deregistration: its telemetry stops, so it is not live
    wait_ready(cluster, 503, {"prefill": 1, "decode": 0})
    assert get(cluster, "/health")[0] == 200
