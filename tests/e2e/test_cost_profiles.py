"""Measured costs and the closed loop on emulated clusters of real processes.

Each worker publishes a cost profile in etcd; the conductor prices each instance with the
profile it published (a slower profile → a request the TTFT SLO now rejects), and corrects it
online when the engine runs slower than its profile says. A profile that does not fit is
refused at start.
"""

import asyncio
import subprocess
import sys

import aiohttp
import msgspec
import pytest

from crescent.bench.replay.prediction_errors import prediction_error_report, scrape_once
from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.codec import decode
from crescent.common.cost_profile import CostProfile, DecodePlane, PrefillCost
from crescent.common.etcd import connect_etcd
from crescent.common.naming import Keys
from crescent.common.ports import free_port
from crescent.engine.costs import emulated_profile
from crescent.engine.settings import EngineSettings

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
PROMPT = "Tell me how the cost of a prefill grows with the prompt. " * 36  # 2,052 bytes: tokens


def write_profile(path, profile: CostProfile):
    path.write_bytes(msgspec.json.encode(profile))
    return str(path)


def fast_profile() -> CostProfile:
    return CostProfile(
        model=MODEL,
        prefill=PrefillCost(base_s=0.001, per_token_s=1e-6),
        decode=[DecodePlane(base_s=0.002)],
        source="file",
    )


def emulated_at(time_scale: float) -> CostProfile:
    settings = EngineSettings(emulated_time_scale=time_scale)
    return emulated_profile(settings.cost_model(), MODEL)


def start_cluster(tmp_path, engine_args: list[str], conductor_args: list[str] = ()) -> LocalCluster:
    spec = ClusterSpec(
        workdir=tmp_path,
        api_port=free_port(),
        engine_args=engine_args,
        conductor_args=list(conductor_args),
        store_dram_bytes=64 << 20,
        store_ssd_bytes=64 << 20,
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=90)
    return cluster


async def complete(session, cluster, prompt: str, max_tokens: int = 8) -> tuple[int, dict]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
    async with session.post(f"{cluster.api_url}/v1/completions", json=body) as response:
        return response.status, await response.json()


async def pricing_of(session, cluster, instance_id: str) -> dict:
    async with session.get(f"{cluster.api_url}/v1/cluster") as response:
        body = await response.json()
    return next(i["pricing"] for i in body["instances"] if i["instance_id"] == instance_id)


async def median_errors(cluster) -> dict[tuple[str, str], float]:
    """(kind, prediction) → median relative error of the conductor's predictions so far."""
    report = prediction_error_report(None, await scrape_once(cluster.api_url))
    return {
        (kind, prediction): row["median_abs_err"]
        for kind, rows in report.items()
        for prediction, row in rows.items()
    }


async def test_conductor_prices_each_instance_with_the_profile_it_published(tmp_path):
    fast = write_profile(tmp_path / "fast.json", fast_profile())
    slow_profile = msgspec.structs.replace(fast_profile(), prefill=PrefillCost(base_s=60.0))
    slow = write_profile(tmp_path / "slow.json", slow_profile)
    cluster = start_cluster(
        tmp_path / "cluster",
        ["--emulated-time-scale", "0.01", "--cost-profile", fast],
        ["--ttft-slo-s", "5", "--no-cost-correction"],
    )
    try:
        etcd = await connect_etcd(cluster.etcd_url)
        try:
            entry = await etcd.get(Keys(cluster.spec.cluster).cost("prefill", "prefill-0").encode())
        finally:
            await etcd.close()
        assert decode(entry.value, CostProfile).prefill == fast_profile().prefill
        async with aiohttp.ClientSession() as session:
            status, body = await complete(session, cluster, PROMPT)
            assert status == 200, body
            assert (await pricing_of(session, cluster, "prefill-0"))["source"] == "file"

            prefill = cluster.process(
                "prefill-0"
            )  # the same instance, now publishing a slow profile
            prefill.stop()
            prefill.spec.argv[prefill.spec.argv.index(fast)] = slow
            prefill.start()
            cluster.wait_serving(60)
            for _ in range(100):  # until the conductor has the new profile
                status, body = await complete(session, cluster, PROMPT)
                if status == 429:
                    break
                await asyncio.sleep(0.1)
        assert status == 429, body
        assert "predicted TTFT" in body["error"]["message"]
    finally:
        cluster.stop()


@pytest.mark.parametrize(
    "problem, profile, message",
    [
        (
            "negative",
            msgspec.structs.replace(fast_profile(), prefill=PrefillCost(per_token_s=-1e-6)),
            "prefill.per_token_s is -1e-06",
        ),
        (
            "wrong-model",
            msgspec.structs.replace(fast_profile(), model="llama-70b"),
            "it is a profile of model 'llama-70b', not 'crescent-emulated'",
        ),
    ],
)
def test_a_profile_that_does_not_fit_is_refused_at_start(
    infra, cluster_name, tmp_path, problem, profile, message
):
    path = write_profile(tmp_path / f"{problem}.json", profile)
    argv = [
        sys.executable,
        "-m",
        "crescent.prefill",
        "--cluster",
        cluster_name,
        "--nats-url",
        infra.nats_url,
        "--etcd-url",
        infra.etcd_url,
        "--instance-id",
        "prefill-bad",
        "--cost-profile",
        path,
    ]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "cost profile refused" in done.stderr and message in done.stderr, done.stderr[-2000:]


async def test_correction_learns_an_engine_slower_than_its_profile(tmp_path):
    """The engine runs at time scale 0.3, its published profile says 0.1: every published
    prediction is a third of the truth; the corrected ones close in on it."""
    profile = write_profile(tmp_path / "optimistic.json", emulated_at(0.1))
    cluster = start_cluster(
        tmp_path / "cluster", ["--emulated-time-scale", "0.3", "--cost-profile", profile]
    )
    try:
        async with aiohttp.ClientSession() as session:
            for i in range(12):
                status, body = await complete(session, cluster, f"{i:03d} " + PROMPT, max_tokens=16)
                assert status == 200, body
            errors = await median_errors(cluster)
            prefill_pricing = await pricing_of(session, cluster, "prefill-0")
            decode_pricing = await pricing_of(session, cluster, "decode-0")
    finally:
        cluster.stop()
    assert errors[("ttft", "published")] > 0.5  # a third of the truth: |1/3 − 1| = 2/3
    assert errors[("ttft", "corrected")] < 0.5 * errors[("ttft", "published")]
    assert errors[("tbt", "corrected")] < 0.5 * errors[("tbt", "published")]
    assert 2.0 < prefill_pricing["ratios"]["prefill"] < 4.0
    # A token's trip to the client (NATS, the relay) adds to the engine's step: more than 3×.
    assert decode_pricing["ratios"]["decode"] > 2.0
