"""The TBT the conductor learns from: decode's own step times after its first chunk, not its
start, and not when the conductor happened to read the chunks."""

from crescent.conductor.tbt_sample import SteadyGaps


def test_the_wait_for_decodes_first_chunk_is_not_a_gap():
    gaps = SteadyGaps()
    step_at = 0.5  # decode started and loaded the prompt's KV: half a second
    gaps.on_chunk(1, step_at)
    for _ in range(4):
        step_at += 0.01
        gaps.on_chunk(1, step_at)
    assert abs(gaps.mean_gap_s() - 0.01) < 1e-9


def test_coalesced_chunks_count_each_token_and_stalls_count():
    gaps = SteadyGaps()
    gaps.on_chunk(2, 0.0)
    gaps.on_chunk(3, 0.3)  # a stall, then three tokens in one chunk
    gaps.on_chunk(0, 0.4)  # the final chunk may bring no token
    assert abs(gaps.mean_gap_s() - 0.1) < 1e-9


def test_chunks_read_back_to_back_keep_the_gaps_decode_stepped_them_at():
    """The conductor reads the whole stream at once after a stall of its own: the sample is
    still decode's 20 ms steps, not the microseconds between the reads."""
    gaps = SteadyGaps()
    for step in range(6):
        gaps.on_chunk(1, 100.0 + 0.02 * step)
    assert abs(gaps.mean_gap_s() - 0.02) < 1e-9


def test_a_stream_without_a_token_after_its_first_chunk_gives_no_sample():
    gaps = SteadyGaps()
    assert gaps.mean_gap_s() is None
    gaps.on_chunk(1, 0.0)
    gaps.on_chunk(0, 1.0)
    assert gaps.mean_gap_s() is None


def test_a_pause_longer_than_the_stale_window_is_left_out():
    """Decode steps every 20 ms, is stopped for 5 s, then goes on: the sample is its steps,
    not 5 s spread over a few tokens; a stall within the window still counts."""
    gaps = SteadyGaps(pause_s=1.5)
    for step_at in (0.0, 0.02, 0.04):
        gaps.on_chunk(1, step_at)
    gaps.on_chunk(1, 5.04)  # SIGSTOP for 5 s
    for step_at in (5.06, 5.08, 5.38):  # the last one a 0.3 s stall
        gaps.on_chunk(1, step_at)
    assert abs(gaps.mean_gap_s() - (0.04 + 0.34) / 5) < 1e-9
    only_paused = SteadyGaps(pause_s=1.5)
    only_paused.on_chunk(1, 0.0)
    only_paused.on_chunk(3, 9.0)
    assert only_paused.mean_gap_s() is None
