"""The conductor's shadow of the cluster: who is registered (etcd mirror) and how loaded they
are (telemetry). Nothing here is authoritative; a restarted conductor rebuilds it all.

Slow is not dead. An instance is *live* while its registry key exists and its telemetry is
fresh; one that misses STALE_PERIODS telemetry periods is *stale*: it gets no new work, but the
requests it holds wait for it. Only when its registry key goes (its lease expired or it
deregistered) is it gone, and its requests move elsewhere. An instance that says it takes no
work (draining, full) is not *accepting*. Snapshots carry both flags (InstanceSnapshot.is_stale,
is_accepting) and the policies' eligibility filter leaves such instances out.

Nor is an expired lease death when the instance is still heard. etcd stalled past the TTL (a
slow disk, a paused process) expires every lease at once when it resumes, and each instance
registers again a second or so later; meanwhile the cluster would have no instance at all
(404 for every model, 503s). So a key that goes while its instance's telemetry is fresh, and
the instance is not draining (a deliberate stop), leaves the instance in place, *unregistered*,
until it registers again or is unheard for the lease's TTL (`drop_unregistered`): the silence
etcd itself gives an instance before it counts as dead. Not the stale window: etcd's return
sets off a storm (every lease renewed, every store's block keys put again) that delays some
instances' telemetry past it on a busy host, and those instances were dropped, their requests
moved and new ones turned away, a second before they registered again. A stopping instance
says it drains (telemetry, NATS) and then revokes its lease (etcd); the two arrive in either
order, so an unregistered instance whose telemetry says it drains leaves at once.

Silence is judged against what the conductor heard from the others: when its own loop stalls
(a busy machine), every instance's telemetry waits unread in the NATS client and all of them
would look silent at once. So an instance is stale only when others were heard after it by more
than the stale window, or when nothing at all was heard for DEAF_PERIODS periods.

On top of an instance's reported load the conductor counts its own assignments that the report
does not include yet, so a burst of requests does not all land on the instance that looked
idlest a moment ago. Each assignment is numbered (this conductor's numbers only grow) and the
number travels with the job or reservation; telemetry says the highest number the instance had
received from this conductor when it was built (InstanceLoad.received), and only assignments
up to it leave the conductor's count. A report built while a job was still on its way leaves
that job counted. An assignment also leaves the count when its request is done with the
instance (its prefill result, its end) or undone, acknowledged or not.

The scheduler asks for both roles' snapshots, priced, on every request; those are kept between
requests (view_cache) and only what moved since is redone.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import msgspec

from crescent.common.codec import decode
from crescent.common.errors import MessageError
from crescent.common.etcd import MirrorEvent
from crescent.common.messages import InstanceInfo, InstanceLoad
from crescent.conductor.assignments import Assigned, Unacknowledged
from crescent.conductor.policy.decision import CostPredictors
from crescent.conductor.policy.snapshot import InstanceSnapshot
from crescent.conductor.pricing import Pricing, reported_queue_s
from crescent.conductor.view_cache import Key, Refreshed, RoleColumns

log = logging.getLogger(__name__)

STALE_PERIODS = 3
DEAF_PERIODS = 25  # this long without any telemetry: every instance is stale, whoever is deaf


@dataclass
class InstanceState:
    info: InstanceInfo
    registered_at: float
    load: InstanceLoad | None = None
    load_received_at: float = 0.0
    # This conductor's assignments the latest telemetry does not count, added to its load.
    unacknowledged: Unacknowledged = field(default_factory=Unacknowledged)
    was_live: bool = True  # at the last look: each change is logged once
    # When its registry key went while it was still heard (None: registered). See the module doc.
    unregistered_at: float | None = None
    is_contradiction_logged: bool = False  # contradictory telemetry is logged once per instance
    # The last snapshot built with the scheduler's pricing, until registry, telemetry, an
    # assignment or the instance's price changes it: a decision at 512 + 512 instances spent
    # ~2 ms building snapshots anew. Its queue time is that of the last decision.
    snapshot: InstanceSnapshot | None = None
    queue_base_s: float = 0.0  # reported queue × the instance's correction − the running job's time
    # Its cost model and queue ratio as the pricing last gave them, until the pricing says its
    # price moved (Pricing.take_changed): telemetry and assignments do not ask again.
    price: tuple[CostPredictors, float] | None = None

    @property
    def num_assigned_since_load(self) -> int:
        return self.unacknowledged.num_requests

    @property
    def kv_assigned_since_load(self) -> int:
        return self.unacknowledged.num_tokens

    @property
    def queue_s_assigned_since_load(self) -> float:
        return self.unacknowledged.queue_s

    @property
    def context_assigned_since_load(self) -> int:
        return self.unacknowledged.num_context_tokens

    @property
    def kv_capacity_tokens(self) -> int:
        """Its KV room as its telemetry last said, else as it registered."""
        return self.load.kv_capacity_tokens if self.load else self.info.kv_capacity_tokens


@dataclass
class ClusterView:
    clock: Callable[[], float]
    stale_periods: int = STALE_PERIODS
    default_period_s: float = 0.25
    lease_ttl_s: float = 5.0  # the instances' etcd lease TTL: how long one unheard is dead
    instances: dict[tuple[str, str], InstanceState] = field(default_factory=dict)
    last_heard_any: float = 0.0  # when the newest telemetry from any instance was received
    outage_allowance_s: float = 45.0  # how much of one outage heard_clock skips
    _outage_skipped_s: float = 0.0  # what heard_clock skipped in outages that ended
    conductor_id: str = "conductor"  # whose assignment numbers the telemetry acknowledges
    # The next assignment number: from the start time in µs, so that a restarted conductor of
    # the same id never reuses a number its predecessor sent.
    _next_number: int = field(default_factory=lambda: int(time.time() * 1e6))
    # request → instance → its assignment there, until the request is done with the instance
    # (acknowledged or not: what a release takes back)
    _assigned: dict[str, dict[tuple[str, str], Assigned]] = field(default_factory=dict)
    # (role, model) → its priced instances as of the last decision (view_cache)
    _groups: dict[tuple[str, str], RoleColumns] = field(default_factory=dict)
    # What every request asks of all instances, kept until the registry (or, for the KV
    # capacities, an instance's reported capacity) changes: a pass over 1,024 instances per
    # request cost more than the scheduling decision (bench/README.md, control-plane).
    _served: dict[str, int] | None = None  # models()
    _engines: dict[str, str] = field(default_factory=dict)  # engine_of()
    # (largest, total) of max_kv_capacity() and total_kv_capacity()
    _kv_capacity: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)

    def apply_registry(self, event: MirrorEvent) -> tuple[str, str] | None:
        """A change under instances/<role>/<id> in etcd; the (role, id) of an instance it
        removed from the view."""
        parts = event.key.rstrip("/").split("/")
        if len(parts) < 2:
            return None
        role, instance_id = parts[-2], parts[-1]
        if event.value is None:
            state = self.instances.get((role, instance_id))
            if state is not None and self._is_heard_serving(state):
                if state.unregistered_at is None:
                    state.unregistered_at = self.clock()
                    log.warning(
                        "instance's lease ended while it is still heard; kept until it "
                        "registers again, drains or is unheard for the lease's TTL",
                        extra={"role": role, "instance_id": instance_id},
                    )
                return None
            return self._remove((role, instance_id), "its lease ended")
        try:
            info = decode(event.value, InstanceInfo)
        except MessageError as exc:
            log.warning(
                "ignoring malformed registry entry", extra={"key": event.key, "error": str(exc)}
            )
            return None
        known = self.instances.get((role, instance_id))
        if known is None:
            log.info(
                "instance joined",
                extra={"role": role, "instance_id": instance_id, "node": info.node},
            )
            self._registry_changed()
            self.instances[(role, instance_id)] = InstanceState(
                info=info, registered_at=self.clock()
            )
        else:
            if known.unregistered_at is not None:
                known.unregistered_at = None
                log.info(
                    "instance registered again", extra={"role": role, "instance_id": instance_id}
                )
            known.info = info
            known.snapshot = None
            known.price = None
            self._registry_changed()
        return None

    def _registry_changed(self) -> None:
        """An instance joined, left or registered anew: what was kept of all of them is not."""
        self._groups.clear()
        self._served = None
        self._engines.clear()
        self._kv_capacity.clear()

    def _is_heard_serving(self, state: InstanceState) -> bool:
        """Its telemetry is fresh and it is not draining: alive, whatever etcd says."""
        return (
            state.load is not None
            and state.load.not_accepting_reason != "draining"
            and self.is_live(state, self.clock())
        )

    def _remove(self, key: tuple[str, str], why: str) -> tuple[str, str] | None:
        """Take the instance out of the view; `key` if it was in it."""
        self._registry_changed()
        if self.instances.pop(key, None) is None:
            return None
        log.warning("instance gone: " + why, extra={"role": key[0], "instance_id": key[1]})
        return key

    def drop_unregistered(self) -> list[tuple[str, str]]:
        """Remove the instances kept after their lease ended that have been unheard for the
        lease's TTL since (one that says it drains leaves at once, in `apply_load`); called
        every telemetry period. Returns their (role, id)."""
        now = self.clock()
        dropped = [
            key
            for key, state in self.instances.items()
            if state.unregistered_at is not None
            and now - self._last_heard(state) > self.lease_ttl_s
        ]
        for key in dropped:
            self._remove(key, "its lease ended and it went silent")
        return dropped

    def apply_load(self, load: InstanceLoad) -> tuple[str, str] | None:
        """A telemetry report; the (role, id) of an instance it removed from the view: one
        kept after its lease ended that now says it drains."""
        state = self.instances.get((load.role, load.instance_id))
        if state is None:
            log.debug(
                "telemetry from an unregistered instance", extra={"instance_id": load.instance_id}
            )
            return None
        contradiction = _contradiction(load, state.info)
        if contradiction:
            if not state.is_contradiction_logged:
                state.is_contradiction_logged = True
                log.warning(
                    "ignoring contradictory telemetry",
                    extra={
                        "role": load.role,
                        "instance_id": load.instance_id,
                        "contradiction": contradiction,
                    },
                )
            return None
        if state.kv_capacity_tokens != load.kv_capacity_tokens:
            self._kv_capacity.clear()
        state.load = load
        now = self.clock()
        self._outage_skipped_s += self._outage_s(now)
        state.load_received_at = self.last_heard_any = now
        key = (load.role, load.instance_id)
        in_flight = state.unacknowledged
        in_flight.acknowledge(load.received.get(self.conductor_id, 0), state.load_received_at)
        # the report was built before these reached the instance (frequent under load: the
        # fields are built only for a log that shows them)
        if in_flight.by_request and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "telemetry without assignments in flight",
                extra={
                    "role": load.role,
                    "instance_id": load.instance_id,
                    "num_in_flight": len(in_flight.by_request),
                    "queue_s_in_flight": round(
                        sum(a.queue_s for a in in_flight.by_request.values()), 6
                    ),
                },
            )
        if state.unregistered_at is not None and not self._is_heard_serving(state):
            return self._remove(key, "its lease ended and it drains")
        self._mark(key)
        return None

    def _period_s(self, state: InstanceState | None) -> float:
        """The instance's telemetry period (the default until it has reported)."""
        return state.load.period_s if state is not None and state.load else self.default_period_s

    def stale_window_s(self, role: str, instance_id: str) -> float:
        """How long the instance may go unheard before it is stale."""
        return self.stale_periods * self._period_s(self.instances.get((role, instance_id)))

    @staticmethod
    def _last_heard(state: InstanceState) -> float:
        return state.load_received_at if state.load else state.registered_at

    def is_live(self, state: InstanceState, now: float) -> bool:
        period = self._period_s(state)
        last_heard = self._last_heard(state)
        window = self.stale_periods * period
        if now - last_heard <= window:
            return True
        return (
            self.last_heard_any - last_heard <= window and now - last_heard <= DEAF_PERIODS * period
        )

    def heard_clock(self) -> float:
        """A clock that stops while this conductor hears no instance at all (none, its own
        telemetry included, which crosses NATS too, within a stale window: NATS stalled or
        down, or this conductor cut off from it), for up to `outage_allowance_s` of each such
        outage. A deadline on one instance's answer measured on it counts only the silence
        that is that instance's: the answer may wait in NATS, or be asked again once it is
        back (a resend)."""
        now = self.clock()
        return now - self._outage_skipped_s - self._outage_s(now)

    def _outage_s(self, now: float) -> float:
        """How much of the outage going on now (0 when someone is heard) heard_clock skips."""
        deaf_since = self.last_heard_any + self.stale_periods * self.default_period_s
        return min(max(now - deaf_since, 0.0), self.outage_allowance_s)

    def log_changes(self, now: float) -> None:
        """Log each instance that went stale or came back since the last call (once per change)."""
        for (role, instance_id), state in self.instances.items():
            is_live = self.is_live(state, now)
            if is_live != state.was_live:
                state.was_live = is_live
                last_heard = self._last_heard(state)
                if is_live:
                    log.info("instance back", extra={"role": role, "instance_id": instance_id})
                else:
                    log.warning(
                        "instance stale: no new work until its telemetry resumes",
                        extra={
                            "role": role,
                            "instance_id": instance_id,
                            "silent_s": round(now - last_heard, 3),
                        },
                    )

    def node_of(self, role: str, instance_id: str) -> str:
        state = self.instances.get((role, instance_id))
        return state.info.node if state is not None else ""

    def snapshot(
        self, role: str, model: str, now: float, pricing: Pricing | None = None
    ) -> Sequence[InstanceSnapshot]:
        """Registered instances of `role` serving `model`, with this conductor's recent assignments
        added; stale or not accepting ones are flagged, for the policies to leave out. With
        `pricing`, each carries its own cost model and its reported queue is corrected with it.

        Priced, they come as columns (InstanceColumns), kept per instance until something about
        it changes (`pricing` says whose price moved); per decision the queues drain in one
        vectorised pass, and only instances not heard from within the window are judged again."""
        if pricing is None:
            return [
                self._queued(
                    self._build_snapshot(role, i, s, not self.is_live(s, now), None), s, now, 1.0
                )
                for (r, i), s in self.instances.items()
                if r == role and s.info.model == model
            ]
        for key in pricing.take_changed():
            self._mark(key, is_repriced=True)
        group = self._groups.get((role, model))

        def refresh(key: Key) -> Refreshed:
            return self._refresh(key, now, pricing)

        if group is not None:
            group.refresh_dirty(refresh)
        if group is None or not now < group.sure_until:
            members = {
                k: s for k, s in self.instances.items() if k[0] == role and s.info.model == model
            }
            group = self._groups[(role, model)] = RoleColumns.build(members, refresh)
        return group.columns(now)

    def _mark(self, key: Key, is_repriced: bool = False) -> None:
        """Something about the instance changed: its snapshot is built anew at the next look
        (priced anew too when `is_repriced`)."""
        state = self.instances.get(key)
        if state is not None:
            state.snapshot = None
            if is_repriced:
                state.price = None
            group = self._groups.get((key[0], state.info.model))
            if group is not None and key in group.position:
                group.dirty.add(key)

    def _refresh(self, key: Key, now: float, pricing: Pricing) -> Refreshed:
        role, instance_id = key
        state = self.instances[key]
        load = state.load
        if load is not None:
            window_s = self.stale_periods * load.period_s
            is_heard = now - state.load_received_at <= window_s
            # A margin under the window's end, so that before it the test above holds exactly.
            sure_until = state.load_received_at + window_s - 1e-9 if is_heard else -math.inf
        else:
            is_heard, sure_until = False, -math.inf
        is_stale = False if is_heard else not self.is_live(state, now)
        snapshot = state.snapshot
        if snapshot is None or snapshot.is_stale != is_stale:
            if state.price is None:
                state.price = (
                    pricing.predictors(role, instance_id, state.info.model),
                    pricing.queue_ratio(instance_id),
                )
            costs, queue_ratio = state.price
            snapshot = self._build_snapshot(role, instance_id, state, is_stale, costs)
            state.queue_base_s = reported_queue_s(load, queue_ratio) if load is not None else 0.0
        # Its queue time stays as built: the columns drain every row's queue to `now` in one
        # pass (RoleColumns.columns) and a row read as a snapshot takes its queue from there.
        state.snapshot = snapshot
        return Refreshed(snapshot, sure_until)

    def _queued(
        self, snapshot: InstanceSnapshot, state: InstanceState, now: float, ratio: float
    ) -> InstanceSnapshot:
        queue_s = self._queue_s(state, now, ratio) + state.queue_s_assigned_since_load
        return msgspec.structs.replace(snapshot, queue_time_s=queue_s)

    @staticmethod
    def _build_snapshot(
        role: str,
        instance_id: str,
        state: InstanceState,
        is_stale: bool,
        costs: CostPredictors | None,
    ) -> InstanceSnapshot:
        """The snapshot without its queue time, which changes with the clock
        (ClusterView._queue_s)."""
        load = state.load
        return InstanceSnapshot(
            instance_id=instance_id,
            node=state.info.node,
            num_queued=(load.num_queued if load else 0) + state.num_assigned_since_load,
            num_running=load.num_running if load else 0,
            queue_time_s=0.0,
            kv_used_tokens=(load.kv_used_tokens if load else 0) + state.kv_assigned_since_load,
            kv_capacity_tokens=state.kv_capacity_tokens,
            is_stale=is_stale,
            is_accepting=load.is_accepting if load else True,
            context_tokens=load.num_context_tokens if load and role == "decode" else None,
            queued_context_tokens=(load.num_queued_context_tokens if load else 0)
            + state.context_assigned_since_load,
            costs=costs,
        )

    @staticmethod
    def _queue_s(state: InstanceState, now: float, ratio: float) -> float:
        """What is left now of the queue the latest telemetry reported: its predictions scaled by
        the instance's correction, less what ran since (the running job, the telemetry's age)."""
        load = state.load
        if load is None:
            return 0.0
        return max(0.0, reported_queue_s(load, ratio) - max(0.0, now - state.load_received_at))

    def next_number(self) -> int:
        """A new assignment number, for a job or reservation sent before it is assigned."""
        self._next_number += 1
        return self._next_number

    def assign(
        self,
        role: str,
        instance_id: str,
        request_id: str,
        num_tokens: int,
        queue_s: float = 0.0,
        number: int = 0,
        num_context_tokens: int = 0,
    ) -> int:
        """This conductor gives the instance the request's work, numbered `number` (0: a new
        number): it counts on top of the reported load until telemetry acknowledges it
        (`num_context_tokens`: decode, the prompt the request brings to the batch). Returns the
        number, which the job or reservation carries."""
        number = number or self.next_number()
        key = (role, instance_id)
        state = self.instances.get(key)
        if state is not None:
            assigned = Assigned(number, num_tokens, queue_s, num_context_tokens=num_context_tokens)
            state.unacknowledged.add(request_id, assigned)
            self._assigned.setdefault(request_id, {})[key] = assigned
            self._mark(key)
        return number

    def assignment_number(self, role: str, instance_id: str, request_id: str) -> int:
        """The number of the request's unacknowledged assignment to the instance (0: none)."""
        state = self.instances.get((role, instance_id))
        assigned = state.unacknowledged.by_request.get(request_id) if state is not None else None
        return assigned.number if assigned is not None else 0

    def unassign(self, request_id: str, role: str = "", instance_id: str = "") -> None:
        """The request is done with the instance (`role`/`instance_id`; both "": with every
        instance), or its assignment did not happen: it no longer adds to that load."""
        held = self._assigned.get(request_id, {})
        for key in [k for k in held if not role or k == (role, instance_id)]:
            del held[key]
            state = self.instances.get(key)
            if state is not None and state.unacknowledged.remove(request_id):
                self._mark(key)
        if not held:
            self._assigned.pop(request_id, None)

    def release(self, role: str, instance_id: str, request_id: str) -> int:
        """The request's work on the instance is being cancelled: returns the number its cancel
        carries. Work the instance's reports already count is taken off them until a report
        acknowledges that number (assignments.py)."""
        number = self.next_number()
        key = (role, instance_id)
        assigned = self._assigned.get(request_id, {}).get(key)
        state = self.instances.get(key)
        is_counted = state is not None and request_id not in state.unacknowledged.by_request
        self.unassign(request_id, role, instance_id)
        if assigned is not None and is_counted:
            released = Assigned(
                number,
                assigned.num_tokens,
                assigned.queue_s,
                self.clock(),
                assigned.num_context_tokens,
            )
            state.unacknowledged.release(released)
            self._mark(key)
        return number

    def models(self) -> dict[str, int]:
        """Models a registered prefill instance serves → their smallest max_model_len. Registered,
        not live: a model whose instances are briefly silent (a NATS outage) still exists."""
        if self._served is None:
            served: dict[str, int] = {}
            for (role, _), state in self.instances.items():
                if role == "prefill":
                    model = state.info.model
                    served[model] = min(
                        served.get(model, state.info.max_model_len), state.info.max_model_len
                    )
            self._served = served
        return dict(self._served)

    def max_kv_capacity(self, role: str, model: str) -> int:
        """The most KV, in tokens, one registered instance of `role` serving `model` holds (as
        its telemetry last said, else its registration); 0 when none is registered."""
        return self._kv_capacities(role, model)[0]

    def total_kv_capacity(self, role: str, model: str) -> int:
        """The KV, in tokens, the registered instances of `role` serving `model` hold together
        (each as max_kv_capacity reads it)."""
        return self._kv_capacities(role, model)[1]

    def _kv_capacities(self, role: str, model: str) -> tuple[int, int]:
        """Kept until the registry or an instance's reported capacity changes: every request
        asks, and the answer visits every instance."""
        key = (role, model)
        capacities = self._kv_capacity.get(key)
        if capacities is None:
            each = [
                s.kv_capacity_tokens
                for (r, _), s in self.instances.items()
                if r == role and s.info.model == model
            ]
            capacities = self._kv_capacity[key] = (max(each, default=0), sum(each))
        return capacities

    def listed_models(self) -> dict[str, int]:
        """Models a client may be offered (/v1/models): those with a registered prefill and a
        registered decode instance → the smallest max_model_len of either role. A decode
        registers once its engine is up, so at start a model is not listed while every request
        for it would still be refused for want of a decode."""
        by_role: dict[str, dict[str, int]] = {"prefill": {}, "decode": {}}
        for (role, _), state in self.instances.items():
            lengths = by_role.get(role)
            if lengths is not None:
                model, length = state.info.model, state.info.max_model_len
                lengths[model] = min(lengths.get(model, length), length)
        prefill, decode = by_role["prefill"], by_role["decode"]
        return {model: min(prefill[model], decode[model]) for model in prefill.keys() & decode}

    def _live(self, role: str, now: float, model: str | None = None) -> Iterator[InstanceState]:
        """The live instances of `role` (serving `model`, if given), in registry order."""
        return (
            s
            for (r, _), s in self.instances.items()
            if r == role and (model is None or s.info.model == model) and self.is_live(s, now)
        )

    def count(self, role: str, now: float) -> int:
        return sum(1 for _ in self._live(role, now))

    def has_live(self, role: str, now: float, model: str | None = None) -> bool:
        """Whether any instance of `role` (serving `model`, if given) is live. A rejected request
        asks, and a count would visit every instance (~220 µs at 512 + 512, for each rejected
        request under overload); this ends at the first one found."""
        return next(self._live(role, now, model), None) is not None

    def count_live(self, role: str, model: str, now: float) -> int:
        return sum(1 for _ in self._live(role, now, model))

    def count_serving(self, role: str, model: str, now: float) -> int:
        """Live instances of `role` for `model` that are not draining: what the cluster runs
        once the instances being stopped have gone."""
        return sum(
            1
            for s in self._live(role, now, model)
            if not (s.load is not None and s.load.not_accepting_reason == "draining")
        )

    def started_at(self, role: str, instance_id: str) -> float | None:
        """When the registered process of this id started (None: not registered): tells a
        restarted instance from the one that failed under the same id."""
        state = self.instances.get((role, instance_id))
        return state.info.started_at if state is not None else None

    def has_registered(self, role: str, model: str) -> bool:
        return any(r == role and s.info.model == model for (r, _), s in self.instances.items())

    def engine_of(self, model: str) -> str:
        """The engine ("vllm", "emulated") the model's prefill instances run; "" if unknown."""
        if model not in self._engines:
            self._engines[model] = next(
                (
                    s.info.engine
                    for (r, _), s in self.instances.items()
                    if r == "prefill" and s.info.model == model and s.info.engine
                ),
                "",
            )
        return self._engines[model]


def _contradiction(load: InstanceLoad, info: InstanceInfo) -> str:
    """What makes `load` impossible for the registered instance `info`; "" if nothing."""
    if (
        min(load.num_queued, load.num_running, load.kv_used_tokens, load.kv_capacity_tokens) < 0
        or load.queue_time_s < 0
        or load.period_s <= 0
    ):
        return "negative counts or times"
    if load.node != info.node:
        return f"telemetry from node {load.node!r}, registered on node {info.node!r}"
    if load.running_predicted_s > load.queue_time_s:
        return "the running job's predicted time exceeds the whole queue's, which includes it"
    if load.is_accepting and load.not_accepting_reason:
        return f"accepting work, yet not accepting because {load.not_accepting_reason!r}"
    return ""
