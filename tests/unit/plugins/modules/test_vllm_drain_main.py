# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vllm_drain: main() against the fake_vllm server, with a process of the test's own as the server's main process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.modules import vllm_drain
from module_main import run_main


@pytest.fixture
def server_process():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def test_a_server_that_cannot_be_asked_is_not_signalled(capsys, fake_vllm_tls, server_process):
    # The certificate is not trusted (validate_certs defaults to true): the load cannot be read, so nothing is stopped.
    code, result = run_main(
        vllm_drain, capsys, {"url": fake_vllm_tls.url, "served_model_name": "served", "pid": server_process.pid}
    )
    assert code == 1 and "TLS failed" in result["msg"] and result["msg"].endswith("nothing was signalled"), result
    assert server_process.poll() is None


def test_an_error_answer_is_not_drained_and_the_stop_goes_ahead(capsys, fake_vllm, server_process):
    fake_vllm.metrics_status = 503
    code, result = run_main(
        vllm_drain,
        capsys,
        {"url": fake_vllm.url, "served_model_name": "served", "pid": server_process.pid, "grace_period": 10},
    )
    assert code == 0 and result["changed"] and result["drained"] is False, result
    assert (
        "GET /metrics: HTTP 503" in result["msg"]
        and "not drained; SIGTERM to PID %d" % server_process.pid in (result["msg"])
    )
    assert server_process.wait(10) == -15


def test_a_pid_that_names_another_process_now_is_not_signalled(capsys, fake_vllm, server_process):
    # start_ticks as read before: the PID is another process's now (the server it named has exited, the PID reused).
    code, result = run_main(
        vllm_drain, capsys, {"url": fake_vllm.url, "pid": server_process.pid, "start_ticks": 1, "tree": True}
    )
    assert code == 0 and not result["changed"] and result["stop"] is None, result
    assert server_process.poll() is None


def test_tree_waits_for_the_whole_tree_and_sigkills_what_is_left(capsys, fake_vllm):
    # The API server exits on SIGTERM; its child ignores SIGTERM (a worker inside a long CUDA call).
    child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    parent = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', %r]); time.sleep(60)" % child
    process = subprocess.Popen([sys.executable, "-c", parent])
    worker = ticks = None
    try:
        deadline = time.monotonic() + 10
        while not _children(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (worker,) = _children(process.pid)
        ticks = _start_ticks(worker)
        code, result = run_main(
            vllm_drain,
            capsys,
            {"url": fake_vllm.url, "pid": process.pid, "tree": True, "grace_period": 0.5, "kill_wait": 5},
        )
        assert process.wait(5) == -15
        assert code == 0 and result["changed"], result
        stop = result["stop"]
        assert stop["signalled"] and stop["exited"] and stop["left"] == [], stop
        assert [entry["pid"] for entry in stop["killed"]] == [worker], stop
        assert "1 process(es) of its tree SIGKILLed" in result["msg"]
        assert not os.path.exists("/proc/%d" % worker) or open("/proc/%d/stat" % worker).read().split()[2] == "Z"
    finally:
        process.kill()
        process.wait()
        if worker is not None and _start_ticks(worker) == ticks:
            os.kill(worker, signal.SIGKILL)  # the test's own worker, left by a failure above


def _children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as handle:
        return [int(child) for child in handle.read().split()]


def _start_ticks(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except OSError:
        return None
