# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ending processes safely: signal, wait, escalate to SIGKILL, confirm exit; one run at a time per host.

Each target is pinned before the first signal: a pidfd (Linux >= 5.3, Python >= 3.9)
opened and checked against the start time recorded at scan time, so a PID reused between
scan and signal is never hit, and exit is observed by polling the pidfd (readable once the
process has exited: a zombie counts as exited). Where pidfds are unavailable, the start
time (/proc/PID/stat field 22) is re-read right before every signal instead.

HostLock serializes the runs that end processes on one host (gpu_kill): two runs at once would
signal the same processes, and each would report the other's signals and exits as its own.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import tempfile
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options, _proc

_POLL_SECONDS = 0.02
# Where the lock file of HostLock is made, the first directory that takes it: /run/lock is the FHS place
# (a tmpfs, so it never outlives a boot), /run where a distribution has no /run/lock, the temp directory for a
# user who can write to neither.
LOCK_NAME = "gpuops-nvidia-gpu_kill.lock"
LOCK_DIRS = ("/run/lock", "/run")
_LOCK_POLL_S = 0.05

# A process to end and what ending it adds: a holder dict (pid, start_ticks, ppid, comm, cmdline, owner words...),
# then "signals", "exited_after_s", "state", "reason", "replaces"... (JSON-ish: gpu_kill returns these dicts).
Entry = Dict[str, Any]


class LockHolder(TypedDict):
    """A process holding the host's lock (HostLock.holders)."""

    pid: int
    cmdline: str


class Ends(TypedDict):
    """What end_processes did: each entry a holder plus what ending it added."""

    signalled: List[Entry]
    exited: List[Entry]
    survived: List[Entry]
    not_signalled: List[Entry]


class Ended(Ends):
    """What end_until_gone did, over all its rounds: end_processes' lists, and the respawns it saw."""

    respawned: List[Entry]


class LockTimeout(Exception):
    """HostLock.acquire waited its whole timeout: another run holds the lock. The message names it."""


