import random

import msgspec
import pytest

from crescent.common.codec import encode
from crescent.common.etcd import MirrorEvent
from crescent.common.messages import InstanceInfo, InstanceLoad
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.policy import CostPredictors, least_loaded
from crescent.conductor.policy.columns import InstanceColumns
from crescent.conductor.policy.eligibility import eligible_decode, eligible_prefill
from crescent.conductor.policy.snapshot import InstanceSnapshot
from crescent.conductor.pricing import Pricing


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def register(view, role, instance_id, model="m", **fields):
    info = InstanceInfo(role=role, instance_id=instance_id, node="n", model=model, **fields)
    view.apply_registry(MirrorEvent(f"/crescent/c/instances/{role}/{instance_id}", encode(info)))


def unregister(view, role, instance_id):
    view.apply_registry(MirrorEvent(f"/crescent/c/instances/{role}/{instance_id}", None))


def load(role, instance_id, **fields):
    return InstanceLoad(
        role=role, instance_id=instance_id, node="n", sent_at=0, period_s=0.2, **fields
    )


def snap(instance_id, queue_time_s=0.0, num_queued=0, num_running=0, used=0, capacity=100):
    return InstanceSnapshot(instance_id, "n", num_queued, num_running, queue_time_s, used, capacity)


def test_prefill_choice_is_shortest_predicted_queue_then_id():
    assert least_loaded.choose_prefill([snap("b", 1.0), snap("a", 2.0)]).instance_id == "b"
    assert least_loaded.choose_prefill([snap("b", 1.0), snap("a", 1.0)]).instance_id == "a"
    assert least_loaded.choose_prefill([]) is None


def test_decode_choice_skips_full_instances():
    full = snap("a", used=95)
    roomy = snap("b", num_running=5, used=10)
    assert least_loaded.choose_decode([full, roomy], 10).instance_id == "b"
    assert least_loaded.choose_decode([full], 10) is None


def test_stale_instances_get_no_work():
    clock = Clock()
    view = ClusterView(clock=clock)
    register(view, "prefill", "p0")
    register(view, "prefill", "p1")
    view.apply_load(load("prefill", "p0"))
    view.apply_load(load("prefill", "p1"))
    clock.now += 0.5
    view.apply_load(load("prefill", "p1"))
    clock.now += 0.2  # p0 last heard 0.7 s ago > 3 periods of 0.2 s, while p1 was heard just now
    view.apply_load(load("prefill", "p1"))
    snapshots = view.snapshot("prefill", "m", clock.now)
    assert {(s.instance_id, s.is_stale) for s in snapshots} == {("p0", True), ("p1", False)}
    assert [s.instance_id for s in eligible_prefill(snapshots)] == ["p1"]


@pytest.mark.parametrize("reason", ["draining", "full"])
def test_an_instance_that_says_it_takes_no_work_gets_none(reason):
    clock = Clock()
    view = ClusterView(clock=clock)
    register(view, "decode", "d0", kv_capacity_tokens=100)
    register(view, "decode", "d1", kv_capacity_tokens=100)
    view.apply_load(
        load(
            "decode", "d0", kv_capacity_tokens=100, is_accepting=False, not_accepting_reason=reason
        )
    )
    view.apply_load(load("decode", "d1", kv_capacity_tokens=100))
    snapshots = view.snapshot("decode", "m", clock.now)
    assert {(s.instance_id, s.is_accepting, s.is_stale) for s in snapshots} == {
        ("d0", False, False),
        ("d1", True, False),
    }
    assert [s.instance_id for s in eligible_decode(snapshots, 10)] == ["d1"]
    view.apply_load(load("decode", "d0", kv_capacity_tokens=100))
    assert len(eligible_decode(view.snapshot("decode", "m", clock.now), 10)) == 2


def test_deregistered_instances_leave_the_view():
    view = ClusterView(clock=Clock())
    register(view, "decode", "d0")
    view.apply_registry(MirrorEvent("/crescent/c/instances/decode/d0", None))
    assert view.snapshot("decode", "m", 100.0) == []


