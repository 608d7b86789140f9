"""tests/gpu/gpucheck/timing.py: deadlines, polling and event timing, on a fake clock."""

from gpucheck.timing import Deadline, poll_until, time_events
from polling import FakeClock


def test_deadline_counts_down_and_caps_timeouts():
    clock = FakeClock()
    deadline = Deadline(10, clock=clock)
    clock.now += 4
    assert deadline.remaining() == 6
    assert deadline.cap(30) == 6 and deadline.cap(2) == 2
    clock.now += 20
    assert deadline.remaining() == 0 and deadline.cap(5) == 0


def test_poll_until_returns_the_first_truthy_value():
    clock = FakeClock()
    answers = iter([None, 0, "found", "later"])
    assert poll_until(lambda: next(answers), 10, interval=0.5, clock=clock, sleep=clock.sleep) == "found"
    assert clock.sleeps == [0.5, 0.5]


def test_poll_until_gives_up_at_the_timeout_without_oversleeping():
    clock = FakeClock()
    calls = []
    assert poll_until(lambda: calls.append(clock.now), 1.0, interval=0.4, clock=clock, sleep=clock.sleep) is None
    assert clock.sleeps[:2] == [0.4, 0.4] and abs(clock.sleeps[2] - 0.2) < 1e-9  # the last one ends at the timeout
    assert len(calls) == 4 and clock.now == 101.0


def test_poll_until_with_no_time_left_still_looks_once():
    clock = FakeClock()
    assert poll_until(lambda: True, 0, clock=clock, sleep=clock.sleep) is True
    assert poll_until(lambda: False, 0, clock=clock, sleep=clock.sleep) is None
    assert clock.sleeps == []


def test_time_events_times_each_event_from_the_action():
    clock = FakeClock()
    killed_at = []
    events = {
        "exited": lambda: clock.now >= killed_at[0] + 0.03,
        "unlisted": lambda: clock.now >= killed_at[0] + 0.05,
        "released": lambda: clock.now >= killed_at[0] + 0.52,
    }
    outcome = time_events(
        lambda: killed_at.append(clock.now), events, timeout=5, interval=0.01, clock=clock, sleep=clock.sleep
    )
    assert not outcome["timed_out"]
    seconds = outcome["seconds"]
    assert abs(seconds["exited"] - 0.03) < 0.011 and abs(seconds["unlisted"] - 0.05) < 0.011
    assert abs(seconds["released"] - 0.52) < 0.011
    assert 50 <= outcome["polls"] <= 55


def test_time_events_reports_what_never_happened():
    clock = FakeClock()
    polled = {"released": 0}

    def released():
        polled["released"] += 1
        return False

    outcome = time_events(
        lambda: None,
        {"exited": lambda: True, "released": released},
        timeout=0.1,
        interval=0.01,
        clock=clock,
        sleep=clock.sleep,
    )
    assert outcome["timed_out"]
    assert outcome["seconds"] == {"exited": 0.0, "released": None}
    assert polled["released"] == outcome["polls"]
