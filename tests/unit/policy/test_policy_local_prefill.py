"""Conditional disaggregation: the policy has the decode instance compute a prompt when what
its node lacks of it is short (by a token threshold, or priced by the decode instance's own
cost model), and never otherwise."""

from __future__ import annotations

import dataclasses
import random

import pytest
from policy_helpers import chain, cluster, decode, index_with, linear_predictors, prefill, request

from crescent.common.errors import ConfigError
from crescent.conductor.policy import CostPredictors, Decision, LocalPrefill, make_policy
from crescent.conductor.policy.inflight import InflightRequest
from crescent.conductor.settings import ConductorSettings

P = linear_predictors()
PROMPT = chain("p", 8)  # 8 full blocks + 1 token: 129 tokens


def tokens(threshold: int) -> LocalPrefill:
    return LocalPrefill("tokens", max_uncached_tokens=threshold)


def _choose(
    threshold: int | LocalPrefill,
    decode_node_blocks: int,
    policy: str = "kv-centric",
    req=None,
    prefill_queue_s: float = 0.0,
    decode_fields: dict | None = None,
    inflight=(),
) -> Decision:
    rule = tokens(threshold) if isinstance(threshold, int) else threshold
    index = index_with({"node-d": PROMPT[:decode_node_blocks]}) if decode_node_blocks else None
    outcome = make_policy(policy, predictors=P, local_prefill=rule, rng=random.Random(0)).choose(
        req or request(PROMPT),
        cluster(
            [prefill("p", queue_s=prefill_queue_s)],
            [decode("d", **(decode_fields or {}))],
            index,
            inflight=inflight,
        ),
        0.0,
    )
    assert isinstance(outcome, Decision)
    return outcome


@pytest.mark.parametrize("policy", ["kv-centric", "least-loaded", "random", "round-robin"])
def test_off_by_default_every_prompt_goes_to_a_prefill_instance(policy):
    outcome = make_policy(policy, predictors=P, rng=random.Random(0)).choose(
        request([], 2), cluster([prefill("p")], [decode("d")]), 0.0
    )
    assert isinstance(outcome, Decision) and not outcome.prefill_on_decode
    assert not _choose(0, 8, policy).prefill_on_decode


@pytest.mark.parametrize("policy", ["least-loaded", "random", "round-robin"])
def test_every_policy_can_prefill_on_decode(policy):
    assert _choose(threshold=129, decode_node_blocks=0, policy=policy).prefill_on_decode


def test_a_short_prompt_is_computed_on_decode():
    assert _choose(threshold=129, decode_node_blocks=0).prefill_on_decode
    assert not _choose(threshold=128, decode_node_blocks=0).prefill_on_decode


def test_the_decode_nodes_cached_prefix_is_not_counted_as_work():
    # 6 of 8 blocks on the decode node: 129 − 96 = 33 tokens left to compute
    assert _choose(threshold=33, decode_node_blocks=6).prefill_on_decode
    assert not _choose(threshold=32, decode_node_blocks=6).prefill_on_decode


def test_a_prefix_on_another_node_does_not_make_a_prompt_short():
    index = index_with({"node-p": PROMPT})
    outcome = make_policy("kv-centric", predictors=P, local_prefill=tokens(64)).choose(
        request(PROMPT), cluster([prefill("p")], [decode("d")], index), 0.0
    )
    assert isinstance(outcome, Decision) and not outcome.prefill_on_decode


def test_a_request_that_needs_a_prefill_instance_never_goes_to_decode():
    req = dataclasses.replace(request(PROMPT), may_prefill_on_decode=False)
    assert not _choose(threshold=10_000, decode_node_blocks=8, req=req).prefill_on_decode


def test_a_local_prefill_orders_no_replication():
    assert _choose(threshold=10_000, decode_node_blocks=0).replication == ()


def auto(max_step_s: float, overrun_after_s: float = 3.0) -> LocalPrefill:
    return LocalPrefill("auto", max_step_s=max_step_s, overrun_after_s=overrun_after_s)


def test_auto_computes_on_decode_what_its_cost_model_prices_within_the_tbt_slo():
    # P prices 1 ms a token: 129 uncached tokens are 129 ms on the decode instance
    assert _choose(auto(max_step_s=0.2), decode_node_blocks=0).prefill_on_decode
    assert not _choose(auto(max_step_s=0.1), decode_node_blocks=0).prefill_on_decode
    # 6 of 8 blocks on the decode node: 33 tokens, 33 ms
    assert _choose(auto(max_step_s=0.1), decode_node_blocks=6).prefill_on_decode


def test_auto_sends_to_the_prefill_instance_what_it_computes_sooner():
    slow_decode = {"costs": linear_predictors(prefill_per_token_s=0.01)}  # 1.29 s here
    assert not _choose(auto(10.0), 0, decode_fields=slow_decode).prefill_on_decode
    # the prefill instance's queue makes the remote TTFT longer than the local compute
    assert _choose(auto(10.0), 0, prefill_queue_s=2.0, decode_fields=slow_decode).prefill_on_decode


