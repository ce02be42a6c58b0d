"""Tokens to text for a response, honouring `stop` strings.

A stop string can straddle tokens, so text that might be the start of one is held back until
the next tokens decide it; what reaches the client never contains a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence

from crescent.common.tokenizer import StreamDecoder


class TextAssembler:
    def __init__(self, decoder: StreamDecoder, stop: Sequence[str]) -> None:
        self._decoder = decoder
        self._stop = list(stop)
        self._pending = ""
        self.is_stopped = False

    def push(self, token_ids: Sequence[int]) -> str:
        """Text that can be sent now; sets is_stopped when a stop string appeared."""
        self._pending += self._decoder.push(token_ids)
        return self._release(final=False)

    def finish(self) -> str:
        """Whatever was held back, once generation has ended."""
        if self.is_stopped:
            return ""
        self._pending += self._decoder.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            out, self._pending = self._pending[: min(hits)], ""
            self.is_stopped = True
            return out
        keep = 0 if final else self._held_back()
        cut = len(self._pending) - keep
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out

    def _held_back(self) -> int:
        """Length of the longest tail of the pending text that starts some stop string."""
        longest = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if stop.startswith(self._pending[-size:]):
                    longest = size
                    break
        return longest
