"""The P/D ratio controller (paper §5.1): desired prefill and decode counts from f_im and SLO
attainment. Pure, like policy/: the conductor and the simulator drive it with their own clock."""

from crescent.conductor.ratio.controller import (
    Action,
    Bounds,
    InstanceCounts,
    Proposal,
    RatioConfig,
    RatioConfigError,
    RatioController,
    RatioDecision,
    propose,
)
from crescent.conductor.ratio.window import RatioSignal, RatioWindow

__all__ = [
    "Action",
    "Bounds",
    "InstanceCounts",
    "Proposal",
    "RatioConfig",
    "RatioConfigError",
    "RatioController",
    "RatioDecision",
    "RatioSignal",
    "RatioWindow",
    "propose",
]
