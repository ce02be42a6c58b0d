"""What the simulated engines do, on traces small enough to work out by hand."""

import pytest
from sim_helpers import item

from crescent.bench.sim.config import SimConfig
from crescent.bench.sim.request import Status
from crescent.bench.sim.run import SimRun


def costs(config):
    return config.costs()


def test_decode_tbt_is_the_step_time_and_ttft_the_prefill_time():
    config = SimConfig(num_prefill=1, num_decode=1, h2d_gbps=1e9)  # loading KV into HBM takes ~0
    run = SimRun(config, [item(0, 0.0, [1, 2], output_length=11)]).run()
    request = run.requests[0]
    cost = costs(config)
    assert request.status is Status.OK
    assert request.ttft_s == pytest.approx(cost.prefill_s(1024, 0))
    # 10 decode steps, the batch of one growing by one token a step; TBT = mean of the longest 1
    steps = [cost.decode_step_s(1, 1025 + k) for k in range(10)]
    assert request.tbt_s == pytest.approx(max(steps), rel=1e-6)


def test_a_coupled_prefill_stalls_the_running_batch():
    """vLLM without chunking: a long prompt's prefill step sits between two tokens of a running
    request, so that request's TBT is at least the prefill time; chunking bounds it."""
    trace = [
        item(0, 0.0, [1], output_length=10),
        item(1, 0.02, list(range(10, 50)), output_length=2),
    ]
    plain = SimRun(SimConfig(num_prefill=1, num_decode=0 + 1, coupled="vllm"), trace)
    plain.cluster.instances = plain.cluster.instances[:1]  # both requests on one instance
    plain.run()
    long_prefill_s = costs(plain.config).prefill_s(40 * 512, 0)
    assert plain.requests[0].tbt_s >= long_prefill_s * 0.9
    chunked = SimRun(SimConfig(num_prefill=1, num_decode=1, coupled="vllm-chunked"), trace)
    chunked.cluster.instances = chunked.cluster.instances[:1]
    chunked.run()
    assert chunked.requests[0].tbt_s < long_prefill_s / 5
    assert all(r.status is Status.OK for r in plain.requests + chunked.requests)


def test_prefix_cache_of_a_coupled_instance_is_reused():
    trace = [item(0, 0.0, [1, 2, 3, 4]), item(1, 10.0, [1, 2, 3, 5])]
    run = SimRun(SimConfig(num_prefill=1, num_decode=1, coupled="vllm-prefix-cache"), trace)
    run.cluster.instances = run.cluster.instances[:1]
    run.run()
    assert [r.cached_tokens for r in run.requests] == [0, 3 * 512]


def test_baseline_admission_wastes_prefill_work_that_early_rejection_saves():
    """One decode instance with room for one of the two requests. The baseline takes decode room
    only when a request reaches decode, so the second one is placed while the first is still in
    prefill, is prefilled, and then finds no room; early rejection reserves at placement and
    turns the second one away before any prefill."""
    trace = [
        item(0, 0.0, list(range(40)), output_length=400),
        item(1, 0.5, [100, 101], output_length=400),
    ]
    common = {"num_prefill": 1, "num_decode": 1, "decode_kv_tokens": 21_000}
    baseline = SimRun(SimConfig(admission="baseline", **common), trace).run()
    early = SimRun(SimConfig(admission="early", **common), trace).run()
    assert [r.status for r in baseline.requests] == [Status.OK, Status.REJECTED_AFTER_PREFILL]
    assert baseline.requests[1].compute_s > 0
    assert [r.status for r in early.requests] == [Status.OK, Status.REJECTED]
    assert early.requests[1].compute_s == 0 and early.requests[1].reject_reason == "no-decode"


def test_global_cache_pulls_a_prefix_that_local_scope_recomputes():
    """Two prefill nodes; the second request shares a long prefix with the first but arrives
    while the first node is busy with a third request, so it lands on the other node."""
    shared = list(range(100, 130))
    trace = [
        item(0, 0.0, shared + [1]),
        item(1, 20.0, list(range(300, 340))),
        item(2, 20.1, shared + [2]),
    ]
    glob = SimRun(SimConfig(num_prefill=2, num_decode=1), trace).run()
    local = SimRun(
        SimConfig(num_prefill=2, num_decode=1, policy="local-cache-aware", cache_scope="local"),
        trace,
    ).run()
    assert glob.requests[2].cached_tokens == 30 * 512
    assert glob.summary("g")["hit_rate"] > local.summary("l")["hit_rate"]


def test_a_pull_takes_only_the_blocks_its_source_still_holds():
    """The policy planned to pull blocks 0–3 from p1, but p1 evicted block 2 since: the prefill
    pulls blocks 0–1 and reuses exactly those; nothing is read from a node that lacks it."""
    from crescent.bench.sim.request import SimRequest
    from crescent.conductor.policy import Decision, DecodeChoice, PrefillChoice

    run = SimRun(SimConfig(num_prefill=2, num_decode=1), [])
    cluster = run.cluster
    blocks = tuple(i.to_bytes(8, "big") for i in range(6))
    cluster.stores["p1"].write([blocks[0], blocks[1], blocks[3]])
    choice = PrefillChoice("prefill-0", "p0", 4 * 512, 0, "p1", blocks[:4], 0.01, 0.0, 0.1)
    request = SimRequest(0, 0.0, 6 * 512, 1, blocks)
    request.decision = Decision(choice, DecodeChoice("decode-0", 0.01))
    request.decode_id = "decode-0"
    cluster.decodes["decode-0"].reserve(request.request_id, 6 * 512 + 1, 6 * 512)
    prefill = cluster.prefills["prefill-0"]
    cluster._take_job(prefill, request)
    prefill.queue.append(request)
    cluster._start_prefill(prefill)
    assert request.cached_tokens == 2 * 512
    assert [cluster.stores["p0"].holds(b) for b in blocks] == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]


def test_a_profile_file_times_prefill_and_decode(tmp_path):
    """A `crescent profile` file replaces the cost model: prefill from its polynomial, decode
    from its line; the conductor prices prefill with the same file."""
    import json

    from crescent.bench.sim.config import SimConfigError

    profile = {
        "format": "crescent.prefill_poly.v1",
        "degree": 1,
        "scale": 1000.0,
        "coefficients": [0.05, 1.0, -1.0],  # 0.05 + (n − p)/1000 s
        "decode": {
            "format": "crescent.decode_linear.v1",
            "base_s": 0.02,
            "per_request_s": 0.001,
            "per_context_token_s": 0.0,
        },
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    config = SimConfig(num_prefill=1, num_decode=1, profile=path)
    run = SimRun(config, [item(0, 0.0, [1, 2], output_length=3)]).run()
    request = run.requests[0]
    assert request.compute_s == pytest.approx(0.05 + 1024 / 1000)
    assert request.tbt_s == pytest.approx(0.021, abs=1e-3)  # one request in the batch
    assert run.cluster.scheduler.policy.predictors.prefill_s(1024, 0) == pytest.approx(1.074)
    path.write_text("{}")
    with pytest.raises(SimConfigError, match="cannot use profile"):
        SimRun(SimConfig(profile=path), [])
