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


def test_past_max_bytes_the_oldest_entries_go_first_and_the_new_one_stays():
    recent: Recent[str, int] = Recent(memory_s=60.0, max_bytes=100)
    for i in range(4):
        recent.put(str(i), i, now=float(i), num_bytes=30)
    assert recent.num_bytes == 90 and len(recent) == 3  # "0" went for "3"
    assert recent.get("0", now=4.0) is None and recent.get("1", now=4.0) == 1
    recent.put("huge", 9, now=5.0, num_bytes=500)  # larger than the bound alone: kept alone
    assert len(recent) == 1 and recent.get("huge", now=5.0) == 9 and recent.num_bytes == 500
    recent.put("huge", 10, now=6.0, num_bytes=20)  # put again: its old size leaves with it
    assert recent.num_bytes == 20
