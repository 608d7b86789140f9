# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the kernel says about one process: its identity and names from /proc; forked workers.

/proc/PID/stat (state, parent, process group, session, start time), /proc/PID/cmdline and the NSpid line of
/proc/PID/status, read directly: the identity of a process (PID plus start ticks) and these few fields are needed
on every run, by modules that run without psutil too. Which processes hold NVIDIA device files is `_procscan`'s
job (the fd and maps scan), which the modules import only when they scan.
"""

from __future__ import annotations

import collections
import errno
import os
from typing import Any, Callable, Collection, Iterable, List, Mapping, Optional, TypedDict

_PF_KTHREAD = 0x00200000  # include/linux/sched.h: "I am a kernel thread"
# errno values that mean "the process or thread is gone, or not ours to read": skip it.
_SKIP_ERRNOS = (errno.ENOENT, errno.ESRCH, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EINVAL)


class Stat(TypedDict):
    """The fields of /proc/PID/stat that read_stat returns."""

    comm: str
    state: str
    ppid: int
    pgid: int
    sid: int
    start_ticks: int
    kernel_thread: bool


class Brief(TypedDict):
    """A process in a few fields (brief)."""

    pid: int
    ppid: int
    comm: str
    cmdline: str
    start_ticks: int


def skip_error(exc: OSError) -> bool:
    """True when OSError `exc` means the process or fd vanished or is not ours to read."""
    return exc.errno in _SKIP_ERRNOS


def list_pids(proc: str = "/proc") -> List[int]:
    """PIDs of the scanned /proc, as ints (threads are not listed)."""
    return [int(name) for name in os.listdir(proc) if name.isdigit()]


def read_stat(pid: int, proc: str = "/proc") -> Optional[Stat]:
    """Fields of /proc/PID/stat, or None if the process is gone.

    Returns {"comm" (the kernel's name, cut to 15 bytes), "state" (one letter: R, S, D, Z...),
    "ppid", "pgid", "sid", "start_ticks" (field 22: start time in clock ticks since boot),
    "kernel_thread" (PF_KTHREAD in field 9, the flags)}.
    PID plus start_ticks identify a process: a reused PID has another start time.
    """
    try:
        with open("%s/%d/stat" % (proc, pid), "rb") as stat:
            data = stat.read()
    except OSError as exc:
        if skip_error(exc):
            return None
        raise
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    close = data.rindex(b")")
    fields = data[close + 2 :].split()
    return {
        "comm": data[data.index(b"(") + 1 : close].decode("utf-8", "replace"),
        "state": fields[0].decode(),
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "start_ticks": int(fields[19]),
        "kernel_thread": bool(int(fields[6]) & _PF_KTHREAD),
    }


class ProcessId(collections.namedtuple("ProcessId", ("pid", "start_ticks"))):
    """A process's identity: its PID plus its start time in clock ticks (field 22 of /proc/PID/stat).

    A PID can be reused once its process has been reaped; the start time tells the new process from the old one
    (nvitop identifies processes the same way). A plain tuple (pid, start_ticks), as written in pidfiles.
    """

    __slots__ = ()

    @classmethod
    def of(cls, pid: int, proc: str = "/proc") -> Optional[ProcessId]:
        """The identity of the process that has `pid` now, or None when there is none."""
        ticks = read_start_ticks(pid, proc)
        return None if ticks is None else cls(pid, ticks)

    @classmethod
    def from_process(cls, process: Mapping[str, Any]) -> ProcessId:
        """The identity of a process dict (holder, session member) with "pid" and "start_ticks"."""
        return cls(process["pid"], process["start_ticks"])

    def same(self, proc: str = "/proc") -> bool:
        """True while `pid` still names this process (zombies included)."""
        return bool(read_start_ticks(self.pid, proc) == self.start_ticks)

    def alive(self, proc: str = "/proc") -> bool:
        """True while this process runs: same start time, and not a zombie."""
        stat = read_stat(self.pid, proc)
        return stat is not None and stat["start_ticks"] == self.start_ticks and stat["state"] not in ("Z", "X")


def brief(pid: int, stat: Stat, proc: str = "/proc") -> Brief:
    """{"pid", "ppid", "comm", "cmdline", "start_ticks"} of a process, from its read_stat() `stat`."""
    return {
        "pid": pid,
        "ppid": stat["ppid"],
        "comm": stat["comm"],
        "cmdline": read_cmdline(pid, proc),
        "start_ticks": stat["start_ticks"],
    }


def read_argv(pid: int, proc: str = "/proc") -> Optional[List[str]]:
    """Arguments of /proc/PID/cmdline as a list of str ([] for a kernel thread or a zombie), or None when the
    process is gone or unreadable. A title set with setproctitle (vLLM's VLLM::*) comes back as one argument."""
    try:
        with open("%s/%d/cmdline" % (proc, pid), "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    if data.endswith(b"\0"):
        data = data[:-1]
    return [arg.decode("utf-8", "replace") for arg in data.split(b"\0")] if data else []


def join_argv(argv: Iterable[str]) -> str:
    """A command line as one str: the arguments joined by spaces, trailing blanks removed (setproctitle, with vLLM's
    VLLM::* titles, pads the argv area with spaces or NULs)."""
    return " ".join(argv).rstrip()


def read_cmdline(pid: int, proc: str = "/proc") -> str:
    """/proc/PID/cmdline joined by spaces (join_argv; "" for a kernel thread or a process that is gone)."""
    return join_argv(read_argv(pid, proc) or ())


def read_start_ticks(pid: int, proc: str = "/proc") -> Optional[int]:
    """Start time of PID in clock ticks since boot (field 22 of /proc/PID/stat), or None if gone."""
    stat = read_stat(pid, proc)
    return None if stat is None else stat["start_ticks"]


def read_nspids(pid: int, proc: str = "/proc") -> List[int]:
    """The NSpid line of /proc/PID/status: PIDs from the outermost to the innermost namespace."""
    try:
        with open("%s/%d/status" % (proc, pid), "r") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except OSError as exc:
        if skip_error(exc):
            return []
        raise
    return [pid]


def fork_worker(work: Callable[[], object], close: Collection[int] = ()) -> int:
    """Fork a worker process that runs `work()` and exits; return its PID (in the caller).

    The worker closes the descriptors in `close` (the caller's ends of its pipes) and lets go of the
    caller's stdio, all three on /dev/null: a worker stuck in the driver, or on the maps of a process
    stuck there, must not keep a module's pipe to Ansible open after the module has gone. It never
    returns to the caller and runs no atexit handler or stdio flush of the parent: exit status 0 when
    `work` returned, 1 when it raised. OSError when the fork fails.
    """
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        for fd in close:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        work()
        status = 0
    finally:
        os._exit(status)  # pylint: disable=lost-exception


def single_threaded() -> bool:
    """True when this process runs one thread (its task directory has exactly one entry)."""
    try:
        return os.stat("/proc/self/task").st_nlink == 3
    except OSError:
        return False