def test_an_instance_whose_lease_ends_while_it_is_heard_stays_until_it_registers_again():
    clock = Clock()
    view = ClusterView(clock=clock)
    register(view, "prefill", "p0")
    view.apply_load(load("prefill", "p0"))
    started = view.started_at("prefill", "p0")
    view.apply_registry(MirrorEvent("/crescent/c/instances/prefill/p0", None))
    assert view.drop_unregistered() == []
    assert [s.instance_id for s in eligible_prefill(view.snapshot("prefill", "m", clock.now))] == [
        "p0"
    ]
    assert view.started_at("prefill", "p0") == started and view.models() == {"m": 0}
    register(view, "prefill", "p0")
    clock.now += 100.0  # silent from now on, but registered: stale, not gone
    assert view.drop_unregistered() == [] and view.models() == {"m": 0}


def test_an_instance_whose_lease_ended_leaves_once_unheard_for_the_lease_ttl():
    """Stale after 0.6 s unheard (no new work), gone only after the TTL etcd would give it:
    after an etcd outage every lease ends at once and the renewals' storm can delay telemetry
    past the stale window, a second before the instances register again."""
    clock = Clock()
    view = ClusterView(clock=clock, lease_ttl_s=5.0)
    register(view, "prefill", "p0")
    register(view, "prefill", "p1")
    view.apply_load(load("prefill", "p0"))
    view.apply_registry(MirrorEvent("/crescent/c/instances/prefill/p0", None))
    for _ in range(49):  # 4.9 s: p0 unheard, p1 heard every 0.1 s
        clock.now += 0.1
        view.apply_load(load("prefill", "p1"))
        assert view.drop_unregistered() == []
    assert [s.instance_id for s in eligible_prefill(view.snapshot("prefill", "m", clock.now))] == [
        "p1"
    ]
    clock.now += 0.2  # p0 unheard for 5.1 s
    view.apply_load(load("prefill", "p1"))
    assert view.drop_unregistered() == [("prefill", "p0")]
    assert view.started_at("prefill", "p0") is None


def test_a_draining_or_silent_instance_leaves_as_its_key_goes():
    clock = Clock()
    view = ClusterView(clock=clock)
    register(view, "decode", "d0")
    register(view, "decode", "d1")
    view.apply_load(load("decode", "d0", is_accepting=False, not_accepting_reason="draining"))
    view.apply_load(load("decode", "d1"))
    clock.now += 1.0
    view.apply_load(load("decode", "d0", is_accepting=False, not_accepting_reason="draining"))
    for instance_id in ("d0", "d1"):  # d0 stops on purpose; d1 was last heard a second ago
        view.apply_registry(MirrorEvent(f"/crescent/c/instances/decode/{instance_id}", None))
    assert view.snapshot("decode", "m", clock.now) == []


def test_an_instance_whose_key_went_before_its_draining_telemetry_came_leaves_with_it():
    """A stopping instance says it drains (NATS), then revokes its lease (etcd): the key can
    arrive gone first, while its last telemetry still says it serves."""
    clock = Clock()
    view = ClusterView(clock=clock)
    register(view, "decode", "d0")
    view.apply_load(load("decode", "d0"))
    view.apply_registry(MirrorEvent("/crescent/c/instances/decode/d0", None))
    assert ("decode", "d0") in view.instances  # kept: heard serving a moment ago
    gone = view.apply_load(
        load("decode", "d0", is_accepting=False, not_accepting_reason="draining")
    )
    assert gone == ("decode", "d0")
    assert ("decode", "d0") not in view.instances and view.started_at("decode", "d0") is None


def test_an_instance_that_leaves_by_its_draining_telemetry_takes_its_corrections_along():
    from crescent.conductor.scheduler import Scheduler
    from crescent.conductor.settings import ConductorSettings

    clock = Clock()
    view = ClusterView(clock=clock)
    scheduler = Scheduler(ConductorSettings(), view, clock)
    key = "/crescent/c/instances/decode/d0"
    info = InstanceInfo(role="decode", instance_id="d0", node="n", model="m")
    scheduler.apply_registry_event(MirrorEvent(key, encode(info)))
    scheduler.apply_load(load("decode", "d0"))
    scheduler.pricing.correction.observe("d0", "decode", 0.01, 0.02)
    scheduler.apply_registry_event(MirrorEvent(key, None))  # kept: heard serving
    assert scheduler.pricing.correction.has_samples("d0", "decode")
    scheduler.apply_load(load("decode", "d0", is_accepting=False, not_accepting_reason="draining"))
    assert not scheduler.pricing.correction.has_samples("d0", "decode")


