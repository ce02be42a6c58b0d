"""The prefix-reuse bench's ratios: of medians, and of each prompt's pair (which a stretch of
the machine running slow for both systems alike does not move)."""

from crescent.bench.prefix_reuse import ratio_of


def test_a_paired_ratio_divides_out_a_slow_stretch_that_a_ratio_of_medians_keeps():
    # The system is 2 % slower than the baseline on every prompt but the fifth, which only the
    # system ran while the machine was slow; prompts 3, 4 and 6 were slow for both. That puts
    # the system's median on a slow prompt and the baseline's on a fast one.
    system = [1.02, 1.02, 2.04, 2.04, 2.04, 2.04, 1.02]
    baseline = [1.00, 1.00, 2.00, 2.00, 1.00, 2.00, 1.00]
    samples = {"a": {(8000, 0): system}, "b": {(8000, 0): baseline}}

    ratio = ratio_of(samples, "a", 0, "b", 0, 8000)

    assert ratio == {"case": "a-0/b-0-8000", "ratio": 2.04, "paired_ratio": 1.02}
