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

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _proc, _terminate
import polling
from polling import wait_exec

IGNORE_SIGTERM = "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)\n"
NO_SUCH_PID = 5000001


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
    return {"pid": child.pid, "start_ticks": _proc.read_start_ticks(child.pid), "comm": "test-child"}


def wait_state(pid, wanted, timeout=5.0):
    polling.wait_for(
        lambda: (_proc.read_stat(pid) or {}).get("state") == wanted,
        timeout,
        0.005,
        "PID %d to reach state %s" % (pid, wanted),
    )


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
    assert _proc.read_stat(child.pid)["state"] in ("S", "R")


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


@pytest.mark.parametrize(
    "text, expected",
    [
        ("SIGTERM", signal.SIGTERM),
        ("TERM", signal.SIGTERM),
        ("term", signal.SIGTERM),
        ("15", signal.SIGTERM),
        (" sigint ", signal.SIGINT),
        (9, signal.SIGKILL),
    ],
)
def test_parse_signal(text, expected):
    assert _terminate.parse_signal(text) is expected


@pytest.mark.parametrize("text", ["FOO", "SIGFOO", "", "0", "999"])
def test_parse_signal_rejects(text):
    with pytest.raises(ValueError):
        _terminate.parse_signal(text)


@pytest.mark.parametrize(
    "state, reason_parts",
    [
        ("D", ("uninterruptible sleep (D)", "nvidia-smi --gpu-reset", "reboot")),
        ("S", ("still running after SIGKILL (state S)",)),
    ],
)
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
    _terminate.end_processes(
        [{"pid": NO_SUCH_PID, "start_ticks": 1}], sig=signal.SIGKILL, grace_period=0.05, kill_wait=0.05
    )
    assert sent == [signal.SIGKILL]


# --- end_until_gone: rounds, respawns ---------------------------------------------------------------------------------


def process(pid, start_ticks=None, ppid=4000, cmdline="VLLM::Worker_TP0", comm="VLLM::Worker_TP", parent=None):
    return {
        "pid": pid,
        "start_ticks": start_ticks or pid * 10,
        "ppid": ppid,
        "comm": comm,
        "cmdline": cmdline,
        "parent": parent,
    }


class Rounds:
    """choose() from a script of rounds (the last repeats), and an end_processes that records and signals nothing."""

    def __init__(self, *later, survive=()):
        self.later = list(later)
        self.asked = []
        self.ended = []
        self.survive = set(survive)

    def choose(self, first_round):
        self.asked.append(first_round)
        return list(self.later.pop(0) if len(self.later) > 1 else self.later[0])

    def end_processes(self, targets, sig, grace_period, kill_wait, proc):  # pylint: disable=unused-argument
        self.ended.append([t["pid"] for t in targets])
        entries = [dict(t, signals=[sig.name]) for t in targets]
        return {
            "signalled": entries,
            "exited": [e for e in entries if e["pid"] not in self.survive],
            "survived": [dict(e, state="D") for e in entries if e["pid"] in self.survive],
            "not_signalled": [],
        }


@pytest.fixture
def rounds(monkeypatch):
    def install(*later, survive=()):
        script = Rounds(*later, survive=survive)
        monkeypatch.setattr(_terminate, "end_processes", script.end_processes)
        return script

    return install


def test_end_until_gone_ends_what_appears_until_nothing_is_left(rounds):
    engine, peer, newcomer = (
        process(11, ppid=1, cmdline="a"),
        process(12, ppid=1, cmdline="b"),
        process(13, ppid=1, cmdline="c"),
    )
    script = rounds([engine, newcomer], [])  # the engine is still listed (same start): not again
    result = _terminate.end_until_gone(script.choose, [engine, peer], grace_period=1.0, kill_wait=1.0)
    assert script.ended == [[11, 12], [13]] and script.asked == [False, False]
    assert [e["pid"] for e in result["signalled"]] == [11, 12, 13] == [e["pid"] for e in result["exited"]]
    assert result["survived"] == [] and result["not_signalled"] == [] and result["respawned"] == []


