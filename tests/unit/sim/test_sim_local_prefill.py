"""Conditional disaggregation in the simulator: the conductor's own rule decides, the decode
instance computes such a prompt inside its step, and its running batch waits for it."""

import pytest
from sim_helpers import item

from crescent.bench.sim.config import SimConfig, SimConfigError
from crescent.bench.sim.request import Status
from crescent.bench.sim.run import SimRun

LONG_DECODE = item(0, 0.0, list(range(100, 108)), output_length=40)  # 4,096 tokens: remote
SHORT = item(1, 0.3, [1, 2], output_length=2)  # 1,024 tokens, arrives while r0 decodes


def run(local_prefill: str) -> SimRun:
    config = SimConfig(num_prefill=1, num_decode=1, h2d_gbps=1e9, local_prefill=local_prefill)
    return SimRun(config, [LONG_DECODE, SHORT]).run()


def test_a_short_prompt_is_computed_in_the_decode_instances_step():
    on_decode, off = run("1024"), run("off")
    assert [r.status for r in on_decode.requests] == [Status.OK, Status.OK]
    assert [r.decision.prefill_on_decode for r in on_decode.requests] == [False, True]
    assert on_decode.summary("c")["prefilled_on_decode"] == 1
    short = on_decode.requests[1]
    compute_s = on_decode.config.costs().prefill_s(1024, 0)
    assert short.compute_s == pytest.approx(compute_s)
    # its first token: the end of the step after the one under way when it came (~8 ms each)
    assert compute_s <= short.ttft_s <= compute_s + 0.05
    # the running request's tokens waited for that compute; with a prefill instance they did not
    # (TBT is the mean of its 4 longest of 39 intervals: the stalled one counts a quarter)
    assert on_decode.requests[0].tbt_s >= off.requests[0].tbt_s + compute_s / 5


def test_auto_prices_it_with_the_cost_model():
    long_decode, short = run("auto").requests
    assert short.decision.prefill_on_decode and not long_decode.decision.prefill_on_decode


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"local_prefill": "sometimes"}, "off, auto or a number of tokens"),
        ({"local_prefill": "auto", "admission": "baseline"}, "not --admission baseline"),
        ({"local_prefill": "512", "coupled": "vllm"}, "not --admission baseline or --coupled"),
    ],
)
def test_a_local_prefill_the_simulator_cannot_run_is_refused(fields, message):
    with pytest.raises(SimConfigError, match=message):
        SimConfig(**fields).validate()
