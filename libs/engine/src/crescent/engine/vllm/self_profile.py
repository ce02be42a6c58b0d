"""A vLLM worker measures its own engine at start: a few seconds on the tiny model.

Prefill: prompts of 128 to 2,048 tokens (those the engine takes), each with nothing cached and
with a cached prefix p (run first, so vLLM's prefix cache, or the store through the connector,
holds it); the sample records the prefix the engine really reused. Each timed prompt saves its
new blocks to this node's store, as a prefill job does: a job's compute time includes
snapshotting them (the writes and commits run beside the model). Decode: median time
between tokens of a batch of b requests with c context tokens each (c up to 2,048). Both
fitted with non-negative costs (cost_profile). Prompts are random, so workers profiling at
once never find each other's blocks in a store.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import platform
import random
import statistics
import time

from crescent.common.cost_profile import CostProfile, fit_decode, fit_prefill
from crescent.common.messages import SamplingParams
from crescent.engine.settings import EngineSettings

log = logging.getLogger(__name__)

PREFILL_LENGTHS = (128, 512, 1024, 2048)
CACHED_SHARES = (0.0, 0.5, 0.875)
DECODE_BATCHES = (1, 4)
# Up to the prompts a decode batch holds: a per-context-token slope fitted on contexts of
# 128 and 512 alone is extrapolated far beyond them (a burst's batch holds ~20,000 tokens).
DECODE_CONTEXTS = (128, 512, 2048)
DECODE_STEPS = 8
REPEATS = 3  # the fastest of these counts: other processes share this machine's cores


def hardware_name() -> str:
    """What the profile was measured on: the accelerator if there is one, else the CPU."""
    try:
        import torch

        if torch.cuda.is_available():
            return f"cuda-{torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in info if line.startswith("model name")),
                cpu,
            )
    except OSError:
        pass
    return f"cpu-{cpu}"


class _Prompts:
    def __init__(self) -> None:
        self._rng = random.Random()  # seeded from the OS: unlike any other worker's prompts
        self._count = 0

    def fresh(self, length: int) -> list[int]:
        return [self._rng.randrange(3, 1003) for _ in range(length)]

    def request_id(self, kind: str) -> str:
        self._count += 1
        return f"profile-{kind}-{self._count}-{self._rng.getrandbits(32):08x}"


async def _prefill_sample(
    engine, prompts: _Prompts, n: int, p: int, warm_to: list[str], save_to: list[str]
) -> tuple[int, int, float]:
    best: tuple[int, int, float] | None = None
    for _ in range(REPEATS):
        prompt = prompts.fresh(n)
        if p:
            await engine.prefill(prompt[:p], request_id=prompts.request_id("warm"), save_to=warm_to)
        started = time.perf_counter()
        output = await engine.prefill(
            prompt, request_id=prompts.request_id("prefill"), save_to=save_to
        )
        sample = (n, output.num_cached_tokens, time.perf_counter() - started)
        if best is None or sample[2] < best[2]:
            best = sample
    return best


async def _decode_sample(
    engine, prompts: _Prompts, batch: int, context: int
) -> tuple[int, int, float]:
    """The median time per token between outputs once every request of the batch is running.
    vLLM may deliver several tokens in one output: a gap counts per token it brought. On a busy
    machine a request can start after the others have finished; then every gap counts, and if
    every output came at once, the whole run per token (an over-estimate: it holds the prefill)."""
    arrivals: list[list[tuple[float, int]]] = [[] for _ in range(batch)]
    sampling = SamplingParams(ignore_eos=True)

    async def one(i: int) -> None:
        async for step in engine.generate(
            prompts.request_id("decode"), prompts.fresh(context), 5, DECODE_STEPS, sampling=sampling
        ):
            arrivals[i].append((time.perf_counter(), len(step.token_ids)))

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(batch)))
    elapsed = time.perf_counter() - started
    joined = max(
        times[0][0] for times in arrivals if times
    )  # every request is in the batch from here on

    def per_token_gaps(since: float) -> list[float]:
        return [
            (b - a) / num_tokens
            for times in arrivals
            for (a, _), (b, num_tokens) in itertools.pairwise(times)
            if a >= since and num_tokens
        ]

    gaps = per_token_gaps(joined) or per_token_gaps(0.0) or [elapsed / DECODE_STEPS]
    return batch, batch * context, statistics.median(gaps)


async def measure_profile(
    engine, settings: EngineSettings, dtype: str, hardware: str
) -> CostProfile:
    started = time.monotonic()
    prompts = _Prompts()
    # Without vLLM's own prefix cache the prefix can only come from the store: put it there.
    warm_to = (
        [settings.node] if settings.vllm_connector and not settings.vllm_prefix_caching else []
    )
    # A job saves its new blocks (to the decode node's store and its own): so does the sample.
    save_to = [settings.node] if settings.vllm_connector else []
    limit = engine.max_model_len - DECODE_STEPS - 1
    await engine.prefill(prompts.fresh(64), request_id=prompts.request_id("warm-up"))
    prefill = []
    for n in (length for length in PREFILL_LENGTHS if length <= limit):
        for share in CACHED_SHARES:
            p = int(n * share) // settings.vllm_block_size * settings.vllm_block_size
            prefill.append(await _prefill_sample(engine, prompts, n, p, warm_to, save_to))
    decode = [
        await _decode_sample(engine, prompts, b, c)
        for b in DECODE_BATCHES
        for c in DECODE_CONTEXTS
        if c <= limit
    ]
    profile = CostProfile(
        model=settings.model_name,
        prefill=fit_prefill(prefill),
        decode=[fit_decode(decode)],
        dtype=dtype,
        hardware=hardware,
        source="measured",
    )
    log.info(
        "engine profiled",
        extra={
            "seconds": round(time.monotonic() - started, 2),
            "prefill": str(profile.prefill),
            "decode": str(profile.decode[0]),
            "num_samples": len(prefill) + len(decode),
        },
    )
    return profile
