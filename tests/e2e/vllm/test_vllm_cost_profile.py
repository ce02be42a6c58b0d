"""A vLLM worker measures its engine at start, publishes the fitted profile under its lease in
etcd, and keeps it for the next start on the same model, dtype and hardware."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from vllm_helpers import ENV, MODEL

from crescent.cluster.processes import ManagedProcess, ProcessSpec
from crescent.common.codec import decode
from crescent.common.cost_profile import CostProfile, check_profile
from crescent.common.etcd import connect_etcd
from crescent.common.naming import Keys

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(600)]


def prefill_worker(infra, cluster: str, tmp_path, model_dir, profile_dir) -> ManagedProcess:
    argv = [
        sys.executable,
        "-m",
        "crescent.prefill",
        "--cluster",
        cluster,
        "--nats-url",
        infra.nats_url,
        "--etcd-url",
        infra.etcd_url,
        "--instance-id",
        "prefill-p",
        "--engine",
        "vllm",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL,
        "--block-size",
        "64",
        "--vllm-kv-cache-gib",
        "1",
        "--no-vllm-connector",
        "--cost-profile-dir",
        str(profile_dir),
        "--log-format",
        "text",
    ]
    process = ManagedProcess(
        ProcessSpec(name="prefill-p", argv=argv, env=ENV, stop_timeout_s=30), tmp_path / "logs"
    )
    process.start()
    return process


async def published_profile(
    infra, cluster: str, process: ManagedProcess, timeout_s: float, newer_than: int = 0
) -> tuple[CostProfile, int]:
    """The profile `process` published and its etcd revision: one written after revision
    `newer_than` (a stopped worker's key may outlive it until its lease expires)."""
    etcd = await connect_etcd(infra.etcd_url)
    key = Keys(cluster).cost("prefill", "prefill-p").encode()
    try:
        deadline = time.monotonic() + timeout_s
        while (entry := await etcd.get(key)) is None or entry.mod_revision <= newer_than:
            assert process.is_running, process.log_tail()
            assert time.monotonic() < deadline, "no profile published"
            await asyncio.sleep(0.5)
        return decode(entry.value, CostProfile), entry.mod_revision
    finally:
        await etcd.close()


async def revision_left(infra, cluster: str, seen: int) -> int:
    """The revision a stopped worker's profile key was last written at (`seen` when its lease
    was revoked, deleting the key): a worker may put its keys again, under a new lease, when a
    long start let the first lease lapse, so the revision read while it ran is not its last."""
    etcd = await connect_etcd(infra.etcd_url)
    try:
        entry = await etcd.get(Keys(cluster).cost("prefill", "prefill-p").encode())
    finally:
        await etcd.close()
    return seen if entry is None else max(seen, entry.mod_revision)


async def test_worker_publishes_a_fitted_profile_and_keeps_it(
    infra, cluster_name, tmp_path, tiny_model_dir
):
    profile_dir = tmp_path / "profiles"
    worker = prefill_worker(infra, cluster_name, tmp_path, tiny_model_dir, profile_dir)
    try:
        measured, revision = await published_profile(infra, cluster_name, worker, 400)
    finally:
        worker.stop()
    revision = await revision_left(infra, cluster_name, revision)
    check_profile(measured, MODEL)
    assert measured.source == "measured" and measured.dtype == "float32" and measured.hardware
    assert measured.prefill_s(1024) > measured.prefill_s(128) > 0
    assert measured.prefill_s(1024, 896) < measured.prefill_s(1024)  # a cached prefix is cheaper
    assert measured.decode_step_s(4, 2048) > 0
    [stored] = list(profile_dir.iterdir())

    again = prefill_worker(infra, cluster_name, tmp_path, tiny_model_dir, profile_dir)
    try:
        reused, _ = await published_profile(infra, cluster_name, again, 300, revision)
    finally:
        again.stop()
    assert reused.source == "stored" and reused.prefill == measured.prefill
    assert list(profile_dir.iterdir()) == [stored]
