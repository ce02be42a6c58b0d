"""The supervisor on real processes: every crash of a service is restarted, and shared memory
that killed processes leave behind is swept when the cluster stops and when it starts again."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
import pytest
from expected import expected_text

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.cluster.restarts import Backoff
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"


def spec(tmp_path) -> ClusterSpec:
    return ClusterSpec(
        workdir=tmp_path,
        api_port=free_port(),
        engine_args=["--emulated-time-scale", "0.05"],
        restart_backoff=Backoff(first_s=0.1, max_s=0.8),
    )


def serves_correctly(cluster: LocalCluster, prompt: str) -> bool:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 6}).encode()
    request = urllib.request.Request(
        f"{cluster.api_url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)["choices"][0]["text"] == expected_text(prompt, 6)
    except (urllib.error.URLError, OSError):
        return False


def shm_files(pid: int) -> set[str]:
    return {
        f.path for f in psutil.Process(pid).open_files() if f.path.startswith("/dev/shm/crescent-")
    }


def test_a_service_killed_five_times_is_restarted_each_time(tmp_path):
    cluster = LocalCluster(spec(tmp_path))
    cluster.start(timeout_s=60)
    try:
        prefill = cluster.process("prefill-0")
        for crash in range(1, 6):
            killed_pid = prefill.pid
            prefill.signal(signal.SIGKILL)
            prefill.popen.wait(5)
            deadline = time.monotonic() + 30
            while not (prefill.is_running and serves_correctly(cluster, f"after crash {crash}")):
                assert time.monotonic() < deadline, f"not serving again after crash {crash}"
                cluster.supervise()
                time.sleep(0.1)
            assert prefill.pid != killed_pid
        assert prefill.num_starts == 6
    finally:
        cluster.stop()


def test_shared_memory_of_killed_processes_is_swept_at_stop_and_at_the_next_start(tmp_path):
    cluster = LocalCluster(spec(tmp_path))
    cluster.start(timeout_s=60)
    try:
        assert serves_correctly(cluster, "before the kill")
        killed = [cluster.process("prefill-0"), cluster.process("store-node0")]
        left_behind = set().union(*(shm_files(p.pid) for p in killed))
        # The store's DRAM pool (a worker's store client has shm of its own only to stage rdma).
        assert left_behind
        for process in killed:
            process.signal(signal.SIGKILL)
            process.popen.wait(5)
        assert all(os.path.exists(path) for path in left_behind), "a killed process unlinks nothing"
    finally:
        cluster.stop()
    assert not any(os.path.exists(path) for path in left_behind)

    # Memory of a process that died while no cluster was running: the next start sweeps it.
    code = (
        "import os; from crescent.transfer import ShmSegment; "
        "print(ShmSegment.create('x', 1 << 20).shm_name); os._exit(0)"
    )
    created = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    orphan = "/dev/shm/" + created.stdout.strip()
    assert os.path.exists(orphan)
    cluster = LocalCluster(spec(tmp_path))
    cluster.start(timeout_s=60)
    try:
        assert not os.path.exists(orphan)
        assert serves_correctly(cluster, "after a clean start")
    finally:
        cluster.stop()
