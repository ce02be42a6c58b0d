"""A node's simulated store: LRU per tier, SSD demotion, events when it starts or stops holding."""

from crescent.bench.sim.store import NodeStore


def b(i: int) -> bytes:
    return i.to_bytes(8, "big")


def test_lru_evicts_the_least_recently_used_and_reports_it():
    events = []
    store = NodeStore(
        "n0",
        3,
        on_add=lambda h, n: events.append(("+", h, n)),
        on_remove=lambda h, n: events.append(("-", h, n)),
    )
    store.write([b(1), b(2), b(3)])
    store.read([b(1)])  # 2 is now the least recently used
    store.write([b(4)])
    assert [store.holds(b(i)) for i in range(1, 5)] == [True, False, True, True]
    assert events[-2:] == [("+", b(4), "n0"), ("-", b(2), "n0")]
    assert store.prefix_run([b(1), b(3), b(2), b(4)]) == 2
    assert store.num_blocks == 3


def test_ssd_tier_keeps_demoted_blocks_and_a_read_brings_them_back():
    removed = []
    store = NodeStore("n0", 2, ssd_blocks=1, on_remove=lambda h, n: removed.append(h))
    store.write([b(1), b(2), b(3)])  # 1 → SSD
    assert store.holds(b(1)) and store.num_dram_blocks == 2 and not removed
    assert store.read([b(1)]) == 1  # from SSD: 2 goes down instead
    store.write([b(4)])  # 3 goes down, 2 falls off the SSD
    assert removed == [b(2)] and not store.holds(b(2))


def test_zero_and_unbounded_capacity():
    empty = NodeStore("n0", 0)
    empty.write([b(1)])
    assert not empty.holds(b(1))
    unbounded = NodeStore("n1", None)
    unbounded.write([b(i) for i in range(10_000)])
    assert unbounded.num_blocks == 10_000
