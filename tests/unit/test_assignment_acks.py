"""The conductor's count of its own assignments on top of an instance's reported load: an
assignment leaves it when telemetry says it was received (InstanceLoad.received), not when
any telemetry arrives, so a report built while a job was on its way does not erase that job."""

from hypothesis import given, settings
from hypothesis import strategies as st

from crescent.common.codec import encode
from crescent.common.etcd import MirrorEvent
from crescent.common.messages import InstanceInfo, InstanceLoad
from crescent.common.received import ReceivedAssignments
from crescent.conductor.assignments import Assigned, Unacknowledged
from crescent.conductor.cluster_view import ClusterView


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def view_with(*keys: tuple[str, str], conductor_id: str = "c1") -> ClusterView:
    view = ClusterView(clock=Clock(), conductor_id=conductor_id)
    for role, instance_id in keys:
        info = InstanceInfo(role=role, instance_id=instance_id, node="n", model="m")
        view.apply_registry(
            MirrorEvent(f"/crescent/c/instances/{role}/{instance_id}", encode(info))
        )
    return view


def report(role: str, instance_id: str, received: dict[str, int], **fields) -> InstanceLoad:
    return InstanceLoad(
        role=role,
        instance_id=instance_id,
        node="n",
        sent_at=0,
        period_s=0.2,
        received=received,
        **fields,
    )


def prefill_of(view: ClusterView):
    [snapshot] = view.snapshot("prefill", "m", view.clock())
    return snapshot


def test_telemetry_that_crosses_an_assignment_keeps_the_one_still_on_its_way():
    """r1 reached the worker before it built its report, r2 did not: the report counts r1
    (num_queued 1, 0.5 s), and the conductor still adds r2. The old view, which zeroed its
    count on every report, priced this instance at 0.5 s with one job."""
    view = view_with(("prefill", "p0"))
    first = view.assign("prefill", "p0", "r1", 100, queue_s=0.5)
    view.assign("prefill", "p0", "r2", 200, queue_s=0.25)
    assert (prefill_of(view).num_queued, prefill_of(view).queue_time_s) == (2, 0.75)

    view.apply_load(report("prefill", "p0", {"c1": first}, num_queued=1, queue_time_s=0.5))
    crossed = prefill_of(view)
    assert (crossed.num_queued, crossed.queue_time_s) == (2, 0.75)

    second = view.assignment_number("prefill", "p0", "r2")
    view.apply_load(report("prefill", "p0", {"c1": second}, num_queued=2, queue_time_s=0.75))
    assert (prefill_of(view).num_queued, prefill_of(view).queue_time_s) == (2, 0.75)
    assert view.assignment_number("prefill", "p0", "r2") == 0  # acknowledged: nothing added


def test_a_decode_reservation_counts_its_kv_until_a_report_includes_it():
    view = view_with(("decode", "d0"))
    number = view.assign("decode", "d0", "r1", 300)
    before = report("decode", "d0", {}, kv_used_tokens=50, kv_capacity_tokens=1000)
    view.apply_load(before)
    [snapshot] = view.snapshot("decode", "m", view.clock())
    assert (snapshot.kv_used_tokens, snapshot.num_queued) == (350, 1)
    after = report("decode", "d0", {"c1": number}, kv_used_tokens=350, kv_capacity_tokens=1000)
    view.apply_load(after)
    [snapshot] = view.snapshot("decode", "m", view.clock())
    assert (snapshot.kv_used_tokens, snapshot.num_queued) == (350, 0)


def test_a_decode_reservation_brings_its_prompt_to_the_queued_context_until_acknowledged():
    view = view_with(("decode", "d0"))
    number = view.assign("decode", "d0", "r1", 300, num_context_tokens=200)
    view.apply_load(
        report("decode", "d0", {}, num_queued=1, num_queued_context_tokens=50)
    )  # another conductor's reservation of a 50-token prompt
    [snapshot] = view.snapshot("decode", "m", view.clock())
    assert (snapshot.num_queued, snapshot.queued_context_tokens) == (2, 250)
    view.apply_load(
        report("decode", "d0", {"c1": number}, num_queued=2, num_queued_context_tokens=250)
    )
    [snapshot] = view.snapshot("decode", "m", view.clock())
    assert (snapshot.num_queued, snapshot.queued_context_tokens) == (2, 250)


def test_each_conductor_reads_only_its_own_acknowledgements():
    mine = view_with(("prefill", "p0"), conductor_id="c1")
    theirs = view_with(("prefill", "p0"), conductor_id="c2")
    mine_number = mine.assign("prefill", "p0", "a", 10, queue_s=0.1)
    theirs.assign("prefill", "p0", "b", 10, queue_s=0.2)
    # p0 has received c1's job and nothing from c2 yet
    load = report("prefill", "p0", {"c1": mine_number}, num_queued=1, queue_time_s=0.1)
    mine.apply_load(load)
    theirs.apply_load(load)
    assert prefill_of(mine).num_queued == 1
    assert prefill_of(theirs).num_queued == 2


def test_a_later_acknowledgement_covers_an_assignment_whose_message_was_lost():
    view = view_with(("prefill", "p0"))
    view.assign("prefill", "p0", "lost", 10, queue_s=0.1)
    later = view.assign("prefill", "p0", "r2", 10, queue_s=0.1)
    view.apply_load(report("prefill", "p0", {"c1": later}, num_queued=1, queue_time_s=0.1))
    assert prefill_of(view).num_queued == 1


