"""One controller window's measurements: load samples of each side and SLO outcomes.

Loads are SLO ratios (policy/imbalance.py): a prefill instance's queue time over the TTFT SLO,
a decode instance's predicted step time over the TBT SLO. A window keeps every sample taken in
it and reduces each side to its trimmed mean (the paper's §5.1: top and bottom 10 % dropped),
so f_im over a window is the paper's factor. SLO attainment is the share of first tokens that
came within the TTFT SLO and of token gaps within the TBT SLO.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from crescent.conductor.policy.imbalance import trimmed_mean


@dataclass(frozen=True)
class RatioSignal:
    """What the controller reads at the end of a window. A load is None when its side sent no
    sample; an attainment is None when nothing was measured against that SLO."""

    prefill_load: float | None
    decode_load: float | None
    ttft_attainment: float | None = None
    tbt_attainment: float | None = None

    @property
    def imbalance(self) -> float | None:
        """f_im = (L̄_decode + 1) / (L̄_prefill + 1); None without both sides."""
        if self.prefill_load is None or self.decode_load is None:
            return None
        return (self.decode_load + 1.0) / (self.prefill_load + 1.0)

    def load(self, role: str) -> float:
        value = self.prefill_load if role == "prefill" else self.decode_load
        return 0.0 if value is None else value


@dataclass
class _Tally:
    num_within: int = 0
    num_total: int = 0

    def add(self, is_within: bool) -> None:
        self.num_within += is_within
        self.num_total += 1

    @property
    def share(self) -> float | None:
        return self.num_within / self.num_total if self.num_total else None


@dataclass
class RatioWindow:
    """Collects one window's samples; `close` returns its signal and starts the next window."""

    ttft_slo_s: float
    tbt_slo_s: float
    prefill_loads: list[float] = field(default_factory=list)
    decode_loads: list[float] = field(default_factory=list)
    _ttft: _Tally = field(default_factory=_Tally)
    _tbt: _Tally = field(default_factory=_Tally)

    def add_loads(self, prefill: Iterable[float], decode: Iterable[float]) -> None:
        """One look at the cluster: each usable instance's SLO load."""
        self.prefill_loads.extend(prefill)
        self.decode_loads.extend(decode)

    def add_ttft(self, ttft_s: float) -> None:
        self._ttft.add(ttft_s <= self.ttft_slo_s)

    def add_tbt(self, tbt_s: float) -> None:
        self._tbt.add(tbt_s <= self.tbt_slo_s)

    def close(self) -> RatioSignal:
        signal = RatioSignal(
            prefill_load=trimmed_mean(self.prefill_loads) if self.prefill_loads else None,
            decode_load=trimmed_mean(self.decode_loads) if self.decode_loads else None,
            ttft_attainment=self._ttft.share,
            tbt_attainment=self._tbt.share,
        )
        self.prefill_loads, self.decode_loads = [], []
        self._ttft, self._tbt = _Tally(), _Tally()
        return signal
