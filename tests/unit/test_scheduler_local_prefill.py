"""The conductor counts the prompts it sent a decode instance to compute until their first
token comes back, so `--local-prefill auto` does not pile a burst of short prompts onto one
decode instance's next step while the prefill instance would answer them soon."""

from crescent.common.codec import encode
from crescent.common.etcd import MirrorEvent
from crescent.common.messages import InstanceInfo, InstanceLoad
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.policy import Decision
from crescent.conductor.scheduler import Scheduler
from crescent.conductor.settings import ConductorSettings

CAPACITY = 100_000


def one_prefill_one_decode(ttft_slo_s: float = 30.0) -> Scheduler:
    """Both instances priced by the default cost model: a 200-token prompt is ~24 ms on either,
    so two do not fit the 40 ms TBT SLO in one step."""
    view = ClusterView(clock=lambda: 100.0)
    settings = ConductorSettings(
        block_size=16, local_prefill="auto", tbt_slo_s=0.04, ttft_slo_s=ttft_slo_s
    )
    scheduler = Scheduler(settings, view, lambda: 100.0)
    for role, instance_id in (("prefill", "p0"), ("decode", "d0")):
        node = f"node-{instance_id}"
        info = InstanceInfo(
            role=role,
            instance_id=instance_id,
            node=node,
            model="m",
            max_model_len=CAPACITY,
            kv_capacity_tokens=CAPACITY,
        )
        key = f"/crescent/c/instances/{role}/{instance_id}"
        scheduler.apply_registry_event(MirrorEvent(key, encode(info)))
        view.apply_load(
            InstanceLoad(
                role=role,
                instance_id=instance_id,
                node=node,
                sent_at=0,
                period_s=0.2,
                kv_capacity_tokens=CAPACITY,
            )
        )
    return scheduler


def choose(scheduler: Scheduler, request_id: str, record: bool = True) -> Decision:
    """Place a 200-token prompt; `record` it as the conductor does once it sends it out."""
    request = scheduler.request_for(request_id, "m", list(range(200)), max_tokens=8)
    decision = scheduler.schedule(request, "m")
    assert isinstance(decision, Decision)
    if record:
        scheduler.record(request, decision, "m")
    return decision


def test_a_prompt_waits_on_decode_until_its_first_token_is_back():
    scheduler = one_prefill_one_decode()
    first = choose(scheduler, "r0")
    assert first.prefill_on_decode and first.local_prefill_added_s > 0

    assert not choose(scheduler, "r1", record=False).prefill_on_decode  # r0 computes there

    scheduler.on_computed_on_decode("r0", num_prompt_tokens=200, num_cached_tokens=0)
    assert choose(scheduler, "r1").prefill_on_decode


def test_a_prompt_whose_remote_ttft_is_past_a_tenth_of_the_slo_joins_anyway():
    scheduler = one_prefill_one_decode(ttft_slo_s=0.1)  # ~24 ms remote against 10 ms
    assert choose(scheduler, "r0").prefill_on_decode
    assert choose(scheduler, "r1").prefill_on_decode
