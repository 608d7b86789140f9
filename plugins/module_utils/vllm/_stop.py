# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The stop of a drained vLLM server: SIGTERM to its main process alone, then a wait for its session to exit.

vLLM 0.33 drains for `--shutdown-timeout` seconds on SIGTERM of the API server (entrypoints/launchers/launcher.py).
The signal goes through the GPU side's ending code, gpu/_terminate.Target (pidfd-pinned to the process's identity);
this file only chooses the process and waits. stop_main_process SIGKILLs nothing: what is left is the caller's to
end. stop_tree, for a server the role did not start (no session or unit of its own to end), waits for the server's
whole process tree as it was at the SIGTERM, then SIGKILLs what is left of it.
"""

from __future__ import annotations

import signal
import time
from typing import List, Optional, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _proc, _terminate
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _detached


class Left(TypedDict):
    """A process still running at the end of the wait."""

    pid: int
    comm: Optional[str]


class Stopped(TypedDict):
    """What stop_main_process returns; plugins/modules/vllm_drain.py's RETURN (`stop`) says what each key means."""

    signalled: bool
    pid: int
    exited: bool
    stop_s: float
    left: List[Left]
    killed: List[Left]


def stop_main_process(record: Tuple[int, int], timeout: float, session: bool = True, proc: str = "/proc") -> Stopped:
    """SIGTERM the server's main process `record` (pid, start_ticks) alone, wait up to `timeout` s for it to exit
    (and, with `session`, for every process of its session: EngineCore and workers).

    Nothing is SIGKILLed: what is left after `timeout` is for the caller to end. Returns {"signalled" (bool),
    "pid", "exited" (all gone), "stop_s", "left" ([{pid, comm}] still running)}.
    """
    started = time.monotonic()
    result: Stopped = {"signalled": False, "pid": record[0], "exited": True, "stop_s": 0.0, "left": [], "killed": []}
    target = _terminate.Target({"pid": record[0], "start_ticks": record[1]}, proc)
    if not target.pin():
        return result
    left: List[Left] = []
    try:
        result["signalled"] = target.send(signal.SIGTERM)
        deadline = started + timeout
        while True:
            if session:
                left = [{"pid": m["pid"], "comm": m["comm"]} for m in _detached.session_members(record, proc)]
            else:
                left = [] if target.exited() else [{"pid": record[0], "comm": None}]
            left = [member for member in left if member["pid"] != record[0] or not target.exited()]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    finally:
        target.close()
    result["exited"] = not left
    result["left"] = left
    result["stop_s"] = round(time.monotonic() - started, 3)
    return result


def tree_members(record: Tuple[int, int], proc: str = "/proc") -> List[_proc.Brief]:
    """The live descendants of the process `record` (pid, start_ticks), by their parent links, sorted by PID; [] when
    that PID now names another process."""
    root = _proc.read_stat(record[0], proc)
    if root is None or root["start_ticks"] != record[1]:
        return []
    stats = {}
    for pid in _proc.list_pids(proc):
        stat = _proc.read_stat(pid, proc)
        if stat is not None and stat["state"] not in ("Z", "X") and stat["start_ticks"] >= record[1]:
            stats[pid] = stat
    tree, grown = {record[0]}, True
    while grown:
        children = {pid for pid, stat in stats.items() if stat["ppid"] in tree} - tree
        tree |= children
        grown = bool(children)
    return [_proc.brief(pid, stats[pid], proc) for pid in sorted(tree - {record[0]})]


def _wait(targets: List[_terminate.Target], deadline: float) -> List[_terminate.Target]:
    """The targets still running at `deadline`, or none once all have exited (polled every 0.05 s)."""
    while True:
        alive = [target for target in targets if not target.exited()]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def stop_tree(record: Tuple[int, int], timeout: float, kill_wait: float, proc: str = "/proc") -> Stopped:
    """SIGTERM the server's main process `record` (pid, start_ticks) alone, so that vLLM's own shutdown runs; wait up
    to `timeout` s for it and every descendant it had at the signal; SIGKILL those left, and wait up to `kill_wait`
    s. Returns stop_main_process's keys; "killed" lists the processes that got SIGKILL, "left" those still there."""
    started = time.monotonic()
    result: Stopped = {"signalled": False, "pid": record[0], "exited": True, "stop_s": 0.0, "left": [], "killed": []}
    main = _terminate.Target({"pid": record[0], "start_ticks": record[1]}, proc)
    if not main.pin():
        return result
    members = [_terminate.Target(dict(member), proc) for member in tree_members(record, proc)]
    members = [main] + [member for member in members if member.pin()]
    try:
        result["signalled"] = main.send(signal.SIGTERM)
        alive = _wait(members, started + timeout)
        for member in alive:
            if member.send(signal.SIGKILL):
                result["killed"].append({"pid": member.pid, "comm": member.holder.get("comm")})
        alive = _wait(alive, time.monotonic() + kill_wait)
    finally:
        for member in members:
            member.close()
    result["left"] = [{"pid": member.pid, "comm": member.holder.get("comm")} for member in alive]
    result["exited"] = not alive
    result["stop_s"] = round(time.monotonic() - started, 3)
    return result
