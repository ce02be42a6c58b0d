"""Recent: entries kept a fixed time after they are put."""

from crescent.common.recent import Recent


def test_an_entry_is_kept_for_memory_s_and_a_key_put_again_starts_over():
    recent: Recent[str, int] = Recent(memory_s=10.0)
    recent.put("a", 1, now=0.0)
    recent.put("b", 2, now=5.0)
    assert recent.get("a", now=9.9) == 1 and recent.get("a", now=10.0) is None
    recent.put("a", 3, now=8.0)  # again: kept until 18
    assert recent.get("a", now=17.0) == 3 and recent.get("b", now=15.0) is None
    assert recent.get("never", now=0.0) is None


def test_expired_entries_are_dropped_at_a_put():
    recent: Recent[str, int] = Recent(memory_s=10.0)
    for i in range(5):
        recent.put(str(i), i, now=float(i))
    recent.put("late", 9, now=12.5)  # 0, 1 and 2 expired by then
    assert len(recent) == 3 and recent.get("3", now=12.5) == 3
