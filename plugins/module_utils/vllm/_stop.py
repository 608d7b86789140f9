# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The stop of a drained vLLM server: SIGTERM to its main process alone, then a wait for its session to exit.

vLLM 0.33 drains for `--shutdown-timeout` seconds on SIGTERM of the API server (entrypoints/launchers/launcher.py).
The signal goes through the GPU side's ending code, gpu/_terminate.Target (pidfd-pinned to the process's identity);
this file only chooses the process and waits. Nothing is SIGKILLed here: what is left is the caller's to end.
"""

from __future__ import annotations

import signal
import time
from typing import List, Optional, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _terminate
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


def stop_main_process(record: Tuple[int, int], timeout: float, session: bool = True, proc: str = "/proc") -> Stopped:
    """SIGTERM the server's main process `record` (pid, start_ticks) alone, wait up to `timeout` s for it to exit
    (and, with `session`, for every process of its session: EngineCore and workers).

    Nothing is SIGKILLed: what is left after `timeout` is for the caller to end. Returns {"signalled" (bool),
    "pid", "exited" (all gone), "stop_s", "left" ([{pid, comm}] still running)}.
    """
    started = time.monotonic()
    result: Stopped = {"signalled": False, "pid": record[0], "exited": True, "stop_s": 0.0, "left": []}
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