def test_end_until_gone_with_nothing_chosen_signals_nothing(rounds):
    script = rounds([process(11)])
    result = _terminate.end_until_gone(script.choose, [])
    assert script.ended == [] and script.asked == [] and result["signalled"] == [] and result["respawned"] == []


def test_end_until_gone_ends_a_reused_pid_again_but_never_the_same_process_twice(rounds):
    script = rounds([process(11), process(11, start_ticks=999)], [process(11, start_ticks=999)], [])
    result = _terminate.end_until_gone(script.choose, [process(11)], rounds=5)
    assert script.ended == [[11], [11]] and len(script.asked) == 2
    assert [(e["pid"], e["start_ticks"]) for e in result["signalled"]] == [(11, 110), (11, 999)]


def test_end_until_gone_stops_after_rounds(rounds):
    script = rounds(*[[process(20 + n, ppid=1, cmdline="job %d" % n)] for n in range(5)])
    result = _terminate.end_until_gone(script.choose, [process(19, ppid=1, cmdline="job")], rounds=3)
    assert script.ended == [[19], [20], [21]] and len(script.asked) == 2
    assert len(result["signalled"]) == 3 and result["respawned"] == []
    assert _terminate.ROUNDS == 3


def test_end_until_gone_stops_at_the_first_survivor(rounds):
    script = rounds([process(13, ppid=1)], survive=[12])
    result = _terminate.end_until_gone(
        script.choose, [process(11, ppid=1, cmdline="x"), process(12, ppid=1, cmdline="y")]
    )
    assert script.ended == [[11, 12]] and script.asked == []
    assert [e["pid"] for e in result["survived"]] == [12] and [e["pid"] for e in result["exited"]] == [11]


def test_respawns_by_parent_or_by_command_line():
    ended = [
        process(11, ppid=4000, cmdline="VLLM::EngineCore", parent={"pid": 4000, "comm": "torchrun"}),
        process(12, ppid=1, cmdline="python3 train.py"),
    ]
    sibling = process(21, ppid=4000, cmdline="VLLM::Worker_TP3", parent={"pid": 4000, "comm": "torchrun"})
    same_command = process(22, ppid=1, cmdline="python3 train.py")
    orphan = process(23, ppid=1, cmdline="python3 other.py")  # re-parented to init: PID 1 says nothing
    blank = process(24, ppid=1, cmdline="")
    ended.append(process(14, ppid=1, cmdline=""))  # an empty command line (a zombie) says nothing either
    found = _terminate._respawns([sibling, same_command, orphan, blank], ended)
    assert [(f["pid"], f["replaces"], f["parent"]) for f in found] == [
        (21, 11, {"pid": 4000, "comm": "torchrun"}),
        (22, 12, None),
    ]
    assert found[0]["cmdline"] == "VLLM::Worker_TP3"  # the new process itself, with what it replaced


def test_respawn_parent_is_read_from_proc_when_not_known():
    me = _proc.read_stat(os.getpid())
    ended = [process(11, ppid=os.getpid(), cmdline="a")]
    (found,) = _terminate._respawns([process(21, ppid=os.getpid(), cmdline="b")], ended)
    assert found["parent"] == {"pid": os.getpid(), "comm": me["comm"]}


def test_end_until_gone_ends_a_respawned_child(spawn):
    # Real children of this test: the first is ended, then a second with the same command line "comes back".
    first = spawn(["sleep", "61"])
    later = []

    def look(child):
        wait_exec(child.pid, "sleep")
        return dict(holder_of(child), ppid=os.getpid(), cmdline="sleep 61")

    def choose(first_round):
        assert first_round is False
        if later:
            return []
        later.append(spawn(["sleep", "61"]))
        return [look(later[0])]

    result = _terminate.end_until_gone(choose, [look(first)], grace_period=5.0, kill_wait=2.0)
    assert [e["pid"] for e in result["exited"]] == [first.pid, later[0].pid]
    (respawn,) = result["respawned"]
    assert respawn["pid"] == later[0].pid and respawn["replaces"] == first.pid
    assert respawn["parent"] == {"pid": os.getpid(), "comm": _proc.read_stat(os.getpid())["comm"]}
    assert first.wait(timeout=5) == -signal.SIGTERM and later[0].wait(timeout=5) == -signal.SIGTERM