def test_contradictory_or_unknown_telemetry_is_ignored_and_logged_once_per_instance(caplog):
    clock = Clock()
    view = ClusterView(clock=clock)
    register(view, "decode", "d0", kv_capacity_tokens=100)
    view.apply_load(load("decode", "d0", kv_used_tokens=10, kv_capacity_tokens=100))
    with caplog.at_level("WARNING"):
        view.apply_load(load("decode", "d0", num_queued=-1))
        view.apply_load(
            InstanceLoad(
                role="decode",
                instance_id="d0",
                node="elsewhere",
                sent_at=0,
                period_s=0.2,
                kv_used_tokens=90,
            )
        )
        view.apply_load(load("decode", "d0", is_accepting=True, not_accepting_reason="full"))
    view.apply_load(load("decode", "ghost"))
    [snapshot] = view.snapshot("decode", "m", clock.now)
    assert snapshot.kv_used_tokens == 10 and snapshot.num_queued == 0
    assert ("decode", "ghost") not in view.instances
    assert [r.message for r in caplog.records].count("ignoring contradictory telemetry") == 1


def test_malformed_registry_entry_is_ignored():
    view = ClusterView(clock=Clock())
    view.apply_registry(MirrorEvent("/crescent/c/instances/prefill/p0", b"\x00garbage"))
    assert view.instances == {}


def test_models_lists_smallest_context_per_model():
    view = ClusterView(clock=Clock())
    register(view, "prefill", "p0", max_model_len=100)
    register(view, "prefill", "p1", max_model_len=50)
    register(view, "prefill", "p2", model="other", max_model_len=10)
    assert view.models() == {"m": 50, "other": 10}


def test_a_silent_instance_is_stale_but_still_registered(caplog):
    """Slow is not dead: missed telemetry takes an instance out of new work (and is logged once),
    but its model stays served and its requests wait, until its registry key goes."""
    clock = Clock()
    view = ClusterView(clock=clock)
    register(view, "prefill", "p0")
    view.apply_load(load("prefill", "p0"))
    clock.now += 100.0
    with caplog.at_level("INFO"):
        view.log_changes(clock.now)
        view.log_changes(clock.now)
    assert list(eligible_prefill(view.snapshot("prefill", "m", clock.now))) == []
    assert view.started_at("prefill", "p0") is not None and view.models() == {"m": 0}
    assert [r.message for r in caplog.records].count(
        "instance stale: no new work until its telemetry resumes"
    ) == 1
    view.apply_load(load("prefill", "p0"))
    with caplog.at_level("INFO"):
        view.log_changes(clock.now)
    assert "instance back" in [r.message for r in caplog.records]
    clock.now += 100.0  # silent again, and then its key goes
    view.apply_registry(MirrorEvent("/crescent/c/instances/prefill/p0", None))
    assert view.started_at("prefill", "p0") is None and view.models() == {}


def test_a_conductor_that_heard_nobody_for_a_moment_does_not_call_everyone_stale():
    """Its own loop stalled: every instance's telemetry is equally late, so nobody is stale; one
    that stays silent while the others are heard again is."""
    clock = Clock()
    view = ClusterView(clock=clock)
    register(view, "prefill", "p0")
    register(view, "decode", "d0")
    view.apply_load(load("prefill", "p0"))
    view.apply_load(load("decode", "d0"))
    clock.now += 1.5  # 7.5 periods without reading anything
    assert not any(
        s.is_stale for role in ("prefill", "decode") for s in view.snapshot(role, "m", clock.now)
    )
    view.apply_load(load("decode", "d0"))  # the backlog is read: d0 spoke, p0 did not
    assert [s.is_stale for s in view.snapshot("prefill", "m", clock.now)] == [True]
    assert [s.is_stale for s in view.snapshot("decode", "m", clock.now)] == [False]


