"""Conditional disaggregation: the policy has the decode instance compute a prompt when what
its node lacks of it is short, and never otherwise."""

from __future__ import annotations

import dataclasses
import random

import pytest
from policy_helpers import chain, cluster, decode, index_with, linear_predictors, prefill, request

from crescent.conductor.policy import Decision, make_policy

P = linear_predictors()
PROMPT = chain("p", 8)  # 8 full blocks + 1 token: 129 tokens


def _choose(
    threshold: int, decode_node_blocks: int, policy: str = "kv-centric", req=None
) -> Decision:
    index = index_with({"node-d": PROMPT[:decode_node_blocks]}) if decode_node_blocks else None
    outcome = make_policy(
        policy, predictors=P, local_prefill_max_tokens=threshold, rng=random.Random(0)
    ).choose(req or request(PROMPT), cluster([prefill("p")], [decode("d")], index), 0.0)
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
    outcome = make_policy("kv-centric", predictors=P, local_prefill_max_tokens=64).choose(
        request(PROMPT), cluster([prefill("p")], [decode("d")], index), 0.0
    )
    assert isinstance(outcome, Decision) and not outcome.prefill_on_decode


def test_a_request_that_needs_a_prefill_instance_never_goes_to_decode():
    req = dataclasses.replace(request(PROMPT), may_prefill_on_decode=False)
    assert not _choose(threshold=10_000, decode_node_blocks=8, req=req).prefill_on_decode


def test_a_local_prefill_orders_no_replication():
    assert _choose(threshold=10_000, decode_node_blocks=0).replication == ()
