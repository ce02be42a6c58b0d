"""The conductor prices prefill with `crescent profile`'s fitted model when given one."""

import json

import pytest

from crescent.common.errors import ConfigError
from crescent.conductor.policy import PrefillTimeModel
from crescent.conductor.scheduler import build_predictors
from crescent.conductor.settings import ConductorSettings


def test_fitted_prefill_model_from_a_profile_file_is_used(tmp_path):
    samples = [
        (n, p, 1e-3 + 2e-6 * (n - p) + 1e-10 * (n * n - p * p))
        for n in (512, 1024, 2048, 4096)
        for p in (0, 256, 3 * n // 4)
    ]
    model = PrefillTimeModel.fit(samples)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({**model.to_dict(), "decode": {"base_s": 0.01}, "model": "m"}))
    predictors = build_predictors(ConductorSettings(prefill_model=str(path)))
    assert predictors.prefill_s(3000, 1000) == pytest.approx(model.predict(3000, 1000))
    assert predictors.prefill_s(3000, 1000) == pytest.approx(
        1e-3 + 2e-6 * 2000 + 1e-10 * 8e6, rel=1e-3
    )


def test_emulated_cost_model_is_the_default():
    settings = ConductorSettings()
    assert build_predictors(settings).prefill_s(1000, 0) == settings.cost_model().prefill_s(1000, 0)


@pytest.mark.parametrize("content", ["not json", json.dumps({"format": "something else"})])
def test_unusable_profile_file_is_a_config_error(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match="prefill_model"):
        build_predictors(ConductorSettings(prefill_model=str(path)))