def test_snapshots_are_reused_until_the_instance_changes():
    clock = Clock()
    view = ClusterView(clock=clock)
    pricing = Pricing(
        CostPredictors(
            prefill_s=lambda n, p: 1.0, decode_step_s=lambda b, c: 0.1, kv_bytes_per_token=1.0
        )
    )
    register(view, "decode", "d0")
    view.apply_load(load("decode", "d0", num_running=2, kv_used_tokens=10, kv_capacity_tokens=100))
    [first] = view.snapshot("decode", "m", clock.now, pricing)
    assert view.snapshot("decode", "m", clock.now, pricing)[0] is first
    number = view.assign("decode", "d0", "r1", 30)
    [assigned] = view.snapshot("decode", "m", clock.now, pricing)
    assert assigned.kv_used_tokens == 40 and assigned is not first
    counted = {view.conductor_id: number}  # the report counts the assignment
    loaded = load("decode", "d0", num_running=3, kv_used_tokens=50, kv_capacity_tokens=100)
    view.apply_load(msgspec.structs.replace(loaded, received=counted))
    [loaded] = view.snapshot("decode", "m", clock.now, pricing)
    assert (loaded.num_running, loaded.kv_used_tokens, loaded.is_stale) == (3, 50, False)
    clock.now += 10  # silent for many periods
    [silent] = view.snapshot("decode", "m", clock.now, pricing)
    assert silent.is_stale and silent.num_running == 3
    register(view, "decode", "d0", kv_capacity_tokens=7)
    assert view.snapshot("decode", "m", clock.now, pricing)[0] is not silent
    pricing.correction.observe("d0", "decode", 0.1, 0.2)  # its price moved: a new snapshot
    [repriced] = view.snapshot("decode", "m", clock.now, pricing)
    assert repriced.costs.decode_step_s(1, 0) == pytest.approx(0.2)


def test_kept_snapshots_equal_snapshots_built_anew_through_any_changes():
    """The priced view keeps snapshots between decisions and redoes only what changed: after
    any sequence of telemetry, assignments, silences, registry changes and time passing, it
    reports what building every snapshot anew reports."""
    rng = random.Random(3)
    clock = Clock()
    view = ClusterView(clock=clock)
    pricing = Pricing(
        CostPredictors(
            prefill_s=lambda n, p: 1.0, decode_step_s=lambda b, c: 0.1, kv_bytes_per_token=1.0
        )
    )
    ids = [f"p{i}" for i in range(6)]
    for instance_id in ids:
        register(view, "prefill", instance_id)
    handed_before = None
    for _ in range(400):
        event = rng.random()
        instance_id = rng.choice(ids)
        if event < 0.3:
            view.apply_load(
                load(
                    "prefill",
                    instance_id,
                    queue_time_s=rng.choice([0.0, 0.05, 0.3]),
                    running_s=rng.choice([0.0, 0.01]),
                    num_queued=rng.randint(0, 3),
                    received={view.conductor_id: view.next_number() - rng.randint(0, 30)},
                )
            )
        elif event < 0.45:
            request_id = f"r{rng.randint(0, 20)}"
            view.assign("prefill", instance_id, request_id, 10, rng.choice([0.0, 0.02, 0.3]))
        elif event < 0.5:
            view.unassign(f"r{rng.randint(0, 20)}")
        elif event < 0.53:
            register(view, "prefill", instance_id, kv_capacity_tokens=rng.randint(0, 9))
        elif event < 0.55 and instance_id != "p0":
            ids.remove(instance_id)
            view.apply_registry(MirrorEvent(f"/crescent/c/instances/prefill/{instance_id}", None))
        clock.now += rng.choice([0.001, 0.01, 0.1, 0.4, 1.0])
        kept = view.snapshot("prefill", "m", clock.now, pricing)
        anew = view.snapshot("prefill", "m", clock.now)
        assert [msgspec.structs.replace(s, costs=None) for s in kept] == anew
        # The columns the view updates in place say what columns built from its snapshots say.
        built = InstanceColumns.of(list(kept))
        for name in ("queue_s", "is_usable", "kv_free", "num_running", "num_context", "model"):
            assert getattr(kept, name).tolist() == getattr(built, name).tolist(), name
        assert [kept.roots[r] for r in kept.root] == [built.roots[r] for r in built.root]
        # Columns handed out earlier keep what they said: the view copies a column it lent
        # before writing into it.
        assert handed_before is None or _column_values(handed_before[0]) == handed_before[1]
        handed_before = (kept, _column_values(kept))


