"""Decode load now and as projected forward, and the decode choice by predicted TBT.

A decode instance's TBT is one step of its batch, so its load is (batch size, total context).
Early rejection judges the load as it is now; prediction-based rejection (paper §4.3.4) judges
the load at the moment this request's prefill ends, assuming every decode lasts a uniform t_d:
requests that will have finished by then leave, requests whose prefill will have ended by then
join. With nothing leaving or joining the projection is the current load, exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from functools import partial
from operator import mul
from typing import NamedTuple, overload

import numpy as np

from crescent.conductor.policy.columns import NO_MODEL, InstanceColumns
from crescent.conductor.policy.decision import DecodeChoice, DecodeStepFn, ScheduleRequest
from crescent.conductor.policy.inflight import InflightRequest, InflightTable
from crescent.conductor.policy.snapshot import InstanceSnapshot


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


_new_load = partial(tuple.__new__, DecodeLoad)  # DecodeLoad._make in C: one per row read
_SEGMENT = 16  # instances bounded with one evaluation of the base models
_CHUNK = 4 * _SEGMENT  # instances read from numpy into lists at once
PRICE_ALL_UP_TO = 16  # up to this many instances each is priced: bounding costs more
_min = np.minimum.reduce  # ndarray.min() adds a Python-level wrapper per call
_any = np.logical_or.reduce  # and ndarray.any() too


class DecodeLoads(Sequence[DecodeLoad]):
    """Decode instances (as columns) with the load each is judged at, one array a field; read
    as a list of DecodeLoad by the baselines, which visit every instance anyway."""

    __slots__ = ("instances", "num_context", "num_running")

    def __init__(
        self, instances: InstanceColumns, num_running: np.ndarray, num_context: np.ndarray
    ) -> None:
        self.instances = instances
        self.num_running = num_running
        self.num_context = num_context

    @classmethod
    def of(cls, loads: Sequence[DecodeLoad]) -> DecodeLoads:
        """`loads` as columns (themselves if they already are)."""
        if isinstance(loads, DecodeLoads):
            return loads
        return cls(
            InstanceColumns.of([load.instance for load in loads]),
            np.array([load.num_running for load in loads], dtype=np.int64),
            np.array([load.num_context_tokens for load in loads], dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.instances)

    @overload
    def __getitem__(self, i: int) -> DecodeLoad: ...
    @overload
    def __getitem__(self, i: slice) -> list[DecodeLoad]: ...
    def __getitem__(self, i: int | slice) -> DecodeLoad | list[DecodeLoad]:
        if isinstance(i, slice):
            return list(self)[i]
        return DecodeLoad(self.instances[i], int(self.num_running[i]), int(self.num_context[i]))

    def __iter__(self) -> Iterator[DecodeLoad]:
        return map(
            _new_load, zip(self.instances, self.num_running.tolist(), self.num_context.tolist())
        )


def current_loads(instances: Sequence[InstanceSnapshot]) -> DecodeLoads:
    """Each instance's batch as it is about to be: the running requests and those queued for it
    (reserved, by any conductor, and not yet started), which join before a request placed now.
    The instance's own admission counts them the same way (decode/admission.py TbtCheck)."""
    columns = InstanceColumns.of(instances)
    return DecodeLoads(
        columns,
        columns.num_running + columns.num_queued,
        columns.num_context + columns.num_queued_context,
    )


def projected_loads(
    instances: Sequence[InstanceSnapshot],
    inflight: InflightTable | Sequence[InflightRequest],
    at_s: float,
    decode_time_s: float,
) -> DecodeLoads:
    """Each instance's load at time `at_s`, from its current load and the requests in flight."""
    columns = InstanceColumns.of(instances)
    running_change, context_change = InflightTable.of(inflight).load_changes(
        columns.ids, at_s, decode_time_s
    )
    # Telemetry and the conductor's own records can disagree briefly: never below empty.
    return DecodeLoads(
        columns,
        np.maximum(columns.num_running + running_change, 0),
        np.maximum(columns.num_context + context_change, 0),
    )


