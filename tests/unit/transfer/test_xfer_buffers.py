"""A caller's buffers as the local side of a batch: which memory they lie in, and the segment
and registry entry made of it (local only: never given an id a peer could name)."""

import numpy as np
import pytest

from crescent.transfer.buffers import BufferSegment, buffer_regions
from crescent.transfer.errors import SegmentNotFound
from crescent.transfer.registry import SegmentRegistry


def test_blocks_sliced_from_one_array_are_one_region_at_their_offsets():
    array = np.arange(4096, dtype=np.uint8)
    blocks = [memoryview(array[start : start + 512]).cast("B") for start in (1024, 0, 3072)]
    regions, places = buffer_regions(blocks)
    assert len(regions) == 1 and regions[0].nbytes == 4096
    assert places == [(0, 1024), (0, 0), (0, 3072)]


def test_separate_buffers_are_separate_regions_and_a_repeated_one_is_shared():
    first, second = bytearray(b"a" * 100), bytearray(b"b" * 100)
    payload = bytes(64)
    buffers = [memoryview(b).cast("B") for b in (first, second, payload, payload)]
    regions, places = buffer_regions(buffers)
    assert [bytes(r) for r in regions] == [bytes(first), bytes(second), payload]
    assert places == [(0, 0), (1, 0), (2, 0), (2, 0)]


def test_slices_of_an_array_not_in_c_order_are_each_their_own_region():
    fortran = np.zeros((128, 4), dtype=np.uint8, order="F")
    columns = [memoryview(fortran[:, column]).cast("B") for column in (0, 1)]
    regions, places = buffer_regions(columns)
    assert [r.nbytes for r in regions] == [128, 128] and places == [(0, 0), (1, 0)]


def test_a_row_of_a_strided_view_lies_in_the_array_the_view_was_taken_from():
    root = np.zeros((8, 256), dtype=np.uint8)
    regions, places = buffer_regions([memoryview(root[:, :128][3]).cast("B")])
    assert regions[0].nbytes == root.nbytes and places == [(0, 3 * 256)]


def test_a_buffer_segment_views_the_callers_memory():
    memory = bytearray(16)
    segment = BufferSegment("buf", memoryview(memory))
    segment.view()[2:4] = b"xy"
    assert memory[2:4] == b"xy" and segment.size == 16
    segment.close()
    with pytest.raises(ValueError, match="closed"):
        segment.view()


def test_a_local_only_segment_is_found_by_name_and_never_by_id():
    registry = SegmentRegistry()
    segment = BufferSegment("buf", memoryview(bytearray(8)))
    registry.add_local(segment)
    assert registry.get("buf") is segment and registry.is_local_only("buf")
    assert registry.by_id(0) is None and registry.by_id(1) is None
    with pytest.raises(SegmentNotFound):
        registry.id_of("buf")
    with pytest.raises(ValueError, match="already registered"):
        registry.add_local(segment)
    assert registry.remove_local("buf") is segment and registry.find("buf") is None
