# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_guard's main() with its look replaced (issue 46 item 7): a textfile that cannot be written is named by the
path asked for, without the metrics text; the result says the look in one line."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _guard
from ansible_collections.gpuops.nvidia.plugins.modules import gpu_guard
from module_main import run_main

ORPHAN = {
    "pid": 6,
    "start_ticks": 307177,
    "comm": "VLLM::Worker_TP",
    "reason": "vllm_server_exited",
    "owner_label": "",
    "gpus": [0],
    "memory_mib": {"0": 75034},
}


def gpu(index, used_mib, unexplained_mib, holders):
    return {
        "index": index,
        "uuid": "GPU-%d" % index,
        "memory_used_mib": used_mib,
        "memory_reserved_mib": 529,
        "unexplained_mib": unexplained_mib,
        "tolerance_mib": 256,
        "holder_pids": holders,
        "exited": [],
        "error": None,
    }


VIEW = {
    "gpus": [gpu(0, 75034, 0, [6]), gpu(1, 3500, 3500, [])],
    "driver": {"available": True, "timed_out": False, "driver_version": "580.95.05"},
}


@pytest.fixture
def looked(monkeypatch):
    """gpu_guard's look at a host with an orphaned worker on GPU 0 and 3500 MiB that nothing explains on GPU 1."""
    calls = []

    def look(params):
        calls.append(params)
        return VIEW, [ORPHAN]

    monkeypatch.setattr(_guard, "look", look)
    monkeypatch.setattr(_gpus, "check_libraries", lambda module, missing: None)
    return calls


def test_a_missing_textfile_directory_is_named_before_the_look_and_the_text_is_not_dumped(capsys, looked, tmp_path):
    path = tmp_path / "node-exporter" / "gpuops_nvidia_guard.prom"
    code, result = run_main(gpu_guard, capsys, {"textfile": str(path)})
    assert code == 1 and looked == [], result
    assert result["msg"] == (
        "nothing was looked at: textfile %s cannot be written: its directory %s does not exist" % (path, path.parent)
    )
    assert "metrics" not in result and ".gpuops_nvidia_guard.prom." not in result["msg"], result
    # A file where the directory should be.
    path.parent.write_text("")
    code, result = run_main(gpu_guard, capsys, {"textfile": str(path)})
    assert code == 1 and result["msg"].endswith("its directory %s is not a directory" % path.parent), result


def test_a_write_that_fails_names_the_path_asked_for_and_not_the_text(capsys, looked, tmp_path, monkeypatch):
    """The directory passed the check, and the write still failed (read-only, full): the path asked for and why."""
    path = tmp_path / "gpuops_nvidia_guard.prom"

    def refuse(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / ".gpuops_nvidia_guard.prom.x1y2z3"))

    monkeypatch.setattr(_guard._guard_metrics.tempfile, "mkstemp", refuse)
    code, result = run_main(gpu_guard, capsys, {"textfile": str(path)})
    assert code == 1 and "metrics" not in result, result
    assert result["msg"].startswith("textfile %s not written: Permission denied; GPU 0: orphaned PID 6" % path), result
    assert "x1y2z3" not in result["msg"] and "# HELP" not in result["msg"]


def test_the_result_says_the_look_in_one_line_per_gpu(capsys, looked, tmp_path):
    path = tmp_path / "gpuops_nvidia_guard.prom"
    code, result = run_main(gpu_guard, capsys, {"textfile": str(path)})
    assert code == 0 and result["textfile"] == str(path) and os.path.isfile(path), result
    assert result["msg"] == (
        "GPU 0: orphaned PID 6 VLLM::Worker_TP (vllm_server_exited), 0 MiB unexplained; "
        "GPU 1: no orphaned holder, 3500 MiB unexplained; 0 vLLM instance(s) watched"
    ), result["msg"]
    assert "\n" not in result["msg"]
