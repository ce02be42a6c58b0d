"""The requests in flight as columns read as the definitions visit them one by one, through
places, updates and finishes that reuse and grow the slots."""

from hypothesis import given, settings
from hypothesis import strategies as st

from crescent.conductor.policy.inflight import InflightRequest, InflightTable

INSTANCES = ["d0", "d1", "d2", "d3"]


def requests(instance_ids: list[str]) -> st.SearchStrategy[InflightRequest]:
    return st.builds(
        InflightRequest,
        decode_instance_id=st.sampled_from(instance_ids),
        num_context_tokens=st.integers(0, 10_000),
        decode_start_s=st.sampled_from([0.0, 1.0, 2.5, 4.0, 6.0, 9.0]),
        is_decoding=st.booleans(),
        local_prefill_added_s=st.sampled_from([0.0, 0.01, 0.125, 0.5]),
    )


def operations(instance_ids: list[str], num_request_ids: int = 151) -> st.SearchStrategy:
    return st.lists(
        st.tuples(
            st.integers(0, num_request_ids - 1), st.one_of(st.none(), requests(instance_ids))
        ),
        max_size=400,
    )


# Many instances, few requests at a time: instance numbers are given back and given anew.
MANY = [f"d{i}" for i in range(300)]


def load_changes_by_definition(
    inflight: list[InflightRequest], instance_id: str, at_s: float, decode_time_s: float
) -> tuple[int, int]:
    running = context = 0
    for r in inflight:
        if r.decode_instance_id != instance_id:
            continue
        ends = r.decode_start_s + decode_time_s <= at_s
        sign = -ends if r.is_decoding else int(r.decode_start_s <= at_s and not ends)
        running += sign
        context += sign * r.num_context_tokens
    return running, context


def read_as_the_requests_one_by_one(ops, instance_ids, at_s, decode_time_s) -> None:
    table, by_id = InflightTable(), {}
    for number, request in ops:
        request_id = f"r{number}"
        if request is None:
            assert table.pop(request_id) == by_id.pop(request_id, None)
        else:
            table[request_id] = by_id[request_id] = request
    assert dict(table) == by_id
    inflight = list(by_id.values())

    running, context = table.load_changes(instance_ids, at_s, decode_time_s)
    expected = [load_changes_by_definition(inflight, i, at_s, decode_time_s) for i in instance_ids]
    assert list(zip(running.tolist(), context.tolist())) == expected

    for instance_id in instance_ids:
        local = [r.local_prefill_added_s for r in inflight if r.decode_instance_id == instance_id]
        assert abs(table.local_prefill_s(instance_id) - sum(local)) < 1e-9
        ends = [
            r.decode_start_s + decode_time_s
            for r in inflight
            if r.decode_instance_id == instance_id
            and r.is_decoding
            and r.decode_start_s + decode_time_s > at_s
        ]
        assert table.next_decode_end_s(instance_id, decode_time_s, at_s) == (
            min(ends) if ends else None
        )


times = (st.sampled_from([0.0, 2.5, 5.0, 12.0]), st.sampled_from([0.5, 3.0, 7.0]))


@settings(max_examples=200, deadline=None)
@given(operations(INSTANCES[:3]), *times)  # d3 never has a request
def test_the_columns_read_as_the_requests_one_by_one(ops, at_s, decode_time_s):
    read_as_the_requests_one_by_one(ops, INSTANCES, at_s, decode_time_s)


@settings(max_examples=100, deadline=None)
@given(operations(MANY, num_request_ids=12), *times)
def test_the_columns_read_the_same_when_instances_are_numbered_anew(ops, at_s, decode_time_s):
    read_as_the_requests_one_by_one(ops, MANY, at_s, decode_time_s)


def test_instances_gone_do_not_pile_up():
    """A decode instance restarted takes a new id: the numbers stay within a bound of the
    requests in flight, however many instances have come and gone."""
    table = InflightTable()
    for i in range(5000):
        table[f"r{i}"] = InflightRequest(f"decode-{i}", 10, 1.0, True)
        table.pop(f"r{i - 2}")
        if i == 10:  # in flight from here on, numbered anew at each renumbering
            table["long"] = InflightRequest("decode-long", 7, 1.0, True)
    assert len(table._codes) <= 2 * len(table) + 64
    ids = ["decode-long", "decode-4999", "decode-4998", "decode-0"]
    running, context = table.load_changes(ids, 5.0, 1.0)
    assert running.tolist() == [-1, -1, -1, 0] and context.tolist() == [-7, -10, -10, 0]


def test_a_list_of_requests_is_read_as_a_table_and_a_table_as_itself():
    requests = [InflightRequest("d0", 10, 0.0, True), InflightRequest("d0", 5, 0.0, True)]
    table = InflightTable.of(requests)
    assert sorted(table.values(), key=lambda r: r.num_context_tokens) == requests[::-1]
    assert InflightTable.of(table) is table
    running, context = table.load_changes(["d0", "elsewhere"], at_s=2.0, decode_time_s=1.0)
    assert running.tolist() == [-2, 0] and context.tolist() == [-15, 0]
