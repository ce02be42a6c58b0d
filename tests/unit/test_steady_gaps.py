"""The TBT the conductor learns from: steady gaps after decode's first chunk, not its start."""

from crescent.conductor.flow import _SteadyGaps


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_wait_for_decodes_first_chunk_is_not_a_gap():
    clock = Clock()
    gaps = _SteadyGaps(clock)
    clock.now = 0.5  # decode started and loaded the prompt's KV: half a second
    gaps.on_chunk(1)
    for _ in range(4):
        clock.now += 0.01
        gaps.on_chunk(1)
    assert abs(gaps.mean_gap_s() - 0.01) < 1e-9


def test_coalesced_chunks_count_each_token_and_stalls_count():
    clock = Clock()
    gaps = _SteadyGaps(clock)
    gaps.on_chunk(2)
    clock.now = 0.3  # a stall, then three tokens in one chunk
    gaps.on_chunk(3)
    gaps.on_chunk(0)  # the final chunk may bring no token
    assert abs(gaps.mean_gap_s() - 0.1) < 1e-9


def test_a_stream_without_a_token_after_its_first_chunk_gives_no_sample():
    clock = Clock()
    gaps = _SteadyGaps(clock)
    assert gaps.mean_gap_s() is None
    gaps.on_chunk(1)
    clock.now = 1.0
    gaps.on_chunk(0)
    assert gaps.mean_gap_s() is None
