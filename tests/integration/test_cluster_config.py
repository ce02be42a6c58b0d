"""The cluster config in etcd: written by the first conductor, read by every service at start;
a service whose flags contradict it refuses to start (or stops, if the config came later)."""

import asyncio
import subprocess
import sys
import time

import pytest

from crescent.cluster.processes import ManagedProcess, ProcessSpec
from crescent.common.bus import Bus
from crescent.common.cluster_config import publish_config
from crescent.common.codec import decode
from crescent.common.errors import NoRespondersError, RemoteError, RequestTimeoutError
from crescent.common.etcd import connect_etcd
from crescent.common.messages import ClusterConfig, PrefillJob, PrefillResult
from crescent.common.naming import Keys, Subjects
from crescent.common.ports import free_port

START_TIMEOUT_S = 30


def argv(infra, cluster: str, role: str, instance_id: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        f"crescent.{role}",
        "--cluster",
        cluster,
        "--nats-url",
        infra.nats_url,
        "--etcd-url",
        infra.etcd_url,
        "--instance-id",
        instance_id,
        "--lease-ttl-s",
        "2",
        "--log-format",
        "text",
        *extra,
    ]


def refused(infra, cluster: str, role: str, *extra: str) -> str:
    """Start a service that must refuse to start; its stderr."""
    done = subprocess.run(
        argv(infra, cluster, role, f"{role}-x", *extra),
        capture_output=True,
        text=True,
        check=False,
        timeout=START_TIMEOUT_S,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    return done.stderr


@pytest.fixture
async def etcd(infra):
    client = await connect_etcd(infra.etcd_url)
    yield client
    await client.close()


async def stored_config(etcd, cluster: str) -> ClusterConfig | None:
    entry = await etcd.get(Keys(cluster).config().encode())
    return None if entry is None else decode(entry.value, ClusterConfig)


async def test_the_first_conductor_writes_the_config_and_a_contradicting_conductor_refuses_to_start(
    infra, cluster_name, tmp_path, etcd
):
    first = ManagedProcess(
        ProcessSpec(
            name="conductor-a",
            argv=argv(
                infra,
                cluster_name,
                "conductor",
                "conductor-a",
                "--http-port",
                str(free_port()),
                "--block-size",
                "256",
                "--tbt-slo-s",
                "0.2",
            ),
        ),
        tmp_path / "logs",
    )
    first.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while (config := await stored_config(etcd, cluster_name)) is None:
            assert first.is_running, first.log_tail()
            assert time.monotonic() < deadline, "no cluster config written"
            await asyncio.sleep(0.1)
        assert (config.block_size, config.ttft_slo_s, config.tbt_slo_s, config.model) == (
            256,
            30.0,
            0.2,
            "",
        )

        stderr = refused(
            infra,
            cluster_name,
            "conductor",
            "--http-port",
            str(free_port()),
            "--block-size",
            "512",
            "--tbt-slo-s",
            "0.2",
        )
        assert "contradicts the cluster config" in stderr
        assert "the cluster's block_size is 256, this service's is 512" in stderr
        assert (await stored_config(etcd, cluster_name)).block_size == 256  # the first one's stays
    finally:
        first.stop()


@pytest.mark.parametrize(
    "role, flags, contradiction",
    [
        (
            "prefill",
            ["--block-size", "64"],
            "the cluster's block_size is 512, this service's is 64",
        ),
        (
            "decode",
            ["--model", "another-model"],
            "the cluster's model is 'crescent-emulated', this service's is 'another-model'",
        ),
    ],
)
async def test_a_worker_whose_flags_contradict_the_config_refuses_to_start(
    infra, cluster_name, etcd, role, flags, contradiction
):
    await publish_config(
        etcd,
        Keys(cluster_name),
        ClusterConfig(block_size=512, ttft_slo_s=30, tbt_slo_s=0.1, model="crescent-emulated"),
    )
    stderr = refused(infra, cluster_name, role, "--emulated-time-scale", "0", *flags)
    assert f"crescent-{role}: error: {role} {role}-x contradicts the cluster config" in stderr
    assert contradiction in stderr


async def test_a_worker_started_before_any_config_stops_when_a_contradicting_one_appears(
    infra, cluster_name, tmp_path, etcd
):
    process = ManagedProcess(
        ProcessSpec(
            name="prefill-early",
            argv=argv(
                infra,
                cluster_name,
                "prefill",
                "prefill-early",
                "--emulated-time-scale",
                "0",
                "--block-size",
                "64",
            ),
        ),
        tmp_path / "logs",
    )
    process.start()
    try:
        registered = Keys(cluster_name).instance("prefill", "prefill-early").encode()
        deadline = time.monotonic() + START_TIMEOUT_S
        while await etcd.get(registered) is None:
            assert time.monotonic() < deadline and process.is_running, process.log_tail()
            await asyncio.sleep(0.1)
        await publish_config(
            etcd, Keys(cluster_name), ClusterConfig(block_size=512, ttft_slo_s=30, tbt_slo_s=0.1)
        )
        assert process.popen.wait(START_TIMEOUT_S) == 1
        assert "the cluster's block_size is 512, this service's is 64" in process.log_tail(50)
    finally:
        process.stop()


async def test_a_job_hashed_with_another_block_size_is_refused(infra, cluster_name, tmp_path):
    process = ManagedProcess(
        ProcessSpec(
            name="prefill-b",
            argv=argv(
                infra,
                cluster_name,
                "prefill",
                "prefill-b",
                "--emulated-time-scale",
                "0",
                "--block-size",
                "64",
            ),
        ),
        tmp_path / "logs",
    )
    process.start()
    bus = await Bus.connect(infra.nats_url, "test-jobs")
    try:
        subject = Subjects(cluster_name).prefill_job("prefill-b")
        job = PrefillJob(
            request_id="r1", model="crescent-emulated", token_ids=[1, 2, 3], block_size=512
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                await bus.request(subject, job, PrefillResult, 5)
            except RemoteError as exc:
                assert (
                    "the job's blocks are 512 tokens, this instance stores 64-token blocks"
                    in str(exc)
                )
                break
            except (NoRespondersError, RequestTimeoutError):  # not serving yet
                assert time.monotonic() < deadline and process.is_running, process.log_tail()
                await asyncio.sleep(0.2)
                continue
            raise AssertionError("a job of another block size was run")
        ok = PrefillJob(
            request_id="r2", model="crescent-emulated", token_ids=[1, 2, 3], block_size=64
        )
        assert (await bus.request(subject, ok, PrefillResult, 5)).num_computed_tokens == 3
    finally:
        await bus.drain()
        process.stop()
