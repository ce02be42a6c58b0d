"""Admission: accept a placed request, or reject it before any prefill runs (paper §4.3).

- `none`: accept whatever has an instance.
- `early`: reject when the predicted TTFT exceeds the TTFT SLO or the chosen decode instance's
  predicted TBT, with the request added to its current batch, exceeds the TBT SLO (§4.3.2).
- `predictive`: the same two tests, but the decode load is projected to the moment this
  request's prefill ends, every decode lasting a uniform t_d (§4.3.4). The paper averages the
  projected TBT ratio over all decode instances; here the projected TBT of the instance the
  request will join is tested, because one overloaded instance must not be hidden by idle
  ones, and so that with nothing projected to leave or join it rejects exactly what `early`
  rejects (the tests check this).

An admission also says which decode load the decode choice sees, so a predictive policy picks
the instance that will be least loaded when the request gets there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from crescent.conductor.policy.decision import DecodeChoice, PrefillChoice, Rejection, RejectReason
from crescent.conductor.policy.decode_load import DecodeLoads, current_loads, projected_loads
from crescent.conductor.policy.decode_time import DecodeTimeEstimator
from crescent.conductor.policy.inflight import InflightTable
from crescent.conductor.policy.snapshot import ClusterSnapshot, InstanceSnapshot

DEFAULT_RETRY_AFTER_S = 1.0


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    tbt_s: float

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tbt_s > 0):
            raise ValueError(f"SLOs must be > 0, got TTFT {self.ttft_s} s, TBT {self.tbt_s} s")


class Admission(ABC):
    name: str

    def __init__(self, retry_after_s: float = DEFAULT_RETRY_AFTER_S) -> None:
        if not retry_after_s > 0:
            raise ValueError(f"retry_after_s must be > 0, got {retry_after_s}")
        self.retry_after_s = retry_after_s

    def decode_loads(
        self,
        decodes: Sequence[InstanceSnapshot],
        snapshot: ClusterSnapshot,
        prefill: PrefillChoice,
        now: float,
    ) -> DecodeLoads:
        """The decode load the decode choice and the TBT test see: the current one by default."""
        return current_loads(decodes)

    @abstractmethod
    def judge(
        self, prefill: PrefillChoice, decode: DecodeChoice, snapshot: ClusterSnapshot, now: float
    ) -> Rejection | None:
        """None to accept."""


class NoAdmission(Admission):
    name = "none"

    def judge(
        self, prefill: PrefillChoice, decode: DecodeChoice, snapshot: ClusterSnapshot, now: float
    ) -> Rejection | None:
        return None


class EarlyRejection(Admission):
    name = "early"

    def __init__(self, slo: Slo, retry_after_s: float = DEFAULT_RETRY_AFTER_S) -> None:
        super().__init__(retry_after_s)
        self.slo = slo

    def judge(
        self, prefill: PrefillChoice, decode: DecodeChoice, snapshot: ClusterSnapshot, now: float
    ) -> Rejection | None:
        ttft, tbt = prefill.predicted_ttft_s, decode.predicted_tbt_s
        if ttft > self.slo.ttft_s:
            # The queue must drain by at least the excess before a retry can meet the SLO.
            return Rejection(
                RejectReason.TTFT_SLO,
                f"predicted TTFT {ttft:.3f} s on {prefill.instance_id} > SLO {self.slo.ttft_s} s",
                max(self.retry_after_s, ttft - self.slo.ttft_s),
                ttft,
                tbt,
            )
        if tbt > self.slo.tbt_s:
            return Rejection(
                RejectReason.TBT_SLO,
                f"predicted TBT {tbt:.4f} s on {decode.instance_id} > SLO {self.slo.tbt_s} s",
                self._tbt_retry_after(decode, snapshot, now),
                ttft,
                tbt,
            )
        return None

    def _tbt_retry_after(
        self, decode: DecodeChoice, snapshot: ClusterSnapshot, now: float
    ) -> float:
        return self.retry_after_s


class PredictiveRejection(EarlyRejection):
    name = "predictive"

    def __init__(
        self,
        slo: Slo,
        decode_time: DecodeTimeEstimator | None = None,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
    ) -> None:
        super().__init__(slo, retry_after_s)
        # Owned by the caller, who feeds it observed decode durations.
        self.decode_time = decode_time if decode_time is not None else DecodeTimeEstimator()

    def decode_loads(
        self,
        decodes: Sequence[InstanceSnapshot],
        snapshot: ClusterSnapshot,
        prefill: PrefillChoice,
        now: float,
    ) -> DecodeLoads:
        return projected_loads(
            decodes,
            snapshot.inflight,
            now + prefill.predicted_ttft_s,
            self.decode_time.estimate(now),
        )

    def _tbt_retry_after(
        self, decode: DecodeChoice, snapshot: ClusterSnapshot, now: float
    ) -> float:
        """Until the chosen instance's next request is expected to finish."""
        end_s = InflightTable.of(snapshot.inflight).next_decode_end_s(
            decode.instance_id, self.decode_time.estimate(now), now
        )
        return self.retry_after_s if end_s is None else max(self.retry_after_s, end_s - now)


ADMISSIONS = ("none", "early", "predictive")


def make_admission(
    name: str,
    slo: Slo | None = None,
    decode_time: DecodeTimeEstimator | None = None,
    retry_after_s: float = DEFAULT_RETRY_AFTER_S,
) -> Admission:
    if name == "none":
        return NoAdmission(retry_after_s)
    if name not in ADMISSIONS:
        raise ValueError(f"unknown admission {name!r}; choose one of {', '.join(ADMISSIONS)}")
    if slo is None:
        raise ValueError(f"admission {name!r} needs an slo")
    if name == "early":
        return EarlyRejection(slo, retry_after_s)
    return PredictiveRejection(slo, decode_time, retry_after_s)
