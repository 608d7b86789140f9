# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_wait's main() with scripted snapshots: how many looks a call takes, require_memory and return_after."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus
from ansible_collections.gpuops.nvidia.plugins.modules import gpu_wait
from module_main import run_main

DRIVER_OK = {
    "available": True,
    "error": None,
    "timed_out": False,
    "driver_version": "580.95.05",
    "nvml_version": None,
    "cuda_driver_version": None,
}
NO_DRIVER = dict(
    DRIVER_OK, available=False, error="NVMLError_LibraryNotFound: NVML Shared Library Not Found", driver_version=None
)


def gpu(index, used_mib=3):
    return {
        "index": index,
        "uuid": "GPU-%d" % index,
        "memory_used_mib": used_mib,
        "memory_reserved_mib": None if used_mib is None else 529,
        "unexplained_mib": None if used_mib is None else 0,
        "memory_unexplained": used_mib is None,
        "error": None,
        "foreign": [],
        "suspects": [],
    }


def view(gpus, driver=None, scan="listed"):
    return {
        "gpus": gpus,
        "holders": [],
        "device_users": [],
        "driver": dict(driver or DRIVER_OK),
        "index_source": "nvml",
        "scan": scan,
        "unmapped_minors": [],
    }


class Looks:
    """Stands in for Inspector.snapshot: scripted views, and the scope of each look."""

    def __init__(self, *views):
        self.views = copy.deepcopy(list(views))
        self.scopes = []

    def snapshot(self, timeout=None, scope="full", indices=None, tolerance_mib=256, **kwargs):  # pylint: disable=unused-argument
        self.scopes.append(scope)
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]


@pytest.fixture
def looks(monkeypatch):
    def install(*views):
        scripted = Looks(*views)
        monkeypatch.setattr(_gpus.Inspector, "snapshot", scripted.snapshot)
        return scripted

    return install


def run_module(capsys, args):
    return run_main(gpu_wait, capsys, args)


def test_free_gpus_take_one_look(capsys, looks):
    scripted = looks(view([gpu(0), gpu(1)]))
    code, result = run_module(capsys, {"timeout": 5})
    assert code == 0 and result["released"] is True and result["polls"] == 1 and scripted.scopes == ["listed"], result
    assert result["after"]["gpus"][1]["index"] == 1


def test_a_busy_gpu_is_looked_at_again_until_it_is_free(capsys, looks):
    scripted = looks(view([gpu(0), gpu(1, 9000)]), view([gpu(0), gpu(1)]))
    code, result = run_module(capsys, {"timeout": 5, "poll_interval": 0})
    assert code == 0 and result["released"] is True and result["polls"] == 2 and scripted.scopes == ["listed", "listed"]


def test_return_after_false_leaves_the_facts_out(capsys, looks):
    looks(view([gpu(0)]))
    code, result = run_module(capsys, {"timeout": 0, "return_after": False})
    assert code == 0 and "after" not in result and result["gpus"][0]["released"] is True


def test_require_memory_fails_where_memory_was_not_read(capsys, looks):
    looks(view([gpu(0, None), gpu(1, None)], driver=NO_DRIVER, scan="full"))
    code, result = run_module(capsys, {"timeout": 0})
    assert code == 0 and result["released"] is True and result["memory_checked"] is False
    code, result = run_module(capsys, {"timeout": 0, "require_memory": True})
    assert code == 1 and result["failed"] is True and result["released"] is True, result
    assert result["msg"] == (
        "not checked: used memory of GPU 0, 1 not read (NVIDIA driver library not usable: NVMLError_LibraryNotFound: "
        "NVML Shared Library Not Found); no process holds them (/proc scan); next: make the NVIDIA driver library usable "
        "on this host (libnvidia-ml.so.1 and the nvidia-ml-py package), or accept a check from /proc alone "
        "(require_memory=false)"
    )


def test_memory_the_driver_does_not_report_is_not_checked(capsys, looks):
    """A GB10: NVML answers NOT_SUPPORTED for memory, its process lists answer (the snapshot's used memory is what
    they charge). No holder is left, but the memory was not read: never "released" as if it had been."""
    gb10 = dict(gpu(0, 0), memory_supported=False, memory_source="process_lists", memory_reserved_mib=None)
    looks(view([gb10]))
    code, result = run_module(capsys, {"timeout": 0})
    assert code == 0 and result["memory_checked"] is False and result["gpus"][0]["memory_checked"] is False, result
    assert result["msg"].startswith("no holder left (memory not checked: the driver does not report it)"), result
    code, result = run_module(capsys, {"timeout": 0, "require_memory": True})
    assert code == 1 and result["released"] is True, result
    assert result["msg"] == (
        "not checked: used memory of GPU 0 not reported by the driver (NVML answers NOT_SUPPORTED, as on a "
        "unified-memory GPU such as the GB10); no process holds it (the driver's process lists and /proc); next: the "
        "memory of such a GPU cannot be read on this host: leaked memory there stays unseen; accept a check of its "
        "holders alone (require_memory=false)"
    )


@pytest.mark.parametrize(
    "args, words",
    [
        ({"gpus": [" "]}, "gpus is a list of nothing but null or blank entries"),
        ({"match": ""}, "match is empty"),
        ({"units": []}, "units is empty"),
    ],
)
def test_a_selection_option_that_names_nothing_is_refused_before_the_first_look(capsys, monkeypatch, args, words):
    # A null option is refused on the controller by the action plugin (tests/unit/plugins/plugin_utils/
    # test_interpreter.py): the module sees None, as for an option left out.
    looks = []
    monkeypatch.setattr(_gpus.Inspector, "snapshot", lambda *a, **k: looks.append(1))
    code, result = run_main(gpu_wait, capsys, args)
    assert code == 1 and result["msg"].startswith(words + ": a selection that names nothing is refused")
    assert looks == []


@pytest.mark.parametrize(
    "args, words",
    [
        ({"timeout": 1e308}, "timeout=1e+308 (must be at most 3600 seconds)"),
        ({"poll_interval": 61}, "poll_interval=61.0 (must be at most 60 seconds)"),
        ({"driver_timeout": 3600}, "driver_timeout=3600.0 (must be at most 600 seconds)"),
    ],
)
def test_a_time_above_its_bound_is_refused_before_the_first_look(capsys, looks, args, words):
    # Issue 33 item 11: a finite time no run means (1e308 s) would leave the wait silent for hours.
    scripted = looks(view([gpu(0)]))
    code, result = run_module(capsys, args)
    assert code == 1 and result["msg"] == "invalid option value: " + words, result
    assert scripted.scopes == []
