"""The event loop runs events in time order, equal times in the order they were scheduled."""

from crescent.bench.sim.events import EventLoop


def test_events_run_in_time_order_and_ties_in_scheduling_order():
    loop = EventLoop()
    seen = []
    loop.at(2.0, seen.append, "c")
    loop.at(1.0, seen.append, "a")
    loop.at(1.0, seen.append, "b")
    loop.at(0.5, lambda _: loop.after(0.5, seen.append, "after-b"))  # due at 1.0, scheduled later
    loop.run()
    assert seen == ["a", "b", "after-b", "c"]
    assert loop.now == 2.0 and loop.num_events == 5


def test_an_event_in_the_past_runs_now_not_back_in_time():
    loop = EventLoop()
    times = []
    loop.at(3.0, lambda _: loop.at(1.0, lambda _: times.append(loop.now)))
    loop.run()
    assert times == [3.0]
