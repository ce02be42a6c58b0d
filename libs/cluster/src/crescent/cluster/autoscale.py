"""`crescent up --autoscale`: run as many prefill and decode processes as the conductor's P/D
ratio controller asks for.

The conductor decides (conductor/autoscale.py) and writes DesiredInstances under
autoscale/<model> in etcd; this reads that key every poll and acts: a missing worker is started
under a new id, a surplus one is drained: SIGTERM, after which it refuses new work, finishes
what it holds (or hands it to another instance at its own drain deadline) and exits. One that
has not exited by its stop timeout is killed. Pure bookkeeping apart from the etcd read and the
processes, called from `crescent up`'s main thread like `LocalCluster.supervise`.
"""

from __future__ import annotations

import base64
import json
import logging
import signal
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from crescent.cluster.local import LocalCluster
from crescent.cluster.processes import ManagedProcess
from crescent.common.codec import decode
from crescent.common.errors import MessageError
from crescent.common.messages import DesiredInstances
from crescent.common.naming import Keys

log = logging.getLogger(__name__)

ROLES = ("prefill", "decode")
READ_TIMEOUT_S = 2.0


def read_desired(
    etcd_url: str, key: str, timeout_s: float = READ_TIMEOUT_S
) -> DesiredInstances | None:
    """The DesiredInstances under `key` (etcd's JSON gateway); None if absent or unreadable."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    request = urllib.request.Request(
        f"{etcd_url}/v3/kv/range", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            found = json.load(response).get("kvs", [])
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log.warning("cannot read the desired instances from etcd: %s", exc)
        return None
    if not found:
        return None
    try:
        return decode(base64.b64decode(found[0]["value"]), DesiredInstances)
    except (MessageError, KeyError, ValueError) as exc:
        log.warning("ignoring a malformed %s: %s", key, exc)
        return None


@dataclass(frozen=True)
class WorkerBounds:
    """What `crescent up` itself allows, whatever the key says (the conductor has the same)."""

    min_prefill: int
    max_prefill: int
    min_decode: int
    max_decode: int

    def clamp(self, role: str, count: int) -> int:
        low, high = (
            (self.min_prefill, self.max_prefill)
            if role == "prefill"
            else (self.min_decode, self.max_decode)
        )
        return min(max(count, low), high)


class Autoscaler:
    def __init__(self, cluster: LocalCluster, model: str, bounds: WorkerBounds) -> None:
        self.cluster = cluster
        self.model = model
        self.bounds = bounds
        self._key = Keys(cluster.spec.cluster).autoscale(model)
        self._draining: dict[str, float] = {}  # process name → when it is killed if still running
        self._next_index = {role: len(cluster.workers(role)) for role in ROLES}
        self.num_started = {role: 0 for role in ROLES}
        self.num_drained = {role: 0 for role in ROLES}

    def serving(self, role: str) -> list[ManagedProcess]:
        """Workers of `role` that are not being drained, oldest first."""
        return [p for p in self.cluster.workers(role) if p.spec.name not in self._draining]

    def poll(self) -> None:
        """Read the desired counts and start or drain workers to match; reap drained ones."""
        self._reap(time.monotonic())
        desired = read_desired(self.cluster.etcd_url, self._key)
        if desired is None:
            return
        for role in ROLES:
            want = self.bounds.clamp(role, getattr(desired, role))
            serving = self.serving(role)
            for _ in range(want - len(serving)):
                self._start(role, desired.reason)
            for process in reversed(serving[want:]):  # the newest go first
                self._drain(process, desired.reason)

    def _start(self, role: str, reason: str) -> None:
        instance_id = f"{role}-{self._next_index[role]}"
        self._next_index[role] += 1
        log.info("autoscale: starting %s (%s)", instance_id, reason)
        self.cluster.add_process(self.cluster.worker_spec(role, instance_id))
        self.num_started[role] += 1

    def _drain(self, process: ManagedProcess, reason: str) -> None:
        log.info("autoscale: draining %s (%s)", process.spec.name, reason)
        process.terminate()
        self._draining[process.spec.name] = time.monotonic() + process.spec.stop_timeout_s

    def _reap(self, now: float) -> None:
        for name, kill_at in list(self._draining.items()):
            process = self.cluster.process(name)
            if process.is_running and now < kill_at:
                continue
            if process.is_running:
                log.warning(
                    "autoscale: %s still running %.0fs after SIGTERM; killing it",
                    name,
                    process.spec.stop_timeout_s,
                )
                process.signal(signal.SIGKILL)
                process.popen.wait(5)
            log.info("autoscale: %s drained (exit code %s)", name, process.popen.returncode)
            self.num_drained[name.split("-")[0]] += 1
            del self._draining[name]
            self.cluster.remove_process(process)
