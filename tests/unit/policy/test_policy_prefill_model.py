"""PrefillTimeModel: fitted from profiles, reproduces Eq. 1, survives a round trip."""

from __future__ import annotations

import json

import pytest

from crescent.conductor.policy import PrefillTimeModel
from crescent.engine.cost_model import CostModel


def profile(model: CostModel) -> list[tuple[int, int, float]]:
    return [
        (n, p, model.prefill_s(n, p))
        for n in (512, 2048, 8192, 32768, 131072)
        for p in (0, n // 4, n // 2, n - 1)
        if p <= n
    ]


def test_degree_two_fit_reproduces_the_cost_model():
    model = CostModel()
    fitted = PrefillTimeModel.fit(profile(model))
    for n, p in [(1000, 0), (16000, 8000), (100_000, 99_000), (70_000, 3)]:
        assert fitted.predict(n, p) == pytest.approx(model.prefill_s(n, p), rel=1e-6, abs=1e-9)
    assert fitted(1000, 5000) == pytest.approx(
        0.0, abs=1e-9
    )  # a prefix longer than the input is capped


def test_round_trip_through_json():
    fitted = PrefillTimeModel.fit(profile(CostModel()), degree=3)
    again = PrefillTimeModel.from_dict(json.loads(json.dumps(fitted.to_dict())))
    assert again == fitted
    with pytest.raises(ValueError, match="format"):
        PrefillTimeModel.from_dict({"degree": 2})


def test_predictions_never_go_negative_and_bad_inputs_are_refused():
    assert PrefillTimeModel(1, 1.0, (-1.0, 0.0, 0.0)).predict(10, 0) == 0.0
    with pytest.raises(ValueError, match="samples"):
        PrefillTimeModel.fit([(10, 0, 1.0)])
    with pytest.raises(ValueError, match="vary"):
        PrefillTimeModel.fit([(n, 0, n * 1e-3) for n in range(1, 20)])  # p never varies
    with pytest.raises(ValueError):
        PrefillTimeModel(2, 1.0, (1.0,))
