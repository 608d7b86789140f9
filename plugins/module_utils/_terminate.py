# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ending processes safely: signal, wait, escalate to SIGKILL, confirm exit.

Each target is pinned before the first signal: a pidfd (Linux >= 5.3, Python >= 3.9)
opened and checked against the start time recorded at scan time, so a PID reused between
scan and signal is never hit, and exit is observed by polling the pidfd (readable once the
process has exited: a zombie counts as exited). Where pidfds are unavailable, the start
time (/proc/PID/stat field 22) is re-read right before every signal instead.
"""

from __future__ import annotations

import os
import select
import signal
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils import _proc

_POLL_SECONDS = 0.02


def parse_signal(name):
    """signal.Signals for "SIGTERM", "TERM", "term" or "15"; ValueError for anything else."""
    text = str(name).strip().upper()
    if text.isdigit():
        try:
            return signal.Signals(int(text))
        except ValueError:
            raise ValueError("unknown signal %r" % (name,))
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return signal.Signals[text]
    except KeyError:
        raise ValueError("unknown signal %r" % (name,))


def _state(pid, proc):
    stat = _proc.read_stat(pid, proc)
    return None if stat is None else stat["state"]


class Target:
    """One process to end, pinned to its identity (PID + start ticks, and a pidfd where possible)."""

    def __init__(self, holder, proc="/proc"):
        self.holder = holder
        self.id = _proc.ProcessId.from_process(holder)
        self.pid = self.id.pid
        self.proc = proc
        self.pidfd = None
        self.signals = []
        self.exited_at = None
        self.gone_before_signal = None

    def same_process(self):
        return self.id.same(self.proc)

    def pin(self):
        """Open a pidfd and check identity. False (with gone_before_signal set) if the process is not ours anymore."""
        if hasattr(os, "pidfd_open"):
            try:
                self.pidfd = os.pidfd_open(self.pid)
            except ProcessLookupError:
                self.gone_before_signal = "exited before any signal"
                return False
            except OSError:
                self.pidfd = None  # kernel without pidfd support: fall back to start-time checks
        if not self.same_process():
            self.close()
            self.gone_before_signal = (
                "exited before any signal"
                if _proc.read_start_ticks(self.pid, self.proc) is None
                else "PID reused by another process since the scan: not signalled"
            )
            return False
        return True

    def exited(self):
        if self.exited_at is not None:
            return True
        if self.pidfd is not None:
            done = bool(select.select([self.pidfd], [], [], 0)[0])
        else:
            done = not self.same_process() or _state(self.pid, self.proc) in ("Z", "X")
        if done:
            self.exited_at = time.monotonic()
        return done

    def send(self, sig):
        """Send `sig` to this very process; False if it has exited meanwhile."""
        if self.exited():
            return False
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            elif self.same_process():
                os.kill(self.pid, sig)
            else:
                self.exited_at = time.monotonic()
                return False
        except ProcessLookupError:
            self.exited_at = time.monotonic()
            return False
        self.signals.append(sig.name)
        return True

    def state(self):
        return _state(self.pid, self.proc)

    def close(self):
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _wait_exit(targets, deadline):
    """Poll until every target has exited or the deadline passes; no fixed sleep beyond one short poll."""
    while True:
        alive = [t for t in targets if not t.exited()]
        if not alive or time.monotonic() >= deadline:
            return alive
        fds = [t.pidfd for t in alive if t.pidfd is not None]
        timeout = min(_POLL_SECONDS if len(fds) < len(alive) else 1.0, max(0.0, deadline - time.monotonic()))
        if fds:
            select.select(fds, [], [], timeout)
        else:
            time.sleep(timeout)


def end_processes(holders, sig=signal.SIGTERM, grace_period=10.0, kill_wait=5.0, proc="/proc"):
    """Signal each holder, wait up to `grace_period` s, SIGKILL the rest, wait up to `kill_wait` s.

    Returns {"signalled": [...], "exited": [...], "survived": [...], "not_signalled": [...]} where each
    entry is the holder dict plus "signals" (names sent), and for exited ones "exited_after_s"
    (seconds from the first signal; also set on their "signalled" entries), for survivors "state"
    and "reason", for not_signalled ones "reason".
    """
    started = time.monotonic()
    targets, not_signalled = [], []
    for holder in holders:
        target = Target(holder, proc)
        if target.pin():
            targets.append(target)
        else:
            not_signalled.append(dict(holder, reason=target.gone_before_signal))
    try:
        for target in targets:
            target.send(sig)
        alive = _wait_exit(targets, time.monotonic() + grace_period)
        if sig != signal.SIGKILL:
            for target in alive:
                target.send(signal.SIGKILL)
        alive = _wait_exit(alive, time.monotonic() + kill_wait)
        return _report(targets, alive, not_signalled, started)
    finally:
        for target in targets:
            target.close()


def _report(targets, alive, not_signalled, started):
    signalled, exited, survived = [], [], []
    for target in targets:
        if not target.signals:
            not_signalled.append(dict(target.holder, reason="exited before any signal"))
            continue
        entry = dict(target.holder, signals=list(target.signals))
        if target not in alive:
            entry["exited_after_s"] = round(target.exited_at - started, 3)
        signalled.append(entry)
        if target in alive:
            state = target.state()
            if state == "D":
                reason = (
                    "unkillable: in uninterruptible sleep (D), most likely stuck inside the driver; SIGKILL is pending "
                    "and takes effect only when the call returns. Next step: a GPU reset (nvidia-smi --gpu-reset) or a reboot"
                )
            else:
                reason = "still running after SIGKILL (state %s)" % state
            survived.append(dict(entry, state=state, reason=reason))
        else:
            exited.append(entry)
    return {"signalled": signalled, "exited": exited, "survived": survived, "not_signalled": not_signalled}


ROUNDS = 3


def end_until_gone(choose, first, sig=signal.SIGTERM, grace_period=10.0, kill_wait=5.0, rounds=ROUNDS, proc="/proc"):
    """End what `choose` selects, look again, end what appeared meanwhile, at most `rounds` times.

    `choose(first_round)` returns the processes to end now (dicts with pid, start_ticks, ppid, comm, cmdline),
    from a fresh look for every round but the first, where `first` (the list already chosen) is used. A process is
    signalled at most once (PID + start time). A process that appears in a later round with the parent or the
    command line of one that was ended is a respawn: it is ended too and reported in "respawned" with what it
    replaced. Stops at the first round where a process survives SIGKILL.

    Returns end_processes()' lists, summed over the rounds, plus "respawned": [process + {"replaces" (PID),
    "parent" ({"pid", "comm"} or None)}].
    """
    result = {"signalled": [], "exited": [], "survived": [], "not_signalled": [], "respawned": []}
    seen = set()
    targets = first
    for number in range(rounds):
        if number:
            targets = [t for t in choose(False) if _proc.ProcessId.from_process(t) not in seen]
            result["respawned"].extend(_respawns(targets, result["signalled"], proc))
        if not targets:
            break
        seen.update(_proc.ProcessId.from_process(t) for t in targets)
        outcome = end_processes(targets, sig, grace_period, kill_wait, proc)
        for key in ("signalled", "exited", "survived", "not_signalled"):
            result[key].extend(outcome[key])
        if outcome["survived"]:
            break
    return result


def _respawns(targets, ended, proc="/proc"):
    found = []
    for target in targets:
        for old in ended:
            same_parent = target.get("ppid", 0) > 1 and target.get("ppid") == old.get("ppid")
            same_command = bool(target.get("cmdline")) and target.get("cmdline") == old.get("cmdline")
            if same_parent or same_command:
                parent = target.get("parent")
                if parent is None and target.get("ppid", 0) > 1:
                    stat = _proc.read_stat(target["ppid"], proc)
                    parent = {"pid": target["ppid"], "comm": stat["comm"] if stat else None}
                found.append(dict(target, replaces=old["pid"], replaces_comm=old.get("comm"), parent=parent))
                break
    return found
