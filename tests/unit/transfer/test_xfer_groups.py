"""A batch read into columns: grouping by (op, local, remote), the type gate, and the bounds
checks the engine relies on."""

from __future__ import annotations

import numpy as np
import pytest

from crescent.transfer import Op, TransferEntry
from crescent.transfer.groups import columns_of, fits, misfits, to_columns


def _entry(local_offset=0, remote_offset=0, length=16, remote="r", op=Op.WRITE):
    return TransferEntry(op, "l", local_offset, remote, remote_offset, length)


def test_one_key_is_one_group_in_entry_order() -> None:
    entries = [_entry(i * 16, 1000 - i * 16) for i in range(5)]
    (columns,) = to_columns(entries)
    assert columns.key == (Op.WRITE, "l", "r")
    assert list(columns.indices) == [0, 1, 2, 3, 4]
    assert columns.local_offsets == [0, 16, 32, 48, 64]
    assert columns.remote_offsets == [1000, 984, 968, 952, 936]


def test_mixed_keys_are_grouped_and_keep_their_batch_indices() -> None:
    entries = [_entry(0), _entry(1, remote="s"), _entry(2, op=Op.READ), _entry(3, remote="s")]
    groups = {c.key: (list(c.indices), c.local_offsets) for c in to_columns(entries)}
    assert groups == {
        (Op.WRITE, "l", "r"): ([0], [0]),
        (Op.WRITE, "l", "s"): ([1, 3], [1, 3]),
        (Op.READ, "l", "r"): ([2], [2]),
    }


@pytest.mark.parametrize("value", [1.0, None, "8", np.int64(8)])
def test_anything_but_ints_is_sent_to_the_entry_by_entry_check(value) -> None:
    with pytest.raises(TypeError):
        to_columns([_entry(), _entry(local_offset=value)])


def test_columns_of_checked_entries_takes_any_integral_type() -> None:
    entries = [_entry(np.int64(32)), _entry(local_offset=None), _entry(np.uint32(64))]
    (columns,) = columns_of(entries, [0, 2])
    assert list(columns.indices) == [0, 2]
    assert columns.local_offsets == [32, 64] and type(columns.local_offsets[0]) is int


def test_bounds_are_checked_on_both_sides_and_lengths_must_be_positive() -> None:
    (columns,) = to_columns([_entry(0, 0, 16), _entry(84, 0, 16), _entry(0, 100, 16)])
    assert fits(columns, 100, 116) and not fits(columns, 99, 116) and not fits(columns, 100, 115)
    (columns,) = to_columns(
        [_entry(0, 0, 16), _entry(-1, 0, 1), _entry(0, 0, 0), _entry(0, 110, 16), _entry(0, -3, 1)]
    )
    assert not fits(columns, 100, 116)
    assert misfits(columns, 100, 116) == ([1, 3, 4], [2])