def choose_by_tbt(
    request: ScheduleRequest, loads: Sequence[DecodeLoad], decode_step_s: DecodeStepFn
) -> DecodeChoice | None:
    """The instance with the least TBT after adding the request, each priced by its own cost
    model (`decode_step_s` for those without one); ties to the smaller id. `loads` must already
    be filtered for KV room (eligibility.eligible_decode).

    A step takes no less time with more requests or more context (DecodeStepFn), and an
    instance's model is its decode ratio times its base's. So instances are visited by context
    in segments: each base priced at the segment's smallest context with the smallest batch,
    times an instance's own ratio, bounds the instance's TBT from below, and a segment's
    instances are priced by bound while it does not exceed the best TBT so far; once no
    instance's bound can be that low, no later instance can win or tie. At hundreds of
    instances a few are priced. Where every instance's base is decode planes (a published
    profile's, CostPredictors.decode_planes), one numpy pass estimates every instance's TBT
    instead, and only those within rounding of the least are priced.
    """
    if not loads:
        return None
    prompt = request.num_prompt_tokens
    if len(loads) <= PRICE_ALL_UP_TO:  # a few: pricing each costs less than bounding them
        tbt, instance_id = min(
            (
                step_fn(instance, decode_step_s)(num_running + 1, num_context + prompt),
                instance.instance_id,
            )
            for instance, num_running, num_context in loads
        )
        return DecodeChoice(instance_id, tbt)
    loads = DecodeLoads.of(loads)
    estimated = _estimated_tbts(loads, prompt)
    if estimated is not None:
        return _least_of(loads, estimated, prompt)
    columns = loads.instances
    best_id, best_tbt = "", math.inf
    smallest_batch = int(_min(loads.num_running)) + 1
    order = loads.num_context.argsort(kind="stable")
    # In context order, per instance its base's index, batch and context (one table) and its
    # ratio, read as lists a chunk of segments at a time: Python beats a few numpy calls per
    # segment, and most decisions end in the first chunk. Floors are indexed by base: a row
    # without a model (NO_MODEL, -1) reads the last.
    table = np.array((columns.root, loads.num_running, loads.num_context)).take(order, 1)
    ratios = columns.decode_ratio.take(order)
    bases = _bases(columns, decode_step_s)
    floors = [0.0] * (len(columns.roots) + 1)
    # One ratio under all: the bound below a segment is a little looser than per base, and
    # costs one reduction instead of three per base.
    least_ratio = float(_min(ratios))
    for chunk in range(0, len(order), _CHUNK):
        chunk_end = chunk + _CHUNK
        bases_of, batches, contexts = table[:, chunk:chunk_end].tolist()
        chunk_ratios, positions = ratios[chunk:chunk_end].tolist(), order[chunk:chunk_end].tolist()
        for start in range(0, len(positions), _SEGMENT):
            context = contexts[start] + prompt
            least_floor = math.inf
            for slot, step in bases:
                floor = floors[slot] = step(smallest_batch, context)
                least_floor = min(least_floor, floor)
            if (least_ratio * least_floor if least_floor >= 0 else -math.inf) > best_tbt:
                return DecodeChoice(best_id, best_tbt)
            end = start + _SEGMENT
            segment = sorted(
                zip(
                    map(mul, chunk_ratios[start:end], map(floors.__getitem__, bases_of[start:end])),
                    positions[start:end],
                    batches[start:end],
                    contexts[start:end],
                )
            )
            for bound, position, num_running, num_context in segment:
                if bound > best_tbt:  # so are the rest of the segment's
                    break
                costs = columns.costs_of(position)
                step_s = decode_step_s if costs is None else costs.decode_step_s
                tbt = step_s(num_running + 1, num_context + prompt)
                instance_id = columns.id_of(position)
                if tbt < best_tbt or (tbt == best_tbt and instance_id < best_id) or not best_id:
                    best_id, best_tbt = instance_id, tbt
    return DecodeChoice(best_id, best_tbt)


def _estimated_tbts(loads: DecodeLoads, prompt: int) -> np.ndarray | None:
    """Every instance's TBT once a `prompt`-token request joins its batch, in one pass: its
    base's planes at its batch and context (summed in DecodePlane.seconds' order), the slowest
    plane, times its decode ratio. None where an instance has no model or a base has no planes."""
    columns = loads.instances
    planes = [root.decode_planes for root in columns.roots]
    if not all(planes) or _any(columns.root == NO_MODEL):
        return None
    width = max(map(len, planes))  # a base with fewer planes repeats its first (max unmoved)
    table = np.array([base + base[:1] * (width - len(base)) for base in planes])
    # (plane, coefficient, instance): each plane's coefficients as rows over the instances
    terms = table.transpose(1, 2, 0).take(columns.root, axis=2)
    batch, context = loads.num_running + 1, loads.num_context + prompt
    step = None
    for base_s, per_request_s, per_context_s in terms:
        seconds = base_s + per_request_s * batch + per_context_s * context
        step = seconds if step is None else np.maximum(step, seconds)
    return columns.decode_ratio * step


def _least_of(loads: DecodeLoads, estimated: np.ndarray, prompt: int) -> DecodeChoice:
    """The least TBT, ties to the smaller id, among the instances whose estimate is within
    rounding of the least estimate, each priced by its own model (the estimate sums in another
    order than a derived model's function may)."""
    columns = loads.instances
    least = float(_min(estimated))
    near = (estimated <= least + 2 * (abs(least) * 1e-9 + 1e-12)).nonzero()[0].tolist()
    best_id, best_tbt = "", math.inf
    for position in near:
        step_s = columns.costs_of(position).decode_step_s  # a row with a base has a model
        batch, context = int(loads.num_running[position]), int(loads.num_context[position])
        tbt = step_s(batch + 1, context + prompt)
        instance_id = columns.id_of(position)
        if tbt < best_tbt or (tbt == best_tbt and instance_id < best_id) or not best_id:
            best_id, best_tbt = instance_id, tbt
    return DecodeChoice(best_id, best_tbt)


def _bases(columns: InstanceColumns, default: DecodeStepFn) -> list[tuple[int, DecodeStepFn]]:
    """Per base model of the rows, its index in the floors (-1: rows without a model, priced by
    `default`) and its step model."""
    counts = np.bincount(columns.root + 1, minlength=len(columns.roots) + 1).tolist()
    return [
        (slot - 1, default if slot == 0 else columns.roots[slot - 1].decode_step_s)
        for slot, count in enumerate(counts)
        if count
    ]


def choice_for(
    request: ScheduleRequest, load: DecodeLoad, decode_step_s: DecodeStepFn
) -> DecodeChoice:
    """A baseline's pick, with the same TBT prediction the TBT-driven choice would report."""
    return DecodeChoice(load.instance.instance_id, load.tbt_with(request, decode_step_s))