def test_an_assignment_leaves_the_count_when_its_request_is_done_with_the_instance():
    """Unacknowledged or not: the prefill's result means the job left the queue; a request's
    end or a refusal means its decode room is free again."""
    view = view_with(("prefill", "p0"), ("decode", "d0"))
    view.assign("prefill", "p0", "r1", 10, queue_s=0.1)
    view.assign("decode", "d0", "r1", 30)
    view.unassign("r1", "prefill", "p0")
    assert prefill_of(view).num_queued == 0
    [decode] = view.snapshot("decode", "m", view.clock())
    assert decode.kv_used_tokens == 30
    view.unassign("r1")
    [decode] = view.snapshot("decode", "m", view.clock())
    assert decode.kv_used_tokens == 0
    view.unassign("r1")  # idempotent


def test_a_worker_reports_the_highest_number_per_conductor_and_forgets_silent_ones():
    received = ReceivedAssignments(forget_after_s=10.0)
    received.note("c1", 5, now=0.0)
    received.note("c1", 3, now=1.0)  # handled out of order: 5 is still received
    received.note("c2", 7, now=1.0)
    received.note("", 9, now=1.0)  # not numbered: not tracked
    received.note("c3", 0, now=1.0)
    assert received.latest(now=2.0) == {"c1": 5, "c2": 7}
    received.note("c2", 8, now=9.0)
    assert received.latest(now=11.5) == {"c2": 8}


def test_cancelled_work_the_instance_counted_is_taken_off_its_reports_until_it_lets_go():
    """The prefill of a request failed and the conductor cancels its decode reservation, which
    the decode's last report counts: until a report acknowledges the cancel, the room is free
    in the conductor's view. The old view took the room back by subtracting it, and this
    version must not count it as still held (the request placed again would find no room)."""
    view = view_with(("decode", "d0"))
    number = view.assign("decode", "d0", "r1", 900)
    counted = report("decode", "d0", {"c1": number}, kv_used_tokens=900, kv_capacity_tokens=1000)
    view.apply_load(counted)
    cancel_number = view.release("decode", "d0", "r1")
    view.unassign("r1")  # the scheduler forgets the request's placement
    [snapshot] = view.snapshot("decode", "m", view.clock())
    assert snapshot.kv_used_tokens == 0
    view.apply_load(counted)  # a report built before the cancel arrived: still free
    [snapshot] = view.snapshot("decode", "m", view.clock())
    assert snapshot.kv_used_tokens == 0
    after = report("decode", "d0", {"c1": cancel_number}, kv_capacity_tokens=1000)
    view.apply_load(after)
    [snapshot] = view.snapshot("decode", "m", view.clock())
    assert (
        snapshot.kv_used_tokens == 0
        and not view.instances[("decode", "d0")].unacknowledged.released
    )


def test_cancelling_work_still_on_its_way_only_forgets_it():
    view = view_with(("prefill", "p0"))
    view.assign("prefill", "p0", "r1", 100, queue_s=0.5)
    view.release("prefill", "p0", "r1")
    assert (prefill_of(view).num_queued, prefill_of(view).queue_time_s) == (0, 0.0)


def test_a_release_never_acknowledged_lapses():
    view = view_with(("decode", "d0"))
    number = view.assign("decode", "d0", "r1", 900)
    view.apply_load(
        report("decode", "d0", {"c1": number}, kv_used_tokens=900, kv_capacity_tokens=1000)
    )
    view.release("decode", "d0", "r1")
    view.clock.now += 60.0
    view.apply_load(report("decode", "d0", {}, kv_used_tokens=900, kv_capacity_tokens=1000))
    [snapshot] = view.snapshot("decode", "m", view.clock())
    assert snapshot.kv_used_tokens == 900


assigned = st.builds(
    Assigned,
    number=st.integers(1, 12),
    num_tokens=st.integers(0, 5000),
    queue_s=st.floats(0, 30, allow_nan=False),
    at=st.sampled_from([0.0, 5.0, 20.0]),
    num_context_tokens=st.integers(0, 5000),
)
changes = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from("abcdef"), assigned),
        st.tuples(st.just("remove"), st.sampled_from("abcdef"), st.none()),
        st.tuples(st.just("release"), st.none(), assigned),
        st.tuples(st.just("acknowledge"), st.integers(0, 12), st.sampled_from([10.0, 40.0])),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(changes)
def test_the_counts_kept_by_each_change_are_the_sums_of_what_is_left(steps):
    """Assignments less releases, kept by adding and taking away, equal the sums anew; the queue
    to the nanosecond each assignment is rounded to."""
    unacknowledged = Unacknowledged()
    for kind, key, value in steps:
        if kind == "add":
            unacknowledged.add(key, value)
        elif kind == "remove":
            unacknowledged.remove(key)
        elif kind == "release":
            unacknowledged.release(value)
        else:
            unacknowledged.acknowledge(key, value)
    assigned, released = (
        unacknowledged.by_request.values(),
        unacknowledged.released.values(),
    )
    assert unacknowledged.num_requests == len(assigned) - len(released)
    assert unacknowledged.num_tokens == sum(a.num_tokens for a in assigned) - sum(
        r.num_tokens for r in released
    )
    assert unacknowledged.num_context_tokens == sum(a.num_context_tokens for a in assigned) - sum(
        r.num_context_tokens for r in released
    )
    expected_s = sum(a.queue_s for a in assigned) - sum(r.queue_s for r in released)
    assert abs(unacknowledged.queue_s - expected_s) <= 1e-9 * (len(assigned) + len(released))
    if not assigned and not released:
        assert unacknowledged.queue_s == 0.0
