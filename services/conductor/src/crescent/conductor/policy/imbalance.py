"""The P/D imbalance factor f_im of the paper's dynamic P/D ratio controller (§5.1).

    f_im = (L̄_decode + 1) / (L̄_prefill + 1)

where each L̄ is a mean over recent per-instance load samples after discarding the top and
bottom 10 %, so a few outliers (one instance stuck on a huge prompt) do not move the ratio.
A load sample is an SLO ratio (§4.3.1): predicted TTFT / TTFT SLO for a prefill instance,
predicted TBT / TBT SLO for a decode one. f_im ≫ 1: add decode replicas; f_im ≪ 1: add prefill.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_TRIM = 0.1


def trimmed_mean(values: Sequence[float], trim: float = DEFAULT_TRIM) -> float:
    """Mean after dropping floor(trim·n) samples from each end."""
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}")
    if not values:
        raise ValueError("trimmed mean of no samples")
    ordered = sorted(values)
    cut = int(trim * len(ordered))
    kept = ordered[cut : len(ordered) - cut]
    return sum(kept) / len(kept)


def slo_load(predicted_s: float, slo_s: float) -> float:
    """A load sample: how much of its SLO a predicted TTFT or TBT uses (1.0 = exactly at it)."""
    if not slo_s > 0:
        raise ValueError(f"SLO must be > 0, got {slo_s}")
    return predicted_s / slo_s


def imbalance_factor(
    prefill_loads: Sequence[float], decode_loads: Sequence[float], trim: float = DEFAULT_TRIM
) -> float:
    """f_im over recent load samples of each side; both sides need at least one sample."""
    return (trimmed_mean(decode_loads, trim) + 1.0) / (trimmed_mean(prefill_loads, trim) + 1.0)
