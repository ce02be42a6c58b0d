"""`--plot DIR`: CDFs of TTFT and TBT over the completed requests, one PNG each."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from crescent.bench.replay.records import OK, RequestRecord


def _cdf(path: Path, values: Sequence[float], xlabel: str, slo: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ordered = sorted(values)
    if ordered:
        ax.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post")
    ax.axvline(slo, color="red", linestyle="--", label=f"SLO {slo:g} s")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of completed requests")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_cdfs(
    records: Sequence[RequestRecord], out: Path, ttft_slo_s: float, tbt_slo_s: float
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    ok = [r for r in records if r.status == OK]
    ttft, tbt = out / "ttft_cdf.png", out / "tbt_cdf.png"
    _cdf(ttft, [r.ttft_s for r in ok if r.ttft_s is not None], "TTFT (s)", ttft_slo_s)
    _cdf(
        tbt,
        [r.tbt_s for r in ok if r.intervals_s],
        "TBT: mean of the longest 10 % of intervals (s)",
        tbt_slo_s,
    )
    return [ttft, tbt]
