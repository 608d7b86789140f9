# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_gpus: GPU selection, option checks, protection rules, the process chain, Inspector's driver handling."""
from __future__ import annotations

import os
import sys
import time
import types

import pynvml
import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils import _gpus

VIEW = {"gpus": [{"index": 0, "uuid": "GPU-aaaa"}, {"index": 1, "uuid": "GPU-bbbb"}, {"index": 2, "uuid": "GPU-cccc"}]}
OWN_CHAIN = {1, 700, 701}


def holder(pid=5000001, ppid=4000, comm="python3", cmdline="python3 -m vllm.entrypoints.openai.api_server",
           kernel_thread=False):
    return {"pid": pid, "ppid": ppid, "comm": comm, "cmdline": cmdline, "kernel_thread": kernel_thread}


@pytest.mark.parametrize("requested, expected", [
    ([0, 2], [0, 2]),
    (["2", " 1 "], [1, 2]),
    (["GPU-cccc", 0], [0, 2]),
    ([1, "1", "GPU-bbbb"], [1]),
    (None, None),
    ([], None),
])
def test_select_gpus(requested, expected):
    assert _gpus.select_gpus(requested, VIEW) == expected


@pytest.mark.parametrize("requested", [[3], ["GPU-dddd"], [0, -1], ["0x1"], [True]])
def test_select_gpus_unknown_lists_the_known_ones(requested):
    with pytest.raises(_gpus.SelectionError) as info:
        _gpus.select_gpus(requested, VIEW)
    message = str(info.value)
    assert "unknown GPU" in message
    assert "[0, 1, 2]" in message and "GPU-aaaa" in message and "GPU-cccc" in message


def test_select_gpus_without_map():
    assert _gpus.select_gpus(None, {"gpus": []}) is None
    with pytest.raises(_gpus.SelectionError, match="no NVML and no /proc/driver/nvidia"):
        _gpus.select_gpus([0], {"gpus": []})


def test_compile_match():
    assert _gpus.compile_match(None) is None
    assert _gpus.compile_match("VLLM::|vllm serve").search("VLLM::Worker_TP0")
    with pytest.raises(_gpus.SelectionError, match=r"invalid regex in match 'VLLM::\(': missing \)"):
        _gpus.compile_match("VLLM::(")


def test_check_nonnegative():
    _gpus.check_nonnegative(grace_period=0, kill_wait=5.0, driver_timeout=None)
    with pytest.raises(_gpus.SelectionError) as info:
        _gpus.check_nonnegative(timeout=-1.0, grace_period=2, kill_wait=-0.5)
    assert str(info.value) == "must not be negative: kill_wait=-0.5, timeout=-1.0"


def test_protection_never_pid_1_own_chain_or_kernel_threads():
    assert _gpus.protection(holder(pid=1, ppid=0), OWN_CHAIN, include_protected=True) == "PID 1 (init)"
    assert "ancestors" in _gpus.protection(holder(pid=701), OWN_CHAIN, include_protected=True)
    assert _gpus.protection(holder(pid=300, ppid=2, comm="kworker/0:1", cmdline="", kernel_thread=True), OWN_CHAIN,
                            include_protected=True) == "kernel thread"
    # Inside a node's PID namespace PID 2 is an ordinary process: its children are not kernel threads.
    assert _gpus.protection(holder(pid=300, ppid=2), OWN_CHAIN) is None
    assert _gpus.protection(holder(), OWN_CHAIN) is None


@pytest.mark.parametrize("name", _gpus.PROTECTED_NAMES)
def test_protection_of_each_gpu_daemon_by_comm_and_by_argv0(name):
    by_comm = holder(comm=name[:15], cmdline="")  # the kernel cuts comm to 15 bytes
    by_argv0 = holder(comm="daemon", cmdline="/usr/bin/%s --verbose" % name)
    for entry in (by_comm, by_argv0):
        reason = _gpus.protection(entry, OWN_CHAIN)
        assert reason.startswith("protected GPU daemon (") and name in reason
        assert _gpus.protection(entry, OWN_CHAIN, include_protected=True) is None


