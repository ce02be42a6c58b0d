"""Properties of any simulated run, over random small traces and clusters: a rejected request
never reaches a prefill instance, no node ever holds more blocks than its capacity, and no block
is ever read from a node that does not hold it."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import item

from crescent.bench.sim.cluster import DisaggregatedCluster
from crescent.bench.sim.config import ADMISSIONS, SimConfig
from crescent.bench.sim.request import Status
from crescent.bench.sim.run import SimRun
from crescent.conductor.policy import POLICIES


class CheckedCluster(DisaggregatedCluster):
    """The simulated cluster with its invariants asserted as it runs."""

    def __init__(self, config, loop):
        super().__init__(config, loop)
        self.started: set[str] = set()
        for store in self.stores.values():
            self._check_store(store)

    def _check_store(self, store):
        read, write = store.read, store.write

        def checked_read(blocks):
            assert all(store.holds(block) for block in blocks), (
                f"read a block {store.node} does not hold"
            )
            result = read(blocks)
            self._check_capacity(store)
            return result

        def checked_write(blocks):
            write(blocks)
            self._check_capacity(store)

        store.read, store.write = checked_read, checked_write

    @staticmethod
    def _check_capacity(store):
        assert store.num_dram_blocks <= store.capacity_blocks
        assert store.num_blocks - store.num_dram_blocks <= store.ssd_blocks

    def _start_prefill(self, prefill):
        request = prefill.queue[0]
        assert request.status is Status.PENDING, (
            f"{request.request_id} reached prefill as {request.status}"
        )
        super()._start_prefill(prefill)
        self.started.add(request.request_id)
        num_reused_blocks = math.ceil(request.cached_tokens / 512)
        for block in request.blocks[:num_reused_blocks]:
            assert prefill.node in self.scheduler.index.holders(block), (
                "reused a block its node lacks"
            )


families = st.integers(0, 3)
requests = st.lists(
    st.tuples(
        families, st.integers(1, 6), st.integers(0, 511), st.integers(1, 12), st.floats(0, 3)
    ),
    min_size=1,
    max_size=25,
)


def build_trace(specs):
    trace, now = [], 0.0
    for i, (family, num_blocks, short, output, gap) in enumerate(specs):
        now += gap
        ids = [family * 100 + b for b in range(num_blocks - 1)] + [
            10_000 + i
        ]  # shared prefix, own tail
        trace.append(item(i, now, ids, output_length=output, input_length=num_blocks * 512 - short))
    return trace


@settings(max_examples=40, deadline=None)
@given(
    specs=requests,
    policy=st.sampled_from(sorted(POLICIES)),
    admission=st.sampled_from(ADMISSIONS),
    num_prefill=st.integers(1, 4),
    num_decode=st.integers(1, 3),
    cache_blocks=st.integers(0, 8),
    ssd_blocks=st.sampled_from([0, 2]),
    decode_kv=st.integers(3_000, 20_000),
    ttft_slo=st.floats(0.2, 5.0),
)
def test_invariants_hold_on_any_run(
    specs, policy, admission, num_prefill, num_decode, cache_blocks, ssd_blocks, decode_kv, ttft_slo
):
    config = SimConfig(
        num_prefill=num_prefill,
        num_decode=num_decode,
        policy=policy,
        admission=admission,
        cache_tokens_per_node=cache_blocks * 512,
        ssd_tokens_per_node=ssd_blocks * 512,
        decode_kv_tokens=decode_kv,
        ttft_slo_s=ttft_slo,
        tbt_slo_s=0.05,
        cache_scope="global" if policy == "kv-centric" else "local",
        hot_spot_period_s=0.5,
        tflops=20.0,
    )  # a slow device, so queues build up and admission has work to do
    run = SimRun(config, build_trace(specs))
    run.cluster = cluster = CheckedCluster(config, run.loop)
    run.run()
    for request in run.requests:
        assert request.status is not Status.PENDING
        if request.status is Status.REJECTED:
            assert request.request_id not in cluster.started and not request.is_prefilled
        else:
            assert request.request_id in cluster.started and request.is_prefilled
        if request.status is Status.REJECTED_AFTER_PREFILL:
            assert admission == "baseline"
    assert cluster.num_open == 0
    for decode in cluster.decodes.values():
        assert decode.kv_used_tokens == 0 and not decode.reserved and decode.batch.num_running == 0
