"""Cost profiles: fits with non-negative costs, the emulated model exactly, refusals that say
why."""

import random

import msgspec
import pytest

from crescent.common.cost_profile import (
    CostProfile,
    DecodePlane,
    PrefillCost,
    ProfileError,
    check_profile,
    fit_decode,
    fit_prefill,
    load_profile,
    save_profile,
)
from crescent.engine.costs import emulated_profile
from crescent.engine.settings import EngineSettings


def test_prefill_fit_recovers_a_model_with_a_cached_prefix_cost():
    truth = PrefillCost(
        base_s=0.004, per_token_s=2e-5, per_token_pair_s=1e-9, per_cached_token_s=3e-6
    )
    samples = [
        (n, p, truth.seconds(n, p)) for n in (128, 512, 1024) for p in (0, n // 2, 7 * n // 8)
    ]
    fitted = fit_prefill(samples)
    for n, p, seconds in samples:
        assert fitted.seconds(n, p) == pytest.approx(seconds, rel=1e-6)


def test_fits_never_give_a_negative_cost():
    # Noisy timings that an unconstrained fit would explain with a negative per-token cost.
    samples = [
        (128, 0, 0.010),
        (512, 0, 0.009),
        (1024, 0, 0.0105),
        (1024, 512, 0.011),
        (512, 256, 0.0095),
        (128, 64, 0.0101),
    ]
    fitted = fit_prefill(samples)
    assert (
        min(fitted.base_s, fitted.per_token_s, fitted.per_token_pair_s, fitted.per_cached_token_s)
        >= 0
    )
    decode = fit_decode([(1, 128, 0.004), (4, 512, 0.0039), (1, 512, 0.0041), (4, 2048, 0.004)])
    assert min(decode.base_s, decode.per_request_s, decode.per_context_token_s) >= 0
    assert decode.base_s == pytest.approx(0.004, rel=0.05)


def test_emulated_profile_is_the_emulated_cost_model():
    settings = EngineSettings(emulated_time_scale=0.5)
    cost = settings.cost_model()
    profile = emulated_profile(cost, "crescent-emulated")
    for n, p in ((1, 0), (2000, 0), (8000, 4096), (32000, 31000)):
        assert profile.prefill_s(n, p) == pytest.approx(cost.prefill_s(n, p), rel=1e-9)
    for batch, context in (
        (1, 100),
        (8, 64000),
        (200, 10000),
        (400, 8000),
    ):  # memory- and compute-bound
        assert profile.decode_step_s(batch, context) == pytest.approx(
            cost.decode_step_s(batch, context), rel=1e-9
        )
    assert profile.decode_step_s(0, 0) == 0.0


@pytest.mark.parametrize(
    "profile, message",
    [
        (
            CostProfile(
                model="m", prefill=PrefillCost(per_token_s=-1e-6), decode=[DecodePlane(base_s=0.01)]
            ),
            "prefill.per_token_s is -1e-06",
        ),
        (
            CostProfile(
                model="m",
                prefill=PrefillCost(per_token_s=1e-6),
                decode=[DecodePlane(base_s=float("nan"))],
            ),
            "decode[0].base_s is nan",
        ),
        (
            CostProfile(
                model="other",
                prefill=PrefillCost(per_token_s=1e-6),
                decode=[DecodePlane(base_s=0.01)],
            ),
            "profile of model 'other', not 'm'",
        ),
        (
            CostProfile(model="m", prefill=PrefillCost(per_token_s=1e-6), decode=[]),
            "no decode plane",
        ),
    ],
)
def test_unfit_profiles_are_refused_with_the_reason(profile, message):
    with pytest.raises(ProfileError, match="cost profile refused") as caught:
        check_profile(profile, "m")
    assert message in str(caught.value)


def test_a_profile_measured_with_another_dtype_or_hardware_is_refused():
    profile = CostProfile(
        model="m",
        prefill=PrefillCost(per_token_s=1e-6),
        decode=[DecodePlane(base_s=0.01)],
        dtype="bfloat16",
        hardware="cpu-a",
    )
    assert check_profile(profile, "m", "bfloat16", "cpu-a") == profile
    assert check_profile(profile, "m") == profile  # nothing asked: not checked
    with pytest.raises(
        ProfileError, match="measured with dtype 'bfloat16', this engine's is 'float32'"
    ):
        check_profile(profile, "m", "float32", "cpu-a")
    with pytest.raises(
        ProfileError, match="measured with hardware 'cpu-a', this engine's is 'cpu-b'"
    ):
        check_profile(profile, "m", "bfloat16", "cpu-b")
    unnamed = CostProfile(model="m", prefill=profile.prefill, decode=profile.decode)
    assert check_profile(unnamed, "m", "float32", "cpu-b") == unnamed  # written by hand


def test_profile_files_round_trip_and_bad_files_are_refused(tmp_path):
    profile = CostProfile(
        model="m",
        prefill=PrefillCost(base_s=0.01, per_token_s=1e-5),
        decode=[DecodePlane(base_s=0.003)],
        dtype="float32",
        hardware="cpu-x",
    )
    save_profile(tmp_path / "p.json", profile)
    assert load_profile(tmp_path / "p.json", "m") == profile
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ProfileError, match="is not a profile"):
        load_profile(tmp_path / "bad.json", "m")
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.json", "m")
    (tmp_path / "neg.json").write_bytes(
        msgspec.json.encode(
            CostProfile(model="m", prefill=PrefillCost(base_s=-1.0), decode=[DecodePlane()])
        )
    )
    with pytest.raises(ProfileError, match="neg.json"):
        load_profile(tmp_path / "neg.json", "m")


def test_decode_step_is_the_slowest_planes_step_exactly():
    """decode_step_s writes DecodePlane.seconds out for speed: it must give the same floats."""
    rng = random.Random(7)
    for _ in range(500):
        planes = [
            DecodePlane(
                base_s=rng.choice((0.0, rng.uniform(0, 0.05))),
                per_request_s=rng.choice((0.0, rng.uniform(0, 1e-3))),
                per_context_token_s=rng.uniform(0, 1e-6),
            )
            for _ in range(rng.randint(1, 3))
        ]
        profile = CostProfile(model="m", prefill=PrefillCost(), decode=planes)
        batch, context = rng.randint(-1, 300), rng.randint(0, 2**22)
        expected = max(p.seconds(batch, context) for p in planes) if batch > 0 else 0.0
        assert profile.decode_step_s(batch, context) == expected
    with pytest.raises(ValueError, match="no step"):
        CostProfile(model="m", prefill=PrefillCost(), decode=[]).decode_step_s(1, 1)
