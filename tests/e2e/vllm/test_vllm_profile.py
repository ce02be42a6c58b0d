"""`crescent profile` on the real engine writes a model the conductor loads unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from crescent.conductor.policy.prefill_model import PrefillTimeModel

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(600)]


def test_profile_fits_prefill_and_decode_models_the_conductor_loads(tiny_model_dir, tmp_path):
    out = tmp_path / "profile.json"
    argv = [
        sys.executable,
        "-m",
        "crescent.engine.vllm.profile",
        "--model",
        str(tiny_model_dir),
        "--json",
        str(out),
        "--lengths",
        "256,512,1024",
        "--batches",
        "1,4",
        "--contexts",
        "128,512",
        "--repeats",
        "1",
    ]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=500,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    profile = json.loads(out.read_text())
    model = PrefillTimeModel.from_dict(profile)
    assert len(profile["samples"]["prefill"]) == 9 and len(profile["samples"]["decode"]) == 4
    assert model.predict(1024, 0) > 0
    assert model.predict(1024, 896) < model.predict(1024, 0)  # a cached prefix is cheaper
    decode = profile["decode"]
    assert (
        decode["format"] == "crescent.decode_linear.v1"
        and decode["base_s"] + decode["per_request_s"] > 0
    )
