# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_wait.wait_released with a scripted inspector and a fake clock: no real sleeping."""
from __future__ import annotations

from ansible_collections.gpuops.nvidia.plugins.module_utils import _wait

DRIVER_OK = {"available": True, "error": None, "timed_out": False}
DRIVER_HUNG = {"available": False, "error": "an NVML call did not return within 1.0 s (driver hung?)", "timed_out": True}


def holder(pid, gpus, comm="VLLM::Worker_TP", cmdline="VLLM::Worker_TP0", state="S", control_only=False, memory=None):
    return {"pid": pid, "ppid": 4000, "comm": comm, "cmdline": cmdline, "state": state, "user": "svc-llm",
            "gpus": list(gpus), "control_only": control_only,
            "memory_mib": {str(i): (memory or {}).get(i) for i in gpus}}


def gpu(index, used_mib, unexplained_mib=0, reserved_mib=529):
    return {"index": index, "uuid": "GPU-%d" % index, "memory_used_mib": used_mib, "memory_reserved_mib": reserved_mib,
            "unexplained_mib": unexplained_mib}


def view(gpus, holders=(), driver=None):
    return {"gpus": list(gpus), "holders": list(holders), "driver": dict(driver or DRIVER_OK)}


class Scripted:
    """An inspector whose snapshots follow a script; the last one repeats. Records the timeouts it was given."""

    def __init__(self, *views):
        self.views = list(views)
        self.timeouts = []

    def snapshot(self, timeout=None):
        self.timeouts.append(timeout)
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]


class Clock:
    def __init__(self):
        self.now = 1000.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def wait(inspector, indices=None, timeout=10.0, **kwargs):
    clock = Clock()
    result = _wait.wait_released(inspector, indices, timeout, poll_interval=0.5, clock=clock, sleep=clock.sleep, **kwargs)
    return result, clock


def test_released_once_holders_are_gone_and_memory_is_back():
    engine = holder(5000001, [0], memory={0: 70000})
    inspector = Scripted(view([gpu(0, 71000), gpu(1, 3)], [engine]),
                         view([gpu(0, 70500, unexplained_mib=70500), gpu(1, 3)]),  # holder gone, memory not yet freed
                         view([gpu(0, 200), gpu(1, 3)]))
    result, clock = wait(inspector)
    assert result["released"] is True and result["polls"] == 3
    assert clock.sleeps == [0.5, 0.5] and result["elapsed_s"] == 1.0
    assert [(g["index"], g["released"], g["memory_used_mib"]) for g in result["gpus"]] == [(0, True, 200), (1, True, 3)]
    # NVML is bounded by the time left (plus the fixed allowance for one last look).
    assert inspector.timeouts[:2] == [10.0 + _wait.NVML_SLACK_S, 9.5 + _wait.NVML_SLACK_S]


def test_threshold_is_inclusive_and_configurable():
    result, _clock = wait(Scripted(view([gpu(0, 256)])))
    assert result["released"] is True and result["polls"] == 1
    result, _clock = wait(Scripted(view([gpu(0, 256)])), timeout=1.0, max_used_mib=100)
    assert result["released"] is False and result["gpus"][0]["holders"] == []


def test_only_the_selected_gpus_are_waited_for():
    busy = holder(5000001, [1], memory={1: 9000})
    result, _clock = wait(Scripted(view([gpu(0, 3), gpu(1, 9000)], [busy])), indices=[0])
    assert result["released"] is True and [g["index"] for g in result["gpus"]] == [0]


def test_protected_daemons_and_control_only_holders_do_not_count():
    daemons = [holder(5000002, [0, 1], comm="nvidia-persiste", cmdline="/usr/bin/nvidia-persistenced --verbose"),
               holder(5000003, [0], comm="nv-hostengine", cmdline="nv-hostengine -n"),
               holder(5000004, [], comm="python3", cmdline="python3 probe.py", control_only=True)]
    result, _clock = wait(Scripted(view([gpu(0, 3), gpu(1, 3)], daemons)))
    assert result["released"] is True
    assert all(g["holders"] == [] for g in result["gpus"])