# --- HostLock: one gpu_kill run at a time per host (issue 33 item 10) -------------------------------------------------

# Another run: takes the POSIX record lock on the file argv[1], says so, holds it until killed.
HOLD_LOCK = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)\n"
    "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
    "print('locked', flush=True)\n"
    "time.sleep(60)\n"
)


def hold_lock(spawn, directory):
    child = spawn(
        [sys.executable, "-c", HOLD_LOCK, os.path.join(str(directory), _terminate.LOCK_NAME)], stdout=subprocess.PIPE
    )
    assert child.stdout.readline().strip() == b"locked"
    return child


def test_a_second_run_waits_for_the_lock_and_names_the_run_it_waited_for(spawn, tmp_path):
    other = hold_lock(spawn, tmp_path)
    lock = _terminate.HostLock(dirs=[str(tmp_path)])
    with pytest.raises(_terminate.LockTimeout) as info:
        lock.acquire(0.3)
    assert str(info.value).startswith("another gpu_kill run on this host (PID %d (%s -c " % (other.pid, sys.executable))
    assert "held its lock (%s) for the whole lock_timeout (0.3 s)" % (tmp_path / _terminate.LOCK_NAME) in str(
        info.value
    )
    # Seen from outside (check mode takes no lock).
    assert [h["pid"] for h in _terminate.HostLock(dirs=[str(tmp_path)]).holders()] == [other.pid]

    waiting = _terminate.HostLock(dirs=[str(tmp_path)], sleep=lambda s: other.kill() or other.wait())
    waited = waiting.acquire(10)
    assert waited > 0 and [h["pid"] for h in waiting.waited_for] == [other.pid]
    words = _terminate.waited_words(waited, waiting.waited_for)
    assert "waited %.2f s for another gpu_kill run on this host (PID %d" % (waited, other.pid) in words
    # Held now: another process is kept out until it is released.
    assert try_lock(tmp_path).returncode == 1
    waiting.release()
    assert try_lock(tmp_path).returncode == 0


def try_lock(directory):
    """Another process's attempt to take the lock at once: exit status 0 when it got it, 1 when it is held."""
    code = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n"
        "    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    return subprocess.run([sys.executable, "-c", code, str(directory / _terminate.LOCK_NAME)], timeout=10, check=False)


def test_the_lock_is_the_process_s_own_never_its_forked_workers(tmp_path):
    """The NVML and /proc scan workers are forked while the lock is held; one stuck in the driver (state D) may be
    left behind. A record lock is not inherited: the next run is not kept out by such a worker."""
    lock = _terminate.HostLock(dirs=[str(tmp_path)])
    assert lock.acquire(0) == 0.0
    worker = _proc.fork_worker(lambda: __import__("time").sleep(30))
    try:
        lock.release()
        assert try_lock(tmp_path).returncode == 0
    finally:
        os.kill(worker, signal.SIGKILL)
        os.waitpid(worker, 0)


def test_a_symlink_planted_where_the_lock_goes_is_never_followed(tmp_path):
    target = tmp_path / "elsewhere"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / _terminate.LOCK_NAME).symlink_to(target)
    lock = _terminate.HostLock(dirs=[str(tmp_path / "run"), str(tmp_path)])
    assert lock.acquire(0) == 0.0 and lock.path == str(tmp_path / _terminate.LOCK_NAME)
    assert not target.exists()
    lock.release()


def test_a_lock_free_at_the_first_try_is_no_wait_however_slow_the_call(tmp_path):
    """On a busy host the process may be off the CPU between two clock readings around a lock that was free: that is
    no wait, and gpu_kill must not warn of another run (seen at 8 hosts on 2 cores: "waited 0.00 s for another
    gpu_kill run on this host", naming no run)."""
    readings = iter([100.0, 100.02])
    lock = _terminate.HostLock(dirs=[str(tmp_path)], clock=lambda: next(readings))
    assert lock.acquire(10) == 0.0 and lock.waited_for == []
    lock.release()
