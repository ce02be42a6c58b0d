"""Decode load now and as projected forward, and the decode choice by predicted TBT.

A decode instance's TBT is one step of its batch, so its load is (batch size, total context).
Early rejection judges the load as it is now; prediction-based rejection (paper §4.3.4) judges
the load at the moment this request's prefill ends, assuming every decode lasts a uniform t_d:
requests that will have finished by then leave, requests whose prefill will have ended by then
join. With nothing leaving or joining the projection is the current load, exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import attrgetter, itemgetter
from typing import NamedTuple

from crescent.conductor.policy.decision import DecodeChoice, DecodeStepFn, ScheduleRequest
from crescent.conductor.policy.snapshot import InflightRequest, InstanceSnapshot


class DecodeLoad(NamedTuple):
    instance: InstanceSnapshot
    num_running: int
    num_context_tokens: int

    def tbt_with(self, request: ScheduleRequest, decode_step_s: DecodeStepFn) -> float:
        """Predicted TBT once `request` has joined this batch, by the instance's own cost model
        when it has one (`decode_step_s` otherwise)."""
        step_s = step_fn(self.instance, decode_step_s)
        return step_s(self.num_running + 1, self.num_context_tokens + request.num_prompt_tokens)


def step_fn(instance: InstanceSnapshot, default: DecodeStepFn) -> DecodeStepFn:
    """The decode step model that prices `instance`."""
    return instance.costs.decode_step_s if instance.costs is not None else default


_num_running = itemgetter(1)
_num_context = itemgetter(2)
_BOUND_EVERY = 8  # instances visited per evaluation of the bound


def current_loads(instances: Sequence[InstanceSnapshot]) -> list[DecodeLoad]:
    # tuple.__new__ and the context read inline: a decision builds one load per decode
    # instance, and NamedTuple's Python-level constructor plus a property cost 8× as much.
    new = tuple.__new__
    return [
        new(
            DecodeLoad,
            (s, s.num_running, s.kv_used_tokens if s.context_tokens is None else s.context_tokens),
        )
        for s in instances
    ]


def projected_loads(
    instances: Sequence[InstanceSnapshot],
    inflight: Sequence[InflightRequest],
    at_s: float,
    decode_time_s: float,
) -> list[DecodeLoad]:
    """Each instance's load at time `at_s`, from its current load and the requests in flight."""
    delta: dict[str, list[int]] = {}
    for request in inflight:
        ends_by_then = request.decode_start_s + decode_time_s <= at_s
        if request.is_decoding:
            sign = -1 if ends_by_then else 0
        else:
            sign = 1 if request.decode_start_s <= at_s and not ends_by_then else 0
        if sign:
            change = delta.setdefault(request.decode_instance_id, [0, 0])
            change[0] += sign
            change[1] += sign * request.num_context_tokens
    loads = []
    for s in instances:
        change = delta.get(s.instance_id, (0, 0))
        # Telemetry and the conductor's own records can disagree briefly: never below empty.
        loads.append(
            DecodeLoad(
                s, max(0, s.num_running + change[0]), max(0, s.num_context_tokens + change[1])
            )
        )
    return loads


def choose_by_tbt(
    request: ScheduleRequest, loads: Sequence[DecodeLoad], decode_step_s: DecodeStepFn
) -> DecodeChoice | None:
    """The instance with the least TBT after adding the request, each priced by its own cost
    model (`decode_step_s` for those without one); ties to the smaller id. `loads` must already
    be filtered for KV room (eligibility.eligible_decode).

    A step takes no less time with more requests or more context (DecodeStepFn), so instances
    are visited by context, and once the smallest batch with the next instance's context would
    already be slower than the best so far, under every base model and the smallest decode
    correction of any instance, no later instance can win or tie: at hundreds of instances the
    models are evaluated for a few of them.
    """
    if not loads:
        return None
    best_id, best_tbt = "", math.inf
    prompt = request.num_prompt_tokens
    floor_steps, ratio = _step_floors(loads, decode_step_s)
    fewest_running = min(map(_num_running, loads))
    for visited, (instance, num_running, num_context_tokens) in enumerate(
        sorted(loads, key=_num_context)
    ):
        if visited % _BOUND_EVERY == _BOUND_EVERY - 1:
            floor = min(
                step(fewest_running + 1, num_context_tokens + prompt) for step in floor_steps
            )
            if floor >= 0 and ratio * floor > best_tbt:
                break
        step_s = decode_step_s if instance.costs is None else instance.costs.decode_step_s
        tbt = step_s(num_running + 1, num_context_tokens + prompt)
        if tbt < best_tbt or (tbt == best_tbt and instance.instance_id < best_id) or not best_id:
            best_id, best_tbt = instance.instance_id, tbt
    return DecodeChoice(best_id, best_tbt)


def _step_floors(
    loads: Sequence[DecodeLoad], default: DecodeStepFn
) -> tuple[list[DecodeStepFn], float]:
    """The base step models of the instances' cost models, and the smallest ratio any applies
    to its base: for every instance, step >= ratio · min over bases (bases non-negative)."""
    models = [load.instance.costs for load in loads]
    derived = [model for model in models if model is not None]
    if not derived:
        return [default], 1.0
    roots = [base or model for base, model in zip(map(_base, derived), derived)]
    bases = {id(root): root.decode_step_s for root in dict(zip(map(id, roots), roots)).values()}
    ratio = min(map(_decode_ratio, derived))
    if len(derived) < len(models):
        bases[id(default)] = default
        ratio = min(ratio, 1.0)
    return list(bases.values()), ratio


_decode_ratio = attrgetter("decode_ratio")
_base = attrgetter("base")


def choice_for(
    request: ScheduleRequest, load: DecodeLoad, decode_step_s: DecodeStepFn
) -> DecodeChoice:
    """A baseline's pick, with the same TBT prediction the TBT-driven choice would report."""
    return DecodeChoice(load.instance.instance_id, load.tbt_with(request, decode_step_s))
