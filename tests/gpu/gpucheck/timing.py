# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Deadlines and event timing for the GPU check (pure: clock and sleep are injectable)."""

from __future__ import annotations

import time

# The tests' poll-until loop (tests/polling.py, on sys.path: check.py and pytest put tests/ there).
from polling import poll_until  # noqa: F401  pylint: disable=unused-import


class Deadline:
    """The check's overall time budget. Deadline(seconds, clock=time.monotonic).

    remaining() -> seconds left (>= 0); cap(timeout) -> min(timeout, remaining()).
    """

    def __init__(self, seconds, clock=time.monotonic):
        self.clock = clock
        self.end = clock() + seconds

    def remaining(self):
        return max(0.0, self.end - self.clock())

    def cap(self, timeout):
        return min(timeout, self.remaining())


def time_events(action, events, timeout, interval=0.01, clock=time.monotonic, sleep=time.sleep):
    """Run `action()` (e.g. send SIGKILL), then poll each event until it happens or `timeout` passes.

    `events`: {name: callable() -> bool}, polled in order every `interval` seconds until true; an
    event that happened is not polled again. Returns {"seconds": {name: seconds from the action to
    the first poll that saw it, or None}, "polls": number of rounds, "timed_out": bool}.
    """
    start = clock()
    end = start + timeout
    action()
    seen = {name: None for name in events}
    polls = 0
    while True:
        polls += 1
        for name, happened in events.items():
            if seen[name] is None and happened():
                seen[name] = round(clock() - start, 4)
        now = clock()
        if all(value is not None for value in seen.values()):
            return {"seconds": seen, "polls": polls, "timed_out": False}
        if now >= end:
            return {"seconds": seen, "polls": polls, "timed_out": True}
        sleep(min(interval, end - now))
