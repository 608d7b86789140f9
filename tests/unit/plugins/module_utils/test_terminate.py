# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_terminate against real child processes started by these tests (only those are ever signalled)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils import _procscan, _terminate

IGNORE_SIGTERM = "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)\n"
NO_SUCH_PID = 5000001


@pytest.fixture
def spawn():
    """spawn(argv) -> Popen; every child still running at teardown is killed and reaped."""
    started = []

    def start(argv, **kwargs):
        child = subprocess.Popen(argv, **kwargs)
        started.append(child)
        return child

    yield start
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stdout:
            child.stdout.close()


@pytest.fixture(params=["pidfd", "start-time checks"])
def pidfd_mode(request, monkeypatch):
    """Run a test with pidfds and again as on a kernel without them."""
    if request.param == "pidfd":
        if not hasattr(os, "pidfd_open"):
            pytest.skip("no os.pidfd_open here")
    else:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    return request.param


def holder_of(child):
    return {"pid": child.pid, "start_ticks": _procscan.read_start_ticks(child.pid), "comm": "test-child"}


def wait_state(pid, wanted, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stat = _procscan.read_stat(pid)
        if stat is not None and stat["state"] == wanted:
            return
        time.sleep(0.005)
    raise AssertionError("PID %d never reached state %s" % (pid, wanted))


def test_sigterm_ends_a_child_and_its_zombie_counts_as_exited(spawn, pidfd_mode):
    # The test does not reap the child until end_processes returns: it is a zombie meanwhile.
    child = spawn(["sleep", "60"])
    outcome = _terminate.end_processes([holder_of(child)], grace_period=5.0, kill_wait=2.0)
    assert [e["pid"] for e in outcome["exited"]] == [child.pid]
    (exited,) = outcome["exited"]
    assert exited["signals"] == ["SIGTERM"]
    assert 0 <= exited["exited_after_s"] < 2.0  # far below grace_period: the zombie was seen as exited
    assert outcome["signalled"] == [exited]
    assert outcome["survived"] == [] and outcome["not_signalled"] == []
    assert child.wait(timeout=5) == -signal.SIGTERM


def test_child_ignoring_sigterm_gets_sigkill_after_the_grace_period(spawn, pidfd_mode):
    child = spawn([sys.executable, "-c", IGNORE_SIGTERM], stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"ready\n"
    grace = 0.3
    outcome = _terminate.end_processes([holder_of(child)], grace_period=grace, kill_wait=3.0)
    (exited,) = outcome["exited"]
    assert exited["signals"] == ["SIGTERM", "SIGKILL"]
    assert grace <= exited["exited_after_s"] < grace + 3.0
    assert outcome["survived"] == []
    assert child.wait(timeout=5) == -signal.SIGKILL


def test_several_children_are_ended_together(spawn):
    children = [spawn(["sleep", "60"]) for _number in range(3)]
    outcome = _terminate.end_processes([holder_of(c) for c in children], grace_period=5.0, kill_wait=2.0)
    assert sorted(e["pid"] for e in outcome["exited"]) == sorted(c.pid for c in children)
    assert all(e["signals"] == ["SIGTERM"] for e in outcome["exited"])


def test_reused_pid_is_not_signalled(spawn, pidfd_mode):
    child = spawn(["sleep", "60"])
    stale = dict(holder_of(child))
    stale["start_ticks"] -= 1  # the scan saw another process under this PID
    outcome = _terminate.end_processes([stale], grace_period=0.2, kill_wait=0.2)
    assert outcome["signalled"] == [] and outcome["exited"] == []
    (entry,) = outcome["not_signalled"]
    assert entry["pid"] == child.pid and "PID reused" in entry["reason"]
    assert child.poll() is None
    assert _procscan.read_stat(child.pid)["state"] in ("S", "R")


@pytest.mark.parametrize("reaped", [False, True], ids=["zombie", "reaped"])
def test_child_that_exited_before_the_signal_is_not_signalled(spawn, pidfd_mode, reaped):
    child = spawn(["sleep", "0"])
    holder = holder_of(child)
    if reaped:
        child.wait(timeout=5)
    else:
        wait_state(child.pid, "Z")
    outcome = _terminate.end_processes([holder], grace_period=0.2, kill_wait=0.2)
    assert outcome["signalled"] == [] and outcome["exited"] == [] and outcome["survived"] == []
    (entry,) = outcome["not_signalled"]
    assert entry["reason"] == "exited before any signal"
    assert child.wait(timeout=5) == 0  # it ended by itself, not by a signal


@pytest.mark.parametrize("text, expected", [("SIGTERM", signal.SIGTERM), ("TERM", signal.SIGTERM),
                                            ("term", signal.SIGTERM), ("15", signal.SIGTERM), (" sigint ", signal.SIGINT),
                                            (9, signal.SIGKILL)])
def test_parse_signal(text, expected):
    assert _terminate.parse_signal(text) is expected


@pytest.mark.parametrize("text", ["FOO", "SIGFOO", "", "0", "999"])
def test_parse_signal_rejects(text):
    with pytest.raises(ValueError):
        _terminate.parse_signal(text)


@pytest.mark.parametrize("state, reason_parts", [
    ("D", ("uninterruptible sleep (D)", "nvidia-smi --gpu-reset", "reboot")),
    ("S", ("still running after SIGKILL (state S)",)),
])
def test_survivor_reason(monkeypatch, state, reason_parts):
    # Pure logic: a target that never exits, in a given state; no process and no real signal.
    sent = []
    monkeypatch.setattr(_terminate.Target, "pin", lambda self: True)
    monkeypatch.setattr(_terminate.Target, "exited", lambda self: False)
    monkeypatch.setattr(_terminate.Target, "state", lambda self: state)

    def send(self, sig):
        sent.append(sig)
        self.signals.append(sig.name)
        return True

    monkeypatch.setattr(_terminate.Target, "send", send)
    outcome = _terminate.end_processes([{"pid": NO_SUCH_PID, "start_ticks": 1}], grace_period=0.05, kill_wait=0.05)
    assert sent == [signal.SIGTERM, signal.SIGKILL]
    (survivor,) = outcome["survived"]
    assert survivor["state"] == state and survivor["signals"] == ["SIGTERM", "SIGKILL"]
    assert "exited_after_s" not in survivor
    for part in reason_parts:
        assert part in survivor["reason"]
    assert outcome["exited"] == [] and len(outcome["signalled"]) == 1


def test_first_signal_sigkill_is_not_sent_twice(monkeypatch):
    sent = []
    monkeypatch.setattr(_terminate.Target, "pin", lambda self: True)
    monkeypatch.setattr(_terminate.Target, "exited", lambda self: False)
    monkeypatch.setattr(_terminate.Target, "state", lambda self: "D")
    monkeypatch.setattr(_terminate.Target, "send", lambda self, sig: sent.append(sig) or self.signals.append(sig.name))
    _terminate.end_processes([{"pid": NO_SUCH_PID, "start_ticks": 1}], sig=signal.SIGKILL, grace_period=0.05,
                             kill_wait=0.05)
    assert sent == [signal.SIGKILL]
