"""`crescent profile --model DIR --json FILE`: measure the real engine and fit the models the
conductor predicts with.

- Prefill: seconds to compute an n-token prompt whose first p tokens are already cached, over a
  grid of (n, p); fitted as a degree-2 polynomial in n and p (the paper's Eq. 1 is one),
  written in the conductor's `crescent.prefill_poly.v1` form (its `--prefill-model` loads the
  file as is).
- Decode: seconds per batch step with `batch` requests of `context` tokens each, fitted as
  linear in the batch size and the batch's total context (`decode` in the same file).

The cached prefix comes from vLLM's own prefix cache (each (n, p) point first runs its p-token
prefix), so the profile is of compute alone; loading from the store adds T_transfer, which the
conductor prices separately.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

from crescent.common.messages import SamplingParams
from crescent.engine.settings import EngineSettings

PREFILL_FORMAT = "crescent.prefill_poly.v1"
DECODE_FORMAT = "crescent.decode_linear.v1"
TERMS = (
    (0, 0),
    (1, 0),
    (0, 1),
    (2, 0),
    (1, 1),
    (0, 2),
)  # nⁱ·pʲ, the conductor's order for degree 2


def fit_prefill(samples: list[tuple[int, int, float]]) -> dict:
    import numpy as np

    scale = float(max(max(n, p) for n, p, _ in samples)) or 1.0
    rows = np.array(
        [[(n / scale) ** i * (p / scale) ** j for i, j in TERMS] for n, p, _ in samples]
    )
    coefficients, *_ = np.linalg.lstsq(rows, np.array([s for _, _, s in samples]), rcond=None)
    return {
        "format": PREFILL_FORMAT,
        "degree": 2,
        "scale": scale,
        "coefficients": [float(c) for c in coefficients],
    }


def fit_decode(samples: list[tuple[int, int, float]]) -> dict:
    """seconds per step ≈ base_s + per_request_s · batch + per_context_token_s · total_context."""
    import numpy as np

    rows = np.array([[1.0, b, c] for b, c, _ in samples])
    (base, per_request, per_token), *_ = np.linalg.lstsq(
        rows, np.array([s for _, _, s in samples]), rcond=None
    )
    return {
        "format": DECODE_FORMAT,
        "base_s": float(base),
        "per_request_s": float(per_request),
        "per_context_token_s": float(per_token),
    }


def _tokens(length: int, seed: int) -> list[int]:
    return [3 + (i * 7919 + seed * 104729) % 1000 for i in range(length)]


class Profiler:
    def __init__(self, engine, repeats: int) -> None:
        self.engine = engine
        self.repeats = repeats
        self._seed = 0

    def _fresh(self, length: int) -> list[int]:
        self._seed += 1
        return _tokens(length, self._seed)

    async def prefill_s(self, n: int, p: int) -> float:
        times = []
        for _ in range(self.repeats):
            prompt = self._fresh(n)
            if p:
                await self.engine.prefill(prompt[:p], request_id=f"warm-{self._seed}")
            started = time.perf_counter()
            await self.engine.prefill(prompt, request_id=f"prefill-{self._seed}")
            times.append(time.perf_counter() - started)
        return min(times)

    async def decode_step_s(self, batch: int, context: int, num_steps: int = 16) -> float:
        prompts = [self._fresh(context) for _ in range(batch)]
        arrivals: list[list[float]] = [[] for _ in range(batch)]
        sampling = SamplingParams(ignore_eos=True)

        async def one(i: int) -> None:
            async for step in self.engine.generate(
                f"decode-{self._seed}-{i}", prompts[i], 5, num_steps, sampling=sampling
            ):
                arrivals[i].append(time.perf_counter())

        await asyncio.gather(*(one(i) for i in range(batch)))
        start = max(a[0] for a in arrivals)  # every request has joined the batch
        gaps = [b - a for times in arrivals for a, b in itertools.pairwise(times) if a >= start]
        return statistics.median(gaps)


async def profile(
    settings: EngineSettings,
    lengths: list[int],
    batches: list[int],
    contexts: list[int],
    repeats: int,
) -> dict:
    from crescent.engine.vllm.engine import VllmEngine

    engine = VllmEngine(settings, "profile", None)
    await engine.start()
    try:
        profiler = Profiler(engine, repeats)
        await profiler.prefill_s(min(lengths), 0)  # warm-up
        prefill = []
        for n in lengths:
            for fraction in (0.0, 0.5, 0.875):
                p = int(n * fraction) // settings.vllm_block_size * settings.vllm_block_size
                prefill.append((n, p, await profiler.prefill_s(n, p)))
        decode = [(b, b * c, await profiler.decode_step_s(b, c)) for b in batches for c in contexts]
    finally:
        await engine.close()
    return {
        **fit_prefill(prefill),
        "decode": fit_decode(decode),
        "model": settings.model,
        "samples": {"prefill": [list(s) for s in prefill], "decode": [list(s) for s in decode]},
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, metavar="DIR", help="local Hugging Face checkpoint (Llama family)"
    )
    parser.add_argument(
        "--json", required=True, metavar="FILE", help="where to write the fitted models"
    )
    parser.add_argument(
        "--lengths", default="256,512,1024,2048", help="prompt lengths n (comma-separated)"
    )
    parser.add_argument("--batches", default="1,4,8", help="decode batch sizes")
    parser.add_argument("--contexts", default="256,1024", help="decode context lengths per request")
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs per prefill point (the fastest counts)"
    )


def run(args: argparse.Namespace) -> int:
    from crescent.common.errors import ConfigError

    def numbers(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x]

    settings = EngineSettings(
        engine="vllm", model=args.model, vllm_connector=False, vllm_prefix_caching=True
    )
    try:
        settings.validate()
        result = asyncio.run(
            profile(
                settings,
                numbers(args.lengths),
                numbers(args.batches),
                numbers(args.contexts),
                args.repeats,
            )
        )
    except ConfigError as exc:
        print(f"crescent profile: error: {exc}", file=sys.stderr)
        return 1
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("coefficients", "decode")}))
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="crescent profile", description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
