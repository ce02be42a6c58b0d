"""The TBT sample the conductor learns decode step times from (flow.py takes one per
finished stream and hands it to the scheduler's feedback)."""

from __future__ import annotations


class SteadyGaps:
    """The mean time between tokens once decode is running: from the step of the first chunk's
    last token to the step of the last token, per token after that first chunk, stalls
    included. Times are decode's own step times carried by the chunks (`TokenChunk.step_at`),
    not when the conductor read them: chunks that wait in the conductor's socket and are read
    back to back would otherwise look microseconds apart. The wait for the first chunk (decode
    start, KV load) is left out: it is not a step, and for a short answer it would be the
    whole "TBT" and teach the predictor a step many times too slow.

    A gap longer than `pause_s` (the instance's stale window: that long without telemetry, the
    conductor holds it not running) is a pause, SIGSTOP or a host that froze the process, and
    is left out with the tokens that ended it: learnt as a step time it would price the
    instance many times too slow for the next requests, and being priced out, it would get
    none to learn from again."""

    def __init__(self, pause_s: float = float("inf")) -> None:
        self._pause_s = pause_s
        self._last_step_at: float | None = None
        self._stepping_s = 0.0
        self._num_tokens_after_first = 0

    def on_chunk(self, num_tokens: int, step_at: float) -> None:
        if not num_tokens:
            return
        if self._last_step_at is not None:
            gap_s = max(0.0, step_at - self._last_step_at)
            if gap_s <= self._pause_s:
                self._stepping_s += gap_s
                self._num_tokens_after_first += num_tokens
        self._last_step_at = step_at

    def mean_gap_s(self) -> float | None:
        """None when the stream brought no token after its first chunk (outside pauses)."""
        if not self._num_tokens_after_first:
            return None
        return self._stepping_s / self._num_tokens_after_first