def _column_values(columns):
    names = ("is_usable", "kv_free", "num_running", "num_context", "model", "root")
    return [getattr(columns, name).tolist() for name in names] + [columns.nodes]


def test_a_running_job_past_its_prediction_leaves_the_queue_behind_it_whole():
    """Queue 0.5 s: the running job's 0.1 s and 0.4 s queued behind it; the running job has
    computed for 0.3 s, and this instance runs twice as slow as its profile."""
    clock = Clock()
    view = ClusterView(clock=clock)
    register(view, "prefill", "p0")
    pricing = Pricing(default=CostPredictors(lambda n, c: 0.01, lambda b, c: 0.001, 1.0))
    for _ in range(3):
        pricing.correction.observe("p0", "prefill", 1.0, 2.0)
    view.apply_load(load("prefill", "p0", queue_time_s=0.5, running_s=0.3, running_predicted_s=0.1))
    # The running job's corrected 0.2 s are spent; the queued 0.4 s count as 0.8 s, all to come.
    assert view.snapshot("prefill", "m", clock.now, pricing)[0].queue_time_s == pytest.approx(0.8)
    assert view.snapshot("prefill", "m", clock.now)[0].queue_time_s == pytest.approx(0.4)
    # Time since the report drains the queue.
    clock.now += 0.5
    assert view.snapshot("prefill", "m", clock.now, pricing)[0].queue_time_s == pytest.approx(0.3)


def test_a_running_job_within_its_prediction_counts_for_what_is_left_of_it():
    clock = Clock()
    view = ClusterView(clock=clock)
    register(view, "prefill", "p0")
    view.apply_load(
        load("prefill", "p0", queue_time_s=0.5, running_s=0.05, running_predicted_s=0.1)
    )
    assert view.snapshot("prefill", "m", clock.now)[0].queue_time_s == pytest.approx(0.45)


def test_telemetry_whose_running_job_outweighs_its_queue_is_ignored(caplog):
    clock = Clock()
    view = ClusterView(clock=clock)
    register(view, "prefill", "p0")
    view.apply_load(load("prefill", "p0", queue_time_s=0.5, running_predicted_s=0.1))
    with caplog.at_level("WARNING"):
        view.apply_load(load("prefill", "p0", queue_time_s=0.1, running_predicted_s=0.5))
    assert view.snapshot("prefill", "m", clock.now)[0].queue_time_s == pytest.approx(0.5)
    assert [r.message for r in caplog.records] == ["ignoring contradictory telemetry"]


def test_the_heard_clock_stops_while_no_instance_is_heard_up_to_the_allowance():
    """Deadlines on one instance's answer run on it: an outage of NATS (nobody heard, the
    view's default stale window of 0.75 s after the last telemetry) is not that instance's
    silence, for up to outage_allowance_s of each outage."""
    clock = Clock()
    view = ClusterView(clock=clock, outage_allowance_s=10.0)
    register(view, "decode", "d0")
    view.apply_load(load("decode", "d0"))
    start = view.heard_clock()
    clock.now += 0.5
    assert view.heard_clock() - start == pytest.approx(0.5)  # heard lately: it runs
    clock.now += 4.5  # nobody heard for 5 s: it stopped at 0.75 s
    assert view.heard_clock() - start == pytest.approx(0.75)
    view.apply_load(load("decode", "d0"))  # heard again: on from where it stopped
    assert view.heard_clock() - start == pytest.approx(0.75)
    clock.now += 0.5
    assert view.heard_clock() - start == pytest.approx(1.25)
    clock.now += 30.0  # a longer outage: stopped for the allowance only
    assert view.heard_clock() - start == pytest.approx(1.25 + 30.0 - 10.0)
    view.apply_load(load("decode", "d0"))
    assert view.heard_clock() - start == pytest.approx(1.25 + 30.0 - 10.0)


