"""The decode-load benchmark's arithmetic: which gaps of the running streams overlap the
arrival's wait, and the summary of turns."""

from crescent.bench.decode_load import longest_gap_over, summarise


def test_only_gaps_that_overlap_the_window_count():
    streams = [[0.0, 0.1, 0.5, 0.6], [0.0, 0.15, 0.25, 0.9]]
    assert longest_gap_over(streams, 0.2, 0.22) == 0.4  # 0.1 → 0.5 spans the window
    assert longest_gap_over(streams, 0.7, 0.8) == 0.65  # 0.25 → 0.9 of the second stream
    assert longest_gap_over(streams, 2.0, 3.0) == 0.0  # no gap reaches the window


def test_summary_takes_medians_over_turns_and_percentiles_over_every_gap():
    turns = [
        {
            "load_gap_s": gap,
            "running_gaps_s": [0.01] * 99 + [gap],
            "arrival_ttft_s": 0.3,
            "arrival_second_s": gap + 0.01,
        }
        for gap in (0.05, 0.07, 0.2)
    ]
    summary = summarise(turns)
    assert summary["load_gap_ms"] == 70.0
    assert summary["running_itl_p50_ms"] == 10.0
    assert summary["running_itl_p99_ms"] == 50.0
    assert summary["arrival_second_ms"] == 80.0