def test_excluded_and_included_protected_holders():
    daemon = holder(5000002, [0], comm="nvidia-persiste", cmdline="/usr/bin/nvidia-persistenced")
    result, _clock = wait(Scripted(view([gpu(0, 3)], [daemon])), timeout=1.0, include_protected=True)
    assert result["released"] is False and [h["pid"] for h in result["gpus"][0]["holders"]] == [5000002]
    mine = holder(5000005, [0], comm="my-exporter", cmdline="my-exporter")
    result, _clock = wait(Scripted(view([gpu(0, 3)], [mine])), exclude=["my-exporter"])
    assert result["released"] is True


def test_timeout_reports_the_holders_per_gpu():
    engine = holder(5000001, [0, 1], comm="VLLM::EngineCor", cmdline="VLLM::EngineCore", memory={0: 500})
    inspector = Scripted(view([gpu(0, 70000), gpu(1, 60000), gpu(2, 3)], [engine]))
    result, clock = wait(inspector, timeout=2.0)
    assert result["released"] is False
    assert result["elapsed_s"] == 2.0 and result["polls"] == 5 and sum(clock.sleeps) == 2.0
    by_index = {g["index"]: g for g in result["gpus"]}
    assert by_index[0]["holders"] == [{"pid": 5000001, "comm": "VLLM::EngineCor", "state": "S",
                                       "cmdline": "VLLM::EngineCore", "user": "svc-llm", "memory_mib": 500}]
    assert by_index[1]["holders"][0]["memory_mib"] is None
    assert (by_index[0]["released"], by_index[1]["released"], by_index[2]["released"]) == (False, False, True)


def test_driver_timeout_ends_the_wait_at_once():
    inspector = Scripted(view([], driver=DRIVER_HUNG), view([gpu(0, 3)]))
    result, clock = wait(inspector, timeout=30.0)
    assert result["released"] is False and result["polls"] == 1 and clock.sleeps == []
    assert result["driver"]["timed_out"] is True


def test_without_any_map_there_is_one_entry_for_all_gpus():
    no_driver = {"available": False, "error": "NVMLError_LibraryNotFound: NVML Shared Library Not Found", "timed_out": False}
    stray = holder(5000001, [], comm="python3", cmdline="python3 train.py")
    inspector = Scripted(view([], [stray], driver=no_driver), view([], [], driver=no_driver))
    result, _clock = wait(inspector)
    assert result["released"] is True and result["polls"] == 2
    assert result["gpus"] == [{"index": None, "memory_used_mib": None, "memory_reserved_mib": None,
                               "unexplained_mib": None, "holders": [], "memory_checked": False, "released": True}]


def test_without_any_map_control_only_holders_do_not_count():
    no_driver = {"available": False, "error": "NVMLError_LibraryNotFound: NVML Shared Library Not Found", "timed_out": False}
    probe = holder(5000004, [], comm="python3", cmdline="python3 probe.py", control_only=True)
    result, _clock = wait(Scripted(view([], [probe], driver=no_driver)))
    assert result["released"] is True and result["polls"] == 1 and result["gpus"][0]["holders"] == []


def test_unchecked_memory_releases_on_holders_alone():
    result, _clock = wait(Scripted(view([gpu(0, None, unexplained_mib=None, reserved_mib=None)])))
    assert result["released"] is True and result["gpus"][0]["memory_checked"] is False


def status_of(holders, used_mib=70000, unexplained_mib=0, checked=True):
    return {"index": 3, "holders": holders, "memory_checked": checked, "memory_used_mib": used_mib,
            "unexplained_mib": unexplained_mib}


def test_next_step_texts():
    d_state = status_of([{"state": "D"}, {"state": "S"}])
    assert "uninterruptible sleep (D)" in _wait.next_step(d_state) and "nvidia-smi --gpu-reset -i 3" in _wait.next_step(d_state)
    assert "gpuops.nvidia.gpu_kill" in _wait.next_step(status_of([{"state": "S"}]))
    leaked = _wait.next_step(status_of([], unexplained_mib=70000))
    assert "no process here holds the GPU" in leaked and "nvidia-smi --gpu-reset -i 3" in leaked
    assert "did not report memory" in _wait.next_step(status_of([], used_mib=None, checked=False))
