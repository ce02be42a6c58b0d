"""The peers' scorers pick what their published formulas say, worked out by hand."""

from policy_helpers import chain, cluster, decode, index_with, linear_predictors, request

from crescent.common.block_index import BlockIndex
from crescent.conductor.policy import Decision, InstanceSnapshot, make_policy
from crescent.conductor.policy.peer_scores import (
    DynamoWeights,
    dynamo_decode_pick,
    dynamo_prefill_pick,
    llmd_decode_pick,
    llmd_prefill_pick,
)

H = chain("doc", 8)  # 8 blocks of 16 tokens


def prefill(instance_id: str, num_queued: int = 0, kv_used_tokens: int = 0) -> InstanceSnapshot:
    return InstanceSnapshot(
        instance_id, f"node-{instance_id}", num_queued, 0, 0.0, kv_used_tokens, 0
    )


def test_dynamo_trades_queued_work_against_cached_blocks():
    req = request(H, num_prompt_tokens=8 * 16)
    match = index_with({"node-a": H[:6]}).match(req.block_hashes)
    # a: 6 cached → 2 new blocks, 5 queued blocks → 7; b: nothing cached → 8 new blocks, idle → 8
    a, b = prefill("a", kv_used_tokens=5 * 16), prefill("b")
    assert dynamo_prefill_pick(req, [a, b], match).instance_id == "a"
    # with 7 queued blocks a costs 9 > 8
    a = prefill("a", kv_used_tokens=7 * 16)
    assert dynamo_prefill_pick(req, [a, b], match).instance_id == "b"
    # a larger overlap weight does not change the order here (one term), ties go to the smaller id
    assert (
        dynamo_prefill_pick(
            req, [prefill("b"), prefill("a")], BlockIndex().match(H), DynamoWeights(2.0)
        ).instance_id
        == "a"
    )


def test_dynamo_decode_takes_the_fewest_kv_blocks():
    req = request(H)
    picked = dynamo_decode_pick(
        req, [decode("d0", used=500), decode("d1", used=200), decode("d2", used=900)]
    )
    assert picked.instance_id == "d1"


def test_llmd_weights_prefix_against_queue_and_kv_use():
    req = request(H, num_prompt_tokens=8 * 16)
    match = index_with({"node-a": H}).match(req.block_hashes)
    # a: prefix 1.0·3 + queue 0·2 (longest queue) + kv 1·2 = 5; b: 0 + 1·2 + 1·2 = 4 → a
    a, b = prefill("a", num_queued=4), prefill("b")
    assert llmd_prefill_pick(req, [a, b], match).instance_id == "a"
    # half the prefix: a = 1.5 + 0 + 2 = 3.5 < b = 4 → b
    match = index_with({"node-a": H[:4]}).match(req.block_hashes)
    assert llmd_prefill_pick(req, [a, b], match).instance_id == "b"


def test_llmd_decode_balances_queue_and_kv_utilisation():
    d0 = decode("d0", used=900, capacity=1000)  # queue 1·2 + kv 0.1·2 = 2.2
    d1 = InstanceSnapshot("d1", "node-d1", 3, 0, 0.0, 100, 1000)  # queue 0 + kv 0.9·2 = 1.8
    assert llmd_decode_pick([d0, d1]).instance_id == "d0"


def test_peer_policies_decide_through_the_common_pipeline():
    req = request(H, num_prompt_tokens=8 * 16)
    snapshot = cluster(
        [prefill("a"), prefill("b", kv_used_tokens=100 * 16)],
        [decode("d0"), decode("d1", used=50)],
        index_with({"node-b": H}),
    )
    for name, expected in (("dynamo-kv", "a"), ("llmd-score", "b")):
        outcome = make_policy(name, predictors=linear_predictors()).choose(req, snapshot, 0.0)
        assert isinstance(outcome, Decision) and outcome.prefill.instance_id == expected
        assert outcome.decode.instance_id == "d0" and outcome.prefill.source_node is None
        # the chosen instance still reuses what its own node holds
        assert outcome.prefill.prefix_tokens == (8 * 16 if expected == "b" else 0)
