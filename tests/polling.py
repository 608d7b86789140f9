# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one fake clock and the one poll-until loop of the tests (and of the GPU check, tests/gpu/check.py).

poll_until(predicate, timeout) returns the first truthy value or None; wait_for(...) is the same loop
that fails the test with what it waited for.
"""

from __future__ import annotations

import time


class FakeClock:
    """A monotonic clock that only moves when the code under test sleeps: clock() -> now; clock.sleep(s);
    clock.sleeps lists every sleep."""

    def __init__(self, now=100.0):
        self.now = now
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def poll_until(predicate, timeout, interval=0.05, clock=time.monotonic, sleep=time.sleep):
    """Call `predicate()` until it returns a truthy value or `timeout` seconds pass.

    Returns the truthy value, or None on timeout (the predicate is always called at least once).
    """
    end = clock() + timeout
    while True:
        value = predicate()
        if value:
            return value
        now = clock()
        if now >= end:
            return None
        sleep(min(interval, end - now))


def wait_for(predicate, timeout=30.0, interval=0.1, what="condition", log=None):
    """poll_until, failing the test (AssertionError) after `timeout` seconds: "timed out after T s waiting
    for WHAT", followed by `log()` when given. Returns the truthy value."""
    value = poll_until(predicate, timeout, interval)
    if not value:
        raise AssertionError("timed out after %.1f s waiting for %s%s" % (timeout, what, "\n" + log() if log else ""))
    return value


def wait_exec(pid, argv0, timeout=5.0):
    """Until process `pid` runs `argv0`: right after a fork, and within exec, /proc/PID/cmdline is the parent's or
    empty. Fails the test after `timeout` seconds."""

    def running():
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as cmdline:
                return cmdline.read().startswith(argv0.encode() + b"\0")
        except FileNotFoundError:
            return False

    wait_for(running, timeout, 0.005, "PID %d to run %s" % (pid, argv0))
