"""What the store's integration tests share: store processes on the test's NATS and etcd,
clients, test blocks and waits with deadlines."""

import asyncio
import os
import sys
import time

from crescent.cluster.processes import ManagedProcess, ProcessSpec
from crescent.common.hashing import block_hashes
from crescent.storeclient.client import StoreClient

BLOCK = 64 << 10
MODEL = "m"


class Stores:
    def __init__(self, infra, cluster, tmp_path):
        self.infra, self.cluster, self.tmp_path = infra, cluster, tmp_path
        self.processes: dict[str, ManagedProcess] = {}

    def start(
        self, node: str, dram_blocks: int = 16, ssd_blocks: int = 0, *extra: str
    ) -> ManagedProcess:
        argv = [
            sys.executable,
            "-m",
            "crescent.store",
            "--cluster",
            self.cluster,
            "--nats-url",
            self.infra.nats_url,
            "--etcd-url",
            self.infra.etcd_url,
            "--node",
            node,
            "--instance-id",
            f"store-{node}",
            "--lease-ttl-s",
            "2",
            "--block-bytes",
            str(BLOCK),
            "--dram-bytes",
            str(dram_blocks * BLOCK),
            *extra,
        ]
        if ssd_blocks:
            argv += [
                "--ssd-path",
                str(self.tmp_path / f"{node}.ssd"),
                "--ssd-bytes",
                str(ssd_blocks * BLOCK),
            ]
        process = self.processes.get(node) or ManagedProcess(
            ProcessSpec(name=f"store-{node}", argv=argv), self.tmp_path / "logs"
        )
        process.spec.argv = argv
        process.start()
        self.processes[node] = process
        return process

    def stop_all(self):
        for process in self.processes.values():
            process.stop()


async def wait_until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout_s}s")
        await asyncio.sleep(0.05)


async def wait_for_segment(client: StoreClient, node: str):
    await wait_until(lambda: node in client.directory.nodes(), 20, f"store on {node}")


async def wait_serving(store: ManagedProcess):
    """The store registered and serving. Its segment is in etcd before it registers, so a test
    that stops etcd once the segment shows would stop a store still starting (which then
    stops without draining)."""
    await wait_until(
        lambda: '"msg": "serving"' in store.log_path.read_text(), 20, f"{store.spec.name} serving"
    )


def blocks(n: int, seed: int = 0) -> tuple[list[bytes], list[bytes]]:
    hashes = block_hashes(list(range(seed, seed + 4 * n)), 4, MODEL)
    return hashes, [os.urandom(BLOCK) for _ in range(n)]


async def read_back(client, node, hashes, layer=None, num_layers=1):
    size = BLOCK // num_layers if layer is not None else BLOCK
    out = [bytearray(size) for _ in hashes]
    count = await client.get_blocks(MODEL, node, hashes, out, layer=layer, num_layers=num_layers)
    return count, [bytes(b) for b in out[:count]]
