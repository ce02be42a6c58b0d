"""How a vLLM worker measures its engine: what each timed prompt does, and one engine measuring
at a time on a machine (a fake engine: only the sequence of calls matters here)."""

from __future__ import annotations

import asyncio

from crescent.common.cost_profile import CostProfile
from crescent.engine import costs
from crescent.engine.base import DecodeStep, PrefillOutput
from crescent.engine.profile_lock import profile_lock
from crescent.engine.settings import EngineSettings
from crescent.engine.vllm.self_profile import measure_profile


class _Checkpoint:
    dtype = "float32"


class FakeEngine:
    """Records every prefill; the prefix of a prompt counts as cached once it was saved."""

    max_model_len = 8192
    checkpoint = _Checkpoint()

    def __init__(self) -> None:
        self.prefills: list[tuple[int, tuple[str, ...]]] = []
        self.saved: set[tuple[int, ...]] = set()
        self.num_measures = 0

    async def prefill(self, token_ids, request_id, sampling=None, save_to=()):
        self.prefills.append((len(token_ids), tuple(save_to)))
        cached = max(
            (
                len(p)
                for p in self.saved
                if tuple(token_ids[: len(p)]) == p and len(p) < len(token_ids)
            ),
            default=0,
        )
        if save_to:
            self.saved.add(tuple(token_ids))
        await asyncio.sleep(0)
        return PrefillOutput(1, len(token_ids) - cached, cached, 0.0)

    async def generate(self, request_id, token_ids, first_token, max_new_tokens, sampling=None):
        for _ in range(max_new_tokens):
            await asyncio.sleep(0.001)
            yield DecodeStep([7])


def settings(**overrides) -> EngineSettings:
    return EngineSettings(
        engine="vllm", model="/m/tiny", block_size=64, vllm_block_size=16, node="n0", **overrides
    )


async def test_timed_prompts_save_their_blocks_like_a_job_and_reach_2048_tokens():
    engine = FakeEngine()
    profile = await measure_profile(engine, settings(vllm_prefix_caching=False), "float32", "hw")
    assert isinstance(profile, CostProfile)
    lengths = {n for n, _ in engine.prefills}
    assert {128, 512, 1024, 2048} <= lengths
    # Every prompt of a profiled length (warm-ups of a prefix are shorter) saves to this node.
    timed = [save_to for n, save_to in engine.prefills if n in (128, 512, 1024, 2048)]
    assert timed and all(save_to == ("n0",) for save_to in timed)


async def test_without_the_connector_nothing_is_saved():
    engine = FakeEngine()
    await measure_profile(engine, settings(vllm_connector=False), "float32", "hw")
    assert all(save_to == () for _, save_to in engine.prefills)


async def test_engines_sharing_a_profile_directory_measure_one_at_a_time(tmp_path, monkeypatch):
    """The first engine measures and stores; the others wait for it and load what it stored."""
    num_measuring = 0
    most_measuring = 0

    async def measure(engine, settings, dtype, hardware):
        nonlocal num_measuring, most_measuring
        num_measuring += 1
        most_measuring = max(most_measuring, num_measuring)
        engine.num_measures += 1
        profile = await measure_profile(engine, settings, dtype, hardware)
        num_measuring -= 1
        return profile

    monkeypatch.setattr("crescent.engine.vllm.self_profile.measure_profile", measure)
    monkeypatch.setattr("crescent.engine.vllm.self_profile.hardware_name", lambda: "hw")
    engines = [FakeEngine() for _ in range(3)]
    chosen = settings(cost_profile_dir=str(tmp_path))
    profiles = await asyncio.gather(*(costs.resolve_profile(chosen, e) for e in engines))
    assert most_measuring == 1
    assert sum(e.num_measures for e in engines) == 1
    assert sorted(p.source for p in profiles) == ["measured", "stored", "stored"]
    assert len({(p.prefill.base_s, p.prefill.per_token_s) for p in profiles}) == 1
    assert [f.name for f in tmp_path.iterdir()] == ["tiny-float32-hw.json"]  # no lock file


async def test_a_lock_held_too_long_is_given_up_on(tmp_path):
    path = tmp_path / "profiles"
    async with profile_lock(path, timeout_s=1.0) as first:
        async with profile_lock(path, timeout_s=0.3) as second:
            assert first and not second
    async with profile_lock(path, timeout_s=0.3) as again:
        assert again  # released when its holder left
