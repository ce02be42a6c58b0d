import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crescent.decode.admission import KvLedger
from crescent.engine.cost_model import CostModel, ModelDims
from crescent.engine.emulated import EmulatedDecodeEngine, EmulatedPrefillEngine, emulated_token


def test_prefill_flops_follow_equation_1():
    dims = ModelDims(num_layers=80, hidden_size=8192, a=4, b=22)
    cost = CostModel(dims=dims)
    n, d, layers = 1000, 8192, 80
    assert cost.prefill_flops(n) == layers * (4 * n * n * d + 22 * n * d * d)
    saved = cost.prefill_flops(n) - cost.prefill_flops(n, num_cached=400)
    assert saved == pytest.approx(layers * (4 * 400**2 * d + 22 * 400 * d * d))


def test_time_scale_zero_is_instant_and_decode_is_memory_bound_at_small_batch():
    assert CostModel(time_scale=0).prefill_s(4000) == 0
    cost = CostModel()
    one = cost.decode_step_s(1, 1000)
    assert one == pytest.approx(
        (cost.dims.weight_bytes + 1000 * cost.dims.kv_bytes_per_token) / cost.memory_bytes_per_s
    )
    assert cost.decode_step_s(64, 64000) > one


async def test_emulated_output_is_deterministic():
    cost = CostModel(time_scale=0)
    prompt = [1, 2, 3]
    prefill = EmulatedPrefillEngine(cost)
    first = (await prefill.compute(await prefill.plan(prompt))).first_token
    assert first == emulated_token(sum(prompt), len(prompt))
    engine = EmulatedDecodeEngine(cost)
    loop = asyncio.create_task(engine.run())
    try:
        runs = []
        for _ in range(2):
            steps = [s async for s in engine.generate("r", prompt, first, 5)]
            runs.append(steps)
        assert runs[0] == runs[1]
        assert sum(len(s.token_ids) for s in runs[0]) == 5 and runs[0][-1].finish_reason == "length"
    finally:
        loop.cancel()


async def test_abort_ends_a_generation():
    engine = EmulatedDecodeEngine(CostModel(time_scale=1e-3))
    loop = asyncio.create_task(engine.run())
    try:
        steps = engine.generate("r", [1], 2, 10_000)
        assert (await anext(steps)).finish_reason is None
        engine.abort("r")
        reasons = [s.finish_reason async for s in steps]
        assert reasons[-1] == "abort"
        assert engine.num_running == 0
    finally:
        loop.cancel()


def test_ledger_holds_room_until_released_and_expires_unstarted_reservations():
    ledger = KvLedger(capacity_tokens=100)
    assert ledger.can_reserve(60, now=0)
    ledger.reserve("a", 60, expires_at=10)
    assert not ledger.can_reserve(60, now=1)
    assert ledger.activate("a", 60, now=2)
    ledger.release("a")
    ledger.reserve("b", 60, expires_at=10)
    assert ledger.can_reserve(60, now=11)  # b expired
    assert not ledger.activate("c", 200, now=12)


def test_ledger_refuses_a_start_larger_than_its_reservation():
    ledger = KvLedger(capacity_tokens=1000)
    ledger.reserve("a", 60, expires_at=10)
    assert not ledger.activate("a", 500, now=1)
    assert ledger.activate("a", 60, now=1)


ledger_steps = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "activate", "release", "expire"]),
        st.sampled_from("abcde"),
        st.integers(1, 400),
        st.integers(0, 300),
        st.sampled_from([1.0, 5.0, 9.0]),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ledger_steps)
def test_the_ledger_keeps_the_sums_of_what_it_holds(steps):
    """The KV held and the reserved prompts, kept by each change, are the sums of the
    reservations and running requests left, whatever order they come in."""
    ledger = KvLedger(capacity_tokens=1000)
    for kind, request_id, num_tokens, num_prompt_tokens, now in steps:
        if kind == "reserve":
            ledger.reserve(request_id, num_tokens, now + 3.0, num_prompt_tokens)
        elif kind == "activate":
            ledger.activate(request_id, num_tokens, now)
        elif kind == "release":
            ledger.release(request_id)
        else:
            ledger.expire(now)
        assert ledger.used_tokens == sum(r.num_tokens for r in ledger.reserved.values()) + sum(
            ledger.active.values()
        )
        assert ledger.num_reserved_prompt_tokens == sum(
            r.num_prompt_tokens for r in ledger.reserved.values()
        )
