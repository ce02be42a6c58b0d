"""Entries, results and deadlines (crescent.transfer.batch)."""

from __future__ import annotations

import asyncio
import time

import pytest

from crescent.transfer import (
    BadEntry,
    BatchResult,
    Deadline,
    Op,
    SegmentNotFound,
    TransferEntry,
    TransferTimeout,
)


def test_valid_entry_passes_check() -> None:
    TransferEntry(Op.READ, "l", 0, "r", 0, 0).check()


@pytest.mark.parametrize(
    "entry",
    [
        TransferEntry(Op.READ, "", 0, "r", 0, 1),
        TransferEntry(Op.READ, "l", 0, "", 0, 1),
        TransferEntry(Op.READ, "l", -1, "r", 0, 1),
        TransferEntry(Op.READ, "l", 0, "r", -1, 1),
        TransferEntry(Op.READ, "l", 0, "r", 0, -1),
        TransferEntry("read", "l", 0, "r", 0, 1),  # type: ignore[arg-type]
    ],
)
def test_bad_entries_raise_bad_entry(entry: TransferEntry) -> None:
    with pytest.raises(BadEntry):
        entry.check()


def test_batch_result_reports_failures_in_order() -> None:
    missing = SegmentNotFound("x")
    result = BatchResult((None, missing, None))
    assert not result.is_ok
    assert result.num_failed == 1
    assert result.failed() == [(1, missing)]
    with pytest.raises(SegmentNotFound):
        result.raise_for_errors()
    BatchResult((None, None)).raise_for_errors()
    assert BatchResult(()).is_ok


def test_deadline_counts_down_and_expires() -> None:
    deadline = Deadline.after(0.05)
    assert 0 < deadline.remaining() <= 0.05
    assert not deadline.is_expired()
    time.sleep(0.06)
    assert deadline.is_expired()
    assert deadline.remaining() == 0.0


def test_deadline_rejects_non_positive_timeouts() -> None:
    with pytest.raises(ValueError):
        Deadline.after(0)


def test_timeout_error_is_also_an_asyncio_timeout() -> None:
    error = Deadline.after(1.5).timeout_error("seg")
    assert isinstance(error, TransferTimeout)
    assert isinstance(error, asyncio.TimeoutError)
    assert (error.segment, error.timeout) == ("seg", 1.5)
