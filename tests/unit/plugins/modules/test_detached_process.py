# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""detached_process module: main() starting and stopping a real process of this test (the only one signalled)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _proc
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _detached
from ansible_collections.gpuops.nvidia.plugins.modules import detached_process
from module_main import run_main


def run_module(capsys, args):
    return run_main(detached_process, capsys, args)


def test_start_is_idempotent_and_stop_ends_it(capsys, tmp_path):
    args = {
        "argv": [sys.executable, "-c", "import time; time.sleep(60)"],
        "pidfile": str(tmp_path / "s.pid"),
        "log_file": str(tmp_path / "s.log"),
    }
    code, result = run_module(capsys, dict(args, _ansible_check_mode=True))
    assert code == 0 and result["changed"] and result["pid"] is None and not os.path.exists(args["pidfile"])
    code, started = run_module(capsys, args)
    pid = started["pid"]
    try:
        assert (
            code == 0
            and started["changed"]
            and _detached.read_pidfile(args["pidfile"]) == (pid, started["start_ticks"])
        )
        while not _proc.read_cmdline(pid):  # right after exec, the kernel may not have set the new command line yet
            time.sleep(0.01)
        code, again = run_module(capsys, args)
        assert (
            code == 0
            and again["changed"] is False
            and again["pid"] == pid
            and "time.sleep(60)" in again["running_cmdline"]
        )
        code, planned = run_module(
            capsys, {"state": "stopped", "pidfile": args["pidfile"], "_ansible_check_mode": True}
        )
        assert code == 0 and planned["changed"] and [p["pid"] for p in planned["would_signal"]] == [pid]
        assert _proc.ProcessId(pid, started["start_ticks"]).alive()
        code, stopped = run_module(capsys, {"state": "stopped", "pidfile": args["pidfile"]})
        assert code == 0 and stopped["changed"] and [p["pid"] for p in stopped["exited"]] == [pid]
        assert stopped["msg"] == "signalled 1 process(es), 1 exited" and not os.path.exists(args["pidfile"])
        code, result = run_module(capsys, {"state": "stopped", "pidfile": args["pidfile"]})
        assert code == 0 and result["changed"] is False and result["msg"] == "no pidfile: nothing to stop"
    finally:
        if _proc.ProcessId(pid, started["start_ticks"]).alive():
            os.kill(pid, 9)
        os.waitpid(pid, 0)


@pytest.mark.parametrize(
    "args, message",
    [
        ({"argv": []}, "argv must not be empty"),
        ({"argv": ["/nonexistent/vllm"]}, "cannot execute /nonexistent/vllm"),
        ({}, "state is started but all of the following are missing: argv"),
    ],
)
def test_start_errors(capsys, tmp_path, args, message):
    code, result = run_module(
        capsys, dict({"pidfile": str(tmp_path / "s.pid"), "log_file": str(tmp_path / "s.log")}, **args)
    )
    assert code == 1 and message in result["msg"]