def computing_on(decode_id: str, added_s: float) -> InflightRequest:
    """A prompt this conductor sent `decode_id` to compute, its first token not yet back."""
    return InflightRequest(decode_id, 100, 0.0, True, local_prefill_added_s=added_s)


def test_auto_says_what_the_prompt_adds_to_the_decode_instances_step():
    decision = _choose(auto(max_step_s=0.2), decode_node_blocks=0)
    assert decision.local_prefill_added_s == pytest.approx(0.129)  # P has no fixed step cost
    with_step_cost = {"costs": linear_predictors(prefill_per_token_s=0.001, prefill_step_s=0.05)}
    decision = _choose(auto(max_step_s=0.2), 0, decode_fields=with_step_cost, prefill_queue_s=1.0)
    assert decision.prefill_on_decode
    assert decision.local_prefill_added_s == pytest.approx(0.129)  # 179 ms less the 50 shared


def test_prompts_queued_on_decode_share_one_tbt_slo_with_this_one():
    """The engine computes them in one step, which the running batch waits for: 129 ms here
    plus what is queued, against 200 ms, while the prefill instance answers in 129 ms."""

    def on_decode(*inflight: InflightRequest) -> bool:
        return _choose(auto(0.2), 0, inflight=inflight).prefill_on_decode

    assert on_decode(computing_on("d", 0.06))
    assert not on_decode(computing_on("d", 0.08))
    assert not on_decode(computing_on("d", 0.04), computing_on("d", 0.04))
    assert on_decode(computing_on("other", 0.5))
    assert on_decode(computing_on("d", 0.0))  # its first token is back


def test_a_slow_remote_prefill_lets_the_step_run_over_the_tbt_slo():
    """Past `overrun_after_s` of remote TTFT (a tenth of the TTFT SLO from the setting), the
    prompt's TTFT is the larger risk: it joins the step however much is queued, but a prompt
    that alone takes longer than one TBT SLO still goes to the prefill instance."""
    queued = [computing_on("d", 0.5)]
    assert not _choose(auto(0.2), 0, inflight=queued, prefill_queue_s=2.8).prefill_on_decode
    assert _choose(auto(0.2), 0, inflight=queued, prefill_queue_s=3.0).prefill_on_decode
    assert not _choose(auto(0.1), 0, prefill_queue_s=10.0).prefill_on_decode


def test_prompts_batched_into_one_step_pay_its_fixed_cost_once():
    """50 ms a step plus 1 ms a token on decode: this prompt 179 ms, with one queued that adds
    129 ms the step takes 308 ms (counting the fixed cost twice would make it 358)."""
    with_step_cost = {"costs": linear_predictors(prefill_per_token_s=0.001, prefill_step_s=0.05)}

    def on_decode(max_step_s: float) -> bool:
        return _choose(
            auto(max_step_s),
            0,
            decode_fields=with_step_cost,
            prefill_queue_s=1.0,
            inflight=[computing_on("d", 0.129)],
        ).prefill_on_decode

    assert on_decode(0.31)
    assert not on_decode(0.30)


def test_a_token_threshold_is_kept_whatever_is_queued():
    assert _choose(129, 0, inflight=[computing_on("d", 9.0)]).prefill_on_decode


def corrected(base_per_token_s: float, overhead_s: float) -> CostPredictors:
    """A published model as the pricing corrects it: a learned overhead on top of the base."""
    base = linear_predictors(prefill_per_token_s=base_per_token_s)
    return CostPredictors(
        prefill_s=lambda n, p: overhead_s + base.prefill_s(n, p),
        decode_step_s=base.decode_step_s,
        kv_bytes_per_token=base.kv_bytes_per_token,
        base=base,
        prefill_overhead_s=overhead_s,
    )


def test_auto_counts_the_learned_overhead_against_the_remote_path_only():
    """Two fits of like hardware differ a little; the overhead the correction learned (the
    remote path's messaging and KV hand-off) is what computing on decode saves, so the decode
    wins such a tie instead of the noise deciding it."""
    prefill_costs = corrected(0.001, overhead_s=0.05)  # remote: 50 ms + 129 ms
    decode_costs = corrected(0.00105, overhead_s=0.05)  # 5 % slower fit: 135 ms of compute
    outcome = make_policy("kv-centric", predictors=P, local_prefill=auto(1.0)).choose(
        request(PROMPT),
        cluster([prefill("p", costs=prefill_costs)], [decode("d", costs=decode_costs)]),
        0.0,
    )
    assert isinstance(outcome, Decision) and outcome.prefill_on_decode


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("off", LocalPrefill()),
        ("0", LocalPrefill()),
        ("512", tokens(512)),
        ("AUTO", auto(0.25, overrun_after_s=2.0)),
    ],
)
def test_the_setting_reads_off_a_threshold_or_auto(text, rule):
    settings = ConductorSettings(local_prefill=text, tbt_slo_s=0.25, ttft_slo_s=20.0)
    assert settings.local_prefill_rule() == rule


@pytest.mark.parametrize("text", ["on", "-5", "1.5", ""])
def test_a_bad_setting_is_refused_with_what_it_takes(text):
    with pytest.raises(ConfigError, match="off, auto or a number of tokens"):
        ConductorSettings(local_prefill=text).validate()
