"""Trace lines the simulator and the replay client refuse, each with a message naming the line."""

import json

import pytest

from crescent.bench.trace import TraceError, load_trace


def write(tmp_path, records):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            {"timestamp": 5, "input_length": 600, "hash_ids": [1, 2]},
            "missing field 'output_length'",
        ),
        ({"timestamp": 5, "input_length": -1, "output_length": 3, "hash_ids": []}, "lengths >= 1"),
        (
            {"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [1]},
            "contradict input_length 600",
        ),
        (
            {"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [1, "x"]},
            "non-negative integers",
        ),
        ("{not json", "not JSON"),
        (
            {"timestamp": 5.5, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]},
            "must be an integer",
        ),
    ],
)
def test_a_bad_line_is_refused_with_its_line_number(tmp_path, bad, message):
    path = write(tmp_path, [GOOD, bad])
    with pytest.raises(TraceError, match=f"{path}:2: .*{message}"):
        load_trace(path)


def test_timestamps_going_backwards_are_refused(tmp_path):
    path = write(tmp_path, [{**GOOD, "timestamp": 100}, {**GOOD, "timestamp": 99}])
    with pytest.raises(TraceError, match=r":2: timestamp 99 is before the previous line's 100"):
        load_trace(path)


def test_arrivals_are_relative_to_the_first_request_and_limit_cuts(tmp_path):
    path = write(
        tmp_path,
        [{**GOOD, "timestamp": 1000}, "", {**GOOD, "timestamp": 3500}, {**GOOD, "timestamp": 9000}],
    )
    trace = load_trace(path, limit=2)
    assert [r.arrival_s for r in trace] == [0.0, 2.5]
    assert trace[0].num_full_blocks == 1 and trace[1].index == 1
    with pytest.raises(TraceError, match="no requests"):
        load_trace(write(tmp_path, [""]))
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "missing.jsonl")