def test_a_model_is_listed_once_it_has_a_prefill_and_a_decode_instance():
    """/v1/models offers a model only when a request for it can be served end to end: a decode
    registers once its engine is up, so a prefill alone (a cluster still starting) is not
    enough. Its context is the smallest of both roles'."""
    view = ClusterView(clock=Clock())
    register(view, "prefill", "p0", max_model_len=100)
    register(view, "prefill", "p1", model="other", max_model_len=10)
    assert view.listed_models() == {} and view.models() == {"m": 100, "other": 10}
    register(view, "decode", "d0", max_model_len=80)
    assert view.listed_models() == {"m": 80}
    view.apply_registry(MirrorEvent("/crescent/c/instances/prefill/p0", None))
    assert view.listed_models() == {}


def test_what_every_request_asks_of_all_instances_follows_the_registry_and_telemetry():
    """models(), engine_of(), max_kv_capacity() and total_kv_capacity() are kept between
    requests: each change to what they read shows in the next answer."""
    clock = Clock()
    view = ClusterView(clock=clock)
    assert view.models() == {} and view.engine_of("m") == ""
    assert view.max_kv_capacity("decode", "m") == view.total_kv_capacity("decode", "m") == 0
    register(view, "prefill", "p0", max_model_len=4096, engine="vllm")
    register(view, "decode", "d0", kv_capacity_tokens=1000)
    assert view.models() == {"m": 4096} and view.engine_of("m") == "vllm"
    assert view.max_kv_capacity("decode", "m") == 1000
    register(view, "prefill", "p1", max_model_len=2048, engine="vllm")  # joins
    register(view, "decode", "d1", kv_capacity_tokens=3000)
    assert view.models() == {"m": 2048}
    assert view.max_kv_capacity("decode", "m") == 3000
    assert view.total_kv_capacity("decode", "m") == 4000
    view.apply_load(load("decode", "d1", kv_capacity_tokens=500))  # telemetry's word counts
    assert view.max_kv_capacity("decode", "m") == 1000
    view.apply_load(load("decode", "d0", kv_capacity_tokens=800))
    assert view.max_kv_capacity("decode", "m") == 800
    assert view.total_kv_capacity("decode", "m") == 1300
    register(view, "prefill", "p1", max_model_len=8192, engine="vllm")  # registers anew
    assert view.models() == {"m": 4096}
    unregister(view, "prefill", "p0")  # leaves (never heard: removed at once)
    clock.now += 10  # d0 is no longer heard either
    unregister(view, "decode", "d0")
    assert view.models() == {"m": 8192}
    assert view.max_kv_capacity("decode", "m") == view.total_kv_capacity("decode", "m") == 500
    unregister(view, "prefill", "p1")
    assert view.models() == {} and view.engine_of("m") == ""


def test_whether_any_instance_of_a_role_is_live_reads_as_a_count_of_them_does():
    """has_live (asked for each rejected request) answers as a count > 0 does, role by role and
    model by model, while instances are heard, fall silent and come back."""
    clock = Clock()
    view = ClusterView(clock=clock)

    def agree() -> bool:
        now = clock.now
        return all(
            view.has_live(role, now) == (view.count(role, now) > 0)
            and view.has_live(role, now, model) == (view.count_live(role, model, now) > 0)
            for role in ("prefill", "decode")
            for model in ("m", "other")
        )

    assert agree() and not view.has_live("decode", clock.now)
    assert not view.has_registered("decode", "m")
    register(view, "prefill", "p0")
    register(view, "decode", "d0")
    register(view, "decode", "d1")
    assert view.has_registered("decode", "m") and not view.has_registered("decode", "other")
    assert agree() and view.has_live("decode", clock.now)
    for _ in range(40):  # the prefill is heard, the decodes fall silent
        clock.now += 0.2
        view.apply_load(load("prefill", "p0"))
        assert agree()
    assert not view.has_live("decode", clock.now) and view.has_live("prefill", clock.now)
    view.apply_load(load("decode", "d1"))
    assert agree() and view.has_live("decode", clock.now)
