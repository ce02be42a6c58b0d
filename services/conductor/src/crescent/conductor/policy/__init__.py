"""Scheduling policy: plain functions over snapshots, no I/O, time passed in (STYLE 2), so the
cluster simulator runs exactly the code the conductor runs."""

from crescent.common.block_index import BlockIndex, PrefixMatch
from crescent.conductor.policy.admission import Admission, Slo, make_admission
from crescent.conductor.policy.bandwidth import BandwidthTable
from crescent.conductor.policy.block_heat import BlockHeat, HotBlock
from crescent.conductor.policy.decision import (
    CostPredictors,
    Decision,
    DecodeChoice,
    PrefillChoice,
    Rejection,
    RejectReason,
    ReplicationOrder,
    ReplicationReason,
    ScheduleRequest,
)
from crescent.conductor.policy.decode_time import DecodeTimeEstimator
from crescent.conductor.policy.imbalance import imbalance_factor
from crescent.conductor.policy.inflight import InflightRequest, InflightTable
from crescent.conductor.policy.local_prefill import LocalPrefill
from crescent.conductor.policy.policies import POLICIES, Policy, make_policy
from crescent.conductor.policy.prefill_model import PrefillTimeModel
from crescent.conductor.policy.snapshot import ClusterSnapshot, InstanceSnapshot

__all__ = [
    "POLICIES",
    "Admission",
    "BandwidthTable",
    "BlockHeat",
    "BlockIndex",
    "ClusterSnapshot",
    "CostPredictors",
    "Decision",
    "DecodeChoice",
    "DecodeTimeEstimator",
    "HotBlock",
    "InflightRequest",
    "InflightTable",
    "InstanceSnapshot",
    "LocalPrefill",
    "Policy",
    "PrefillChoice",
    "PrefillTimeModel",
    "PrefixMatch",
    "RejectReason",
    "Rejection",
    "ReplicationOrder",
    "ReplicationReason",
    "ScheduleRequest",
    "Slo",
    "imbalance_factor",
    "make_admission",
    "make_policy",
]
