"""The syntax of the local-prefill setting (conditional disaggregation), read here alone: by the
conductor and the simulator, which turn it into their policy's rule, and by `crescent up`,
which checks it before a cluster starts, so that a typo is a command-line error rather than a
conductor that stops while the others start."""

from __future__ import annotations

from typing import Literal

LocalPrefillMode = Literal["off", "tokens", "auto"]


def parse_local_prefill(text: str) -> tuple[LocalPrefillMode, int]:
    """(mode, threshold) of `off` (or 0), `auto`, or a number of uncached tokens; ValueError
    for anything else."""
    value = text.strip().lower()
    if value in ("off", "0"):
        return "off", 0
    if value == "auto":
        return "auto", 0
    if value.isdigit():
        return "tokens", int(value)
    raise ValueError(f"expected off, auto or a number of tokens, got {text!r}")