def test_protected_name_only_in_arguments_is_not_protected():
    assert _gpus.protection(holder(cmdline="python3 watch.py nvidia-persistenced"), OWN_CHAIN) is None


def test_exclude_holds_even_with_include_protected():
    entry = holder(comm="VLLM::EngineCor", cmdline="VLLM::EngineCore")
    assert _gpus.protection(entry, OWN_CHAIN, exclude=["VLLM::EngineCor"]).startswith("excluded by the exclude option")
    assert _gpus.protection(entry, OWN_CHAIN, exclude=["VLLM::EngineCore"], include_protected=True).startswith(
        "excluded by the exclude option")
    assert _gpus.protection(entry, OWN_CHAIN, exclude=["VLLM::Worker"]) is None


def test_include_protected_never_lifts_pid_1_or_own_chain():
    assert _gpus.protection(holder(pid=1, comm="nvidia-persistenced"), OWN_CHAIN, include_protected=True) == "PID 1 (init)"
    assert _gpus.protection(holder(pid=700, comm="nvidia-persistenced"), OWN_CHAIN, include_protected=True).startswith(
        "this module")


def test_ancestors_of_this_process():
    chain = _gpus.ancestors()
    assert os.getpid() in chain and os.getppid() in chain
    assert 1 in chain


def test_ancestors_in_a_fake_proc_with_a_tricky_comm(tmp_path):
    for pid, ppid, comm in ((1, 0, "init"), (40, 1, "sshd: root (priv)"), (41, 40, "a) b"), (42, 41, "python3")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text("%d (%s) S %d %d %d 0 -1 4194560 %s\n" % (
            pid, comm, ppid, pid, pid, " ".join(str(n) for n in range(100, 130))))
    assert _gpus.ancestors(42, str(tmp_path)) == {42, 41, 40, 1}
    assert _gpus.ancestors(99, str(tmp_path)) == {99}  # gone: only itself


def test_holders_of():
    view = {"holders": [{"pid": 10, "gpus": [0], "control_only": False},
                        {"pid": 11, "gpus": [0, 1], "control_only": False},
                        {"pid": 12, "gpus": [], "control_only": True}]}
    assert [h["pid"] for h in _gpus.holders_of(view, None)] == [10, 11, 12]
    assert [h["pid"] for h in _gpus.holders_of(view, [1])] == [11]
    assert _gpus.holders_of(view, [2]) == []


def test_check_libraries_names_the_package_host_and_interpreter(monkeypatch):
    monkeypatch.setattr(_gpus, "PSUTIL_IMPORT_ERROR", "Traceback: No module named 'psutil'")
    failures = []
    module = types.SimpleNamespace(fail_json=lambda **kw: failures.append(kw))
    _gpus.check_libraries(module, lambda package: "Failed to import the required Python library (%s)" % package)
    (failure,) = failures
    assert "(psutil)" in failure["msg"] and sys.executable in failure["msg"]
    assert failure["exception"] == "Traceback: No module named 'psutil'"


def test_inspector_hung_driver_gives_timed_out_view_bounded_by_the_snapshot_timeout(monkeypatch):
    def hang():
        time.sleep(30)

    fake = types.SimpleNamespace(NVMLError=pynvml.NVMLError, nvmlInit=lambda: None,
                                 nvmlSystemGetDriverVersion=hang)
    monkeypatch.setattr(_gpus, "pynvml", fake)
    inspector = _gpus.Inspector(driver_timeout=10.0)
    started = time.monotonic()
    try:
        view = inspector.snapshot(timeout=0.3)
        assert inspector.own_pids() == {os.getpid()}  # the hung worker was killed
    finally:
        inspector.close()
    assert time.monotonic() - started < 5
    assert view["driver"]["timed_out"] is True and view["driver"]["available"] is False
    assert "within 0.3 s" in view["driver"]["error"]
    assert os.getpid() not in {h["pid"] for h in view["holders"]}
