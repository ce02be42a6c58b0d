"""The simulator schedules with the conductor's own objects, not copies of them: its scheduler is
conductor.scheduler.Scheduler over conductor.cluster_view.ClusterView, its policy comes from
conductor.policy.make_policy, and replacing a policy function changes what it simulates."""

import pytest
from sim_helpers import item

from crescent.bench.sim.config import SimConfig
from crescent.bench.sim.request import Status
from crescent.bench.sim.run import SimRun
from crescent.conductor import scheduler as conductor_scheduler
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.policy import kv_centric, policies
from crescent.conductor.policy.decision import Rejection, RejectReason

TRACE = [item(i, i * 2.0, [100 + i % 3, 200 + i], output_length=4) for i in range(12)]


def test_the_cluster_is_scheduled_by_the_conductors_scheduler_and_policy_classes():
    run = SimRun(SimConfig(num_prefill=2, num_decode=2), TRACE)
    scheduler = run.cluster.scheduler
    assert type(scheduler) is conductor_scheduler.Scheduler
    assert type(scheduler.view) is ClusterView
    assert type(scheduler.policy) is policies.KvCentricPolicy
    for name, cls in policies.POLICIES.items():
        if name != "kv-centric":
            assert type(SimRun(SimConfig(policy=name), TRACE).cluster.scheduler.policy) is cls


def test_the_real_algorithm_1_is_called_for_every_request(monkeypatch):
    calls = []
    real = kv_centric.choose_prefill

    def counting(request, *args, **kwargs):
        calls.append(request.request_id)
        return real(request, *args, **kwargs)

    monkeypatch.setattr(kv_centric, "choose_prefill", counting)
    run = SimRun(SimConfig(num_prefill=2, num_decode=2), TRACE).run()
    assert sorted(set(calls)) == sorted(r.request_id for r in run.requests)
    assert all(r.status is Status.OK for r in run.requests)


def test_a_policy_that_rejects_everything_rejects_everything_in_the_simulation(monkeypatch):
    def refuse(self, prefill, decode, snapshot, now):
        return Rejection(RejectReason.TTFT_SLO, "test", 1.0)

    monkeypatch.setattr(policies.Policy, "accepted", lambda *a: None)
    from crescent.conductor.policy import admission

    monkeypatch.setattr(admission.NoAdmission, "judge", refuse)
    run = SimRun(SimConfig(num_prefill=2, num_decode=2), TRACE).run()
    assert all(r.status is Status.REJECTED and not r.is_prefilled for r in run.requests)


@pytest.mark.parametrize("name", sorted(policies.POLICIES))
def test_every_policy_runs_a_trace_to_completion(name):
    config = SimConfig(
        num_prefill=3,
        num_decode=2,
        policy=name,
        cache_scope="global" if name == "kv-centric" else "local",
    )
    run = SimRun(config, TRACE).run()
    assert all(r.status is Status.OK and r.ttft_s > 0 for r in run.requests)
