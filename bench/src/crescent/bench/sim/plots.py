"""One PNG per experiment, drawn from its JSON result (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(ax, labels, values, ylabel: str, title: str) -> None:
    ax.bar(range(len(values)), values, color="#4c72b0")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)


def plot_experiment(name: str, result: dict, path: Path) -> None:
    plt = _figure()
    cases = result["cases"]
    title = f"{name} — {result['trace']} (speed {result['speed']:g})"
    if name == "fig16":
        fig, ax = plt.subplots(figsize=(6, 4))
        points = [(c["cache_tokens"], c["hit_rate"]) for c in cases if c.get("cache_tokens")]
        ax.plot(
            [p[0] / 1e6 for p in points], [p[1] for p in points], marker="o", label="global LRU"
        )
        ceiling = next(c["hit_rate"] for c in cases if c["case"] == "theoretical-max")
        ax.axhline(ceiling, color="grey", linestyle=":", label="theoretical max (infinite cache)")
        ax.axvline(3, color="red", linestyle="--", label="3M tokens (one node's DRAM)")
        ax.set_xscale("log")
        ax.set_xlabel("cache capacity (M tokens)")
        ax.set_ylabel("cache hit rate")
        ax.set_ylim(0, 1)
        ax.legend()
        ax.set_title(title)
    elif name == "fig17":
        fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.5))
        labels = [c["case"] for c in cases]
        _bars(left, labels, [c["hit_rate"] for c in cases], "cache hit rate", "hit rate")
        _bars(
            right,
            labels,
            [c["prefill_compute_s"] for c in cases],
            "s",
            "mean prefill compute per request",
        )
        fig.suptitle(title)
    elif name == "fig5":
        fig, ax = plt.subplots(figsize=(7, 4))
        _bars(
            ax,
            [c["case"] for c in cases],
            [c["mean_ttft_s"] for c in cases],
            "mean TTFT (s)",
            title,
        )
    elif name == "table4":
        fig, (left, right) = plt.subplots(
            1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 2]}
        )
        _bars(
            left,
            [c["case"] for c in cases],
            [c["rejected"] for c in cases],
            "rejected requests",
            "rejections",
        )
        for case, colour in zip(cases, ("#4c72b0", "#dd8452", "#55a868")):
            timeline = case.get("load_timeline", [])
            right.plot(
                [t for t, _, _ in timeline],
                [p for _, p, _ in timeline],
                color=colour,
                alpha=0.8,
                label=f"{case['case']}: prefill",
            )
            right.plot(
                [t for t, _, _ in timeline],
                [d for _, _, d in timeline],
                color=colour,
                linestyle=":",
                label=f"{case['case']}: decode",
            )
        right.set_xlabel("time (s)")
        right.set_ylabel("mean load (predicted time / SLO)")
        right.set_title("load over time (Fig. 6)")
        right.legend(fontsize=7, ncol=3)
        fig.suptitle(title)
    elif name == "fig23":
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
        labels = [c["case"] for c in cases]
        _bars(
            left,
            labels,
            [c["effective_capacity"] for c in cases],
            "effective request capacity",
            "TTFT ≤ 10 s, TBT ≤ 100 ms",
        )
        right.plot(labels, [c["mean_ttft_s"] for c in cases], marker="o", label="mean TTFT (s)")
        twin = right.twinx()
        twin.plot(
            labels,
            [c["mean_tbt_s"] * 1000 for c in cases],
            marker="s",
            color="#dd8452",
            label="mean TBT (ms)",
        )
        right.set_ylabel("mean TTFT (s)")
        twin.set_ylabel("mean TBT (ms)")
        fig.suptitle(title)
    elif name == "ratio":
        _plot_ratio(plt, cases, title)
        fig = plt.gcf()
    else:  # fig1
        fig, ax = plt.subplots(figsize=(7, 4))
        systems = list(dict.fromkeys(c["system"] for c in cases))
        slos = sorted({c["tbt_slo_s"] for c in cases})
        width = 0.8 / len(systems)
        for i, system in enumerate(systems):
            values = [
                next(
                    c["effective_capacity"]
                    for c in cases
                    if c["system"] == system and c["tbt_slo_s"] == s
                )
                for s in slos
            ]
            ax.bar([j + i * width for j in range(len(slos))], values, width, label=system)
        ax.set_xticks(
            [j + 0.4 - width / 2 for j in range(len(slos))],
            [f"TBT ≤ {int(s * 1000)} ms" for s in slos],
        )
        ax.set_ylabel("effective request capacity")
        ax.set_ylim(0, 1)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=len(systems))
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_ratio(plt, cases: list[dict], title: str) -> None:
    """Left: the controller's desired and serving counts over time, the phases shaded; right:
    effective request capacity per phase, each static split against the controller."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]})
    controlled = next(c for c in cases if c["case"] == "controller")
    timeline = controlled["count_timeline"]
    times = [row[0] for row in timeline]
    left.step(
        times, [row[3] for row in timeline], where="post", color="#4c72b0", label="prefill serving"
    )
    left.step(
        times, [row[4] for row in timeline], where="post", color="#dd8452", label="decode serving"
    )
    left.step(
        times,
        [row[1] for row in timeline],
        where="post",
        color="#4c72b0",
        linestyle=":",
        label="prefill desired",
    )
    left.step(
        times,
        [row[2] for row in timeline],
        where="post",
        color="#dd8452",
        linestyle=":",
        label="decode desired",
    )
    start = 0.0
    for i, end in enumerate(controlled["phase_ends_s"]):
        if i % 2:
            left.axvspan(start, end, color="grey", alpha=0.15)
        start = end
    left.set_xlabel("time (s); shaded: decode-heavy phase")
    left.set_ylabel("instances")
    left.legend(fontsize=7)
    left.set_title("P/D ratio controller")
    width = 0.8 / len(cases)
    for i, case in enumerate(cases):
        right.bar([j + i * width for j in range(3)], case["by_phase"], width, label=case["case"])
    right.set_xticks(
        [j + 0.4 - width / 2 for j in range(3)], ["prefill-heavy", "decode-heavy", "prefill-heavy"]
    )
    right.set_ylabel("effective request capacity")
    right.set_ylim(0, 1)
    right.legend(fontsize=7)
    right.set_title("by phase")
    fig.suptitle(title)
