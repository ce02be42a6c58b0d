"""`crescent up --autoscale` on the emulated engine under a load whose mix shifts from
prefill-heavy (long prompts, one output token) to decode-heavy (short prompts, long answers):
the prefill count goes up first, then the ratio turns to decode (within a budget of three
workers, a prefill is drained to make room), and no request fails on the way."""

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil
import pytest

from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
# TTFT SLO 0.75 s: a 3,000-token prompt prefills for ~0.4 s on the emulated device, so a few in a
# queue miss it. TBT SLO 15 ms: a decode step of a small batch takes ~9-10 ms, so decode runs at
# ~65 % of it while prefill idles (f_im ~1.65); and a decode instance still admits the
# reservations of up to six queued 3,000-token prompts (its own TBT check counts their
# context). No admission control in the conductor: nothing is turned away.
FLAGS = [
    "--engine",
    "emulated",
    "--autoscale",
    "--prefill",
    "1",
    "--decode",
    "1",
    "--max-prefill",
    "2",
    "--max-decode",
    "2",
    "--max-workers",
    "3",
    "--ratio-window-s",
    "1",
    "--conductor-arg=--ratio-persist-windows=2",
    "--conductor-arg=--ratio-cooldown-windows=1",
    "--conductor-arg=--admission=none",
    "--conductor-arg=--ttft-slo-s=0.75",
    "--conductor-arg=--tbt-slo-s=0.015",
]


def workers(up: subprocess.Popen) -> dict[str, int]:
    """Running prefill and decode processes of the cluster (draining ones until they exit)."""
    counts = {"prefill": 0, "decode": 0}
    for child in psutil.Process(up.pid).children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        for role in counts:
            if f"-m crescent.{role} " in cmdline:
                counts[role] += 1
    return counts


class Load:
    """Clients that keep `num_clients` requests of one shape in flight and count outcomes."""

    def __init__(self, api_url: str) -> None:
        self.api_url = api_url
        self.num_ok = 0
        self.failures: list[str] = []
        self._tasks: list[asyncio.Task] = []
        self._is_stopping = False

    def start(
        self, session: aiohttp.ClientSession, prompt_of, max_tokens: int, num_clients: int
    ) -> None:
        self._is_stopping = False
        self._tasks += [
            asyncio.create_task(self._client(session, prompt_of, max_tokens, c))
            for c in range(num_clients)
        ]

    async def stop(self) -> None:
        """Let every request in flight finish, then stop."""
        self._is_stopping = True
        await asyncio.gather(*self._tasks)
        self._tasks = []

    async def _client(self, session, prompt_of, max_tokens: int, client: int) -> None:
        i = 0
        while not self._is_stopping:
            body = {"model": MODEL, "prompt": prompt_of(client, i), "max_tokens": max_tokens}
            async with session.post(f"{self.api_url}/v1/completions", json=body) as response:
                if response.status == 200:
                    self.num_ok += 1
                else:
                    self.failures.append(f"{response.status}: {await response.text()}")
            i += 1


async def until(up, predicate, timeout_s: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while not predicate(counts := workers(up)):
        assert up.poll() is None, "crescent up exited"
        assert time.monotonic() < deadline, f"workers stayed at {counts}"
        await asyncio.sleep(0.5)
    return counts


async def wait_serving(api_url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{api_url}/ready") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, "crescent up did not start serving"
            await asyncio.sleep(0.2)


@pytest.fixture
def autoscaling_up(tmp_path):
    """`crescent up --autoscale` (FLAGS) as a user runs it; yields (process, API URL, its
    output)."""
    port = free_port()
    crescent = Path(sys.executable).parent / "crescent"
    output = tmp_path / "up.log"
    with open(output, "w") as log:
        up = subprocess.Popen(
            [str(crescent), "up", "--port", str(port), "--workdir", str(tmp_path), *FLAGS],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield up, f"http://127.0.0.1:{port}", output
    finally:
        up.terminate()
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()


async def test_instance_counts_follow_the_mix_and_no_request_fails(autoscaling_up):
    up, api_url, output = autoscaling_up
    await wait_serving(api_url)
    assert workers(up) == {"prefill": 1, "decode": 1}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        load = Load(api_url)
        load.start(session, lambda c, i: f"{c:02d}{i:05d} " + "x" * 3000, 1, num_clients=3)
        prefill_heavy = await until(up, lambda n: n["prefill"] == 2, 90)
        await load.stop()
        load.start(session, lambda c, i: f"chat {c} {i}", 300, num_clients=12)
        decode_heavy = await until(up, lambda n: n["decode"] == 2 and n["prefill"] == 1, 120)
        await load.stop()
    assert prefill_heavy == {"prefill": 2, "decode": 1}
    assert decode_heavy == {"prefill": 1, "decode": 2}
    assert load.failures == [] and load.num_ok > 0
    said = output.read_text()
    assert "autoscale: starting prefill-1" in said and "autoscale: draining prefill-" in said, said[
        -3000:
    ]
    assert "autoscale: starting decode-1" in said, said[-3000:]
