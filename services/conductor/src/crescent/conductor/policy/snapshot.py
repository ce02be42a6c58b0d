"""What a policy sees of the cluster: frozen copies of the conductor's view at decision time.

The conductor's ClusterView builds these (in the simulator too, from simulated telemetry);
policies only read them. Fields added after the
first version have defaults, so older callers keep working.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from crescent.common.block_index import BlockIndex
from crescent.conductor.policy.bandwidth import BandwidthTable
from crescent.conductor.policy.decision import CostPredictors
from crescent.conductor.policy.inflight import InflightRequest, InflightTable


class InstanceSnapshot(msgspec.Struct, frozen=True):
    """One instance as a decision sees it. A msgspec Struct rather than a dataclass because the
    conductor makes one per busy instance per decision (its queue drains with the clock):
    `msgspec.structs.replace` costs ~0.1 µs where `dataclasses.replace` costs ~3 µs."""

    instance_id: str
    node: str
    num_queued: int
    num_running: int
    queue_time_s: float
    kv_used_tokens: int
    kv_capacity_tokens: int
    # Telemetry older than the liveness window: such an instance may be dead, so no policy
    # gives it work even while its registry lease lasts.
    is_stale: bool = False
    # False while the instance drains or reports that it takes no more work ("full").
    is_accepting: bool = True
    # Decode: sum of the context lengths of the running batch, the input of the TBT predictor.
    # None when not reported; the KV in use (an upper bound: it includes reservations) stands in.
    context_tokens: int | None = None
    # Decode: the prompt tokens of the requests counted in num_queued (reserved, not yet in the
    # batch), which join the batch next: a TBT prediction counts them with the batch.
    queued_context_tokens: int = 0
    # The instance's own cost model (its published profile, corrected online); None: the
    # policy's default predictors. Instances with equal models share one object.
    costs: CostPredictors | None = None

    @property
    def is_usable(self) -> bool:
        """Takes new work: its telemetry is current and it says it accepts."""
        return not self.is_stale and self.is_accepting

    @property
    def kv_free_tokens(self) -> int:
        return self.kv_capacity_tokens - self.kv_used_tokens

    @property
    def num_context_tokens(self) -> int:
        return self.kv_used_tokens if self.context_tokens is None else self.context_tokens


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything one scheduling decision reads. The index, bandwidth table and requests in
    flight are the conductor's live objects, passed by reference; a policy never mutates them."""

    prefill: Sequence[InstanceSnapshot]
    decode: Sequence[InstanceSnapshot]
    index: BlockIndex = field(default_factory=BlockIndex)
    bandwidth: BandwidthTable = field(default_factory=BandwidthTable)
    inflight: InflightTable | Sequence[InflightRequest] = ()