class HostLock:
    """One run at a time per host: an exclusive POSIX record lock (fcntl.lockf) on LOCK_NAME.

    A record lock belongs to the process that took it: the workers it forks (NVML, the /proc scan) do not
    inherit it, and it goes when the process exits, however it ends (no stale lock file to clean up).
    `acquire(timeout)` waits at most `timeout` seconds and returns the seconds waited (0.0 when the lock was
    free at the first try; after a wait, `waited_for` names the runs that held it), or raises LockTimeout naming
    the run that holds it;
    `holders()` names the runs that hold it now, without taking it (check mode); `release()` lets it go.
    """

    def __init__(
        self,
        dirs: Optional[Iterable[str]] = None,
        proc: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.dirs = tuple(LOCK_DIRS if dirs is None else dirs) + (tempfile.gettempdir(),)
        self.proc = proc
        self.clock = clock
        self.sleep = sleep
        self.fd: Optional[int] = None
        self.path: Optional[str] = None
        self.waited_for: List[LockHolder] = []

    def _open(self, create: bool = True) -> int:
        """Open the lock file in the first directory that has (or takes) it, and return its fd; the OSError of the
        last, if none does."""
        error: Optional[OSError] = None
        for directory in self.dirs:
            path = os.path.join(directory, LOCK_NAME)
            try:
                # O_NOFOLLOW: /run/lock is world-writable on many hosts; a symlink planted there is never followed.
                flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
                fd = os.open(path, flags, 0o666)
            except OSError as exc:
                error = exc
                continue
            # Made by root 0644 (umask), a user's run could not open it for writing and would lock another file.
            if create and os.fstat(fd).st_uid == os.geteuid():
                os.fchmod(fd, 0o666)
            self.fd, self.path = fd, path
            return fd
        raise error or OSError(errno.ENOENT, "no lock directory")

    def acquire(self, timeout: float) -> float:
        """Take the lock, waiting at most `timeout` seconds; return the seconds waited."""
        fd = self._open()
        started = self.clock()
        deadline = started + timeout
        tries = 0
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # Free at the first try: nothing was waited for, however long the call took on a busy host (a
                # millisecond off the CPU read as a wait and warned of another run that was never there).
                return round(self.clock() - started, 3) if tries else 0.0
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
            tries += 1
            if not self.waited_for:
                self.waited_for = self.holders()
            if self.clock() >= deadline:
                holders = self.holders()
                self.release()
                raise LockTimeout(
                    "another gpu_kill run on this host (%s) held its lock (%s) for the whole lock_timeout (%s s): "
                    "wait for it to end, then run again"
                    % (_runs(holders) or "PID not visible from here", self.path, timeout)
                )
            self.sleep(min(_LOCK_POLL_S, max(0.0, deadline - self.clock())))

    def holders(self) -> List[LockHolder]:
        """[{"pid", "cmdline"}] of the processes holding the lock now ([] when none, or no lock file yet), from
        /proc/locks (PIDs as this PID namespace numbers them)."""
        fd = self.fd
        if fd is None:
            try:
                fd = self._open(create=False)
            except OSError:
                return []
        found = os.fstat(fd)
        device = "%02x:%02x:%d" % (os.major(found.st_dev), os.minor(found.st_dev), found.st_ino)
        pids: Set[int] = set()
        try:
            with open(os.path.join(self.proc, "locks")) as handle:
                for line in handle:
                    fields = line.split()
                    # "1: POSIX  ADVISORY  WRITE 1234 00:19:5678 0 EOF"; "1: -> POSIX ..." is a waiter, not a holder.
                    if len(fields) >= 6 and fields[1] != "->" and fields[5] == device and fields[4].isdigit():
                        pids.add(int(fields[4]))
        except OSError:
            return []
        return [{"pid": pid, "cmdline": _proc.read_cmdline(pid, self.proc)} for pid in sorted(pids - {os.getpid()})]

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing any fd of the file drops the process's record locks on it
            self.fd = None


def _runs(holders: Iterable[LockHolder]) -> str:
    """The processes holding the lock, in words: "PID 7 (python3 .../AnsiballZ_gpu_kill.py)"."""
    return ", ".join("PID %s (%s)" % (h["pid"], (h["cmdline"] or "command line not readable")[:120]) for h in holders)


def waited_words(waited_s: float, holders: Sequence[LockHolder]) -> str:
    """The warning of a run that waited for another: what it waited for, and that it reports only its own actions."""
    return (
        "waited %.2f s for another gpu_kill run on this host%s to end: the processes that run ended are its own to "
        "report; this run reports only what it ended itself" % (waited_s, " (%s)" % _runs(holders) if holders else "")
    )


def parse_signal(name: object) -> signal.Signals:
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


def _state(pid: int, proc: str) -> Optional[str]:
    stat = _proc.read_stat(pid, proc)
    return None if stat is None else stat["state"]


class Target:
    """One process to end, pinned to its identity (PID + start ticks, and a pidfd where possible)."""

    def __init__(self, holder: Entry, proc: str = "/proc") -> None:
        self.holder = holder
        self.id = _proc.ProcessId.from_process(holder)
        self.pid = self.id.pid
        self.proc = proc
        self.pidfd: Optional[int] = None
        self.signals: List[str] = []
        self.exited_at: Optional[float] = None  # time.monotonic() when the exit was seen
        self.gone_before_signal: Optional[str] = None

    def same_process(self) -> bool:
        return self.id.same(self.proc)

    def pin(self) -> bool:
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

    def exited(self) -> bool:
        if self.exited_at is not None:
            return True
        if self.pidfd is not None:
            done = bool(select.select([self.pidfd], [], [], 0)[0])
        else:
            done = not self.same_process() or _state(self.pid, self.proc) in ("Z", "X")
        if done:
            self.exited_at = time.monotonic()
        return done

    def send(self, sig: signal.Signals) -> bool:
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

    def state(self) -> Optional[str]:
        return _state(self.pid, self.proc)

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _wait_exit(targets: List[Target], deadline: float) -> List[Target]:
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


def end_processes(
    holders: Iterable[Entry],
    sig: signal.Signals = signal.SIGTERM,
    grace_period: float = _options.default("grace_period"),
    kill_wait: float = _options.default("kill_wait"),
    proc: str = "/proc",
) -> Ends:
    """Signal each holder, wait up to `grace_period` s, SIGKILL the rest, wait up to `kill_wait` s.

    Returns {"signalled": [...], "exited": [...], "survived": [...], "not_signalled": [...]} where each
    entry is the holder dict plus "signals" (names sent), and for exited ones "exited_after_s"
    (seconds from the first signal; also set on their "signalled" entries), for survivors "state"
    and "reason", for not_signalled ones "reason".
    """
    started = time.monotonic()
    targets: List[Target] = []
    not_signalled: List[Entry] = []
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


def _report(targets: List[Target], alive: List[Target], not_signalled: List[Entry], started: float) -> Ends:
    signalled: List[Entry] = []
    exited: List[Entry] = []
    survived: List[Entry] = []
    for target in targets:
        if not target.signals:
            not_signalled.append(dict(target.holder, reason="exited before any signal"))
            continue
        entry = dict(target.holder, signals=list(target.signals))
        if target not in alive and target.exited_at is not None:  # not alive: exited() set exited_at
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


def end_until_gone(
    choose: Callable[[bool], List[Entry]],
    first: List[Entry],
    sig: signal.Signals = signal.SIGTERM,
    grace_period: float = _options.default("grace_period"),
    kill_wait: float = _options.default("kill_wait"),
    rounds: int = ROUNDS,
    proc: str = "/proc",
) -> Ended:
    """End what `choose` selects, look again, end what appeared meanwhile, at most `rounds` times.

    `choose(first_round)` returns the processes to end now (dicts with pid, start_ticks, ppid, comm, cmdline),
    from a fresh look for every round but the first, where `first` (the list already chosen) is used. A process is
    signalled at most once (PID + start time). A process that appears in a later round with the parent or the
    command line of one that was ended is a respawn: it is ended too and reported in "respawned" with what it
    replaced. Stops at the first round where a process survives SIGKILL.

    Returns end_processes()' lists, summed over the rounds, plus "respawned": [process + {"replaces" (PID),
    "parent" ({"pid", "comm"} or None)}].
    """
    result = Ended(signalled=[], exited=[], survived=[], not_signalled=[], respawned=[])
    seen: Set[_proc.ProcessId] = set()
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


def _respawns(targets: Iterable[Entry], ended: Iterable[Entry], proc: str = "/proc") -> List[Entry]:
    found: List[Entry] = []
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
