# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_holders.merge with synthetic NVML readings and scans; holder PIDs are real `sleep` children of this test."""
from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils import _holders, _procscan

# A PID no process can have (above the kernel's maximum pid_max, 2**22).
NO_SUCH_PID = 5000001


@pytest.fixture
def children():
    """Start N `sleep` children: children(N) -> [pid, ...]; all are killed and reaped afterwards."""
    started = []

    def start(count):
        for _number in range(count):
            started.append(subprocess.Popen(["sleep", "60"]))
        return [p.pid for p in started[-count:]]

    yield start
    for child in started:
        child.kill()
        child.wait()


def handles(pid, minors=(), control=False, seen_in=("fd",), thread_only=False):
    result = _procscan.DeviceHandles(pid)
    result.minors = set(minors)
    result.control = control
    result.seen_in = set(seen_in)
    result.thread_only = thread_only
    return result


def gpu_reading(index, minor, used_mib, processes=(), error=None):
    return {"index": index, "minor": minor, "uuid": "GPU-%d" % index, "name": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": "00000000:%02X:00.0" % (0x18 + index), "error": error,
            "memory": {"total_mib": 81559, "used_mib": used_mib, "free_mib": 81559 - used_mib - 529, "reserved_mib": 529,
                       "source": "nvmlDeviceGetMemoryInfo_v2"},
            "processes": [{"pid": pid, "used_mib": used, "type": "compute"} for pid, used in processes]}


def driver(*gpus):
    return {"available": True, "error": None, "driver_version": "580.95.05", "nvml_version": None,
            "cuda_driver_version": None, "gpus": list(gpus)}


def by_pid(view):
    return {h["pid"]: h for h in view["holders"]}


def test_merge_maps_minors_to_indices_and_attributes_memory(children):
    engine, inherited, control, unmapped = children(4)
    reading = driver(gpu_reading(0, 5, 4000, processes=[(engine, 3000), (NO_SUCH_PID, 500)]),
                     gpu_reading(1, 0, 3))
    scan = {engine: handles(engine, minors=[5], control=True),       # minor 5 is NVML index 0
            inherited: handles(inherited, minors=[5]),                # forked child: fd only, not in NVML's list
            control: handles(control, control=True),                  # only /dev/nvidiactl, /dev/nvidia-uvm
            unmapped: handles(unmapped, minors=[7], seen_in=["mapping"])}
    view = _holders.merge(reading, scan, psutil)
    holders = by_pid(view)
    assert view["index_source"] == "nvml"
    assert sorted(holders) == sorted([engine, inherited, control, unmapped])

    assert holders[engine]["gpus"] == [0] and holders[engine]["minors"] == [5]
    assert holders[engine]["seen_in"] == ["driver", "fd"]
    assert holders[engine]["memory_mib"] == {"0": 3000}
    assert holders[engine]["control_only"] is False

    assert holders[inherited]["gpus"] == [0] and holders[inherited]["seen_in"] == ["fd"]
    assert holders[inherited]["memory_mib"] == {"0": None}

    assert holders[control]["control_only"] is True and holders[control]["gpus"] == []
    assert holders[unmapped]["gpus"] == [] and holders[unmapped]["control_only"] is False
    assert view["unmapped_minors"] == [7]

    gpu0, gpu1 = view["gpus"]
    assert (gpu0["index"], gpu0["minor"], gpu1["index"], gpu1["minor"]) == (0, 5, 1, 0)
    assert gpu0["holder_pids"] == sorted([engine, inherited]) and gpu1["holder_pids"] == []
    assert gpu0["driver_processes"] == [{"pid": engine, "used_mib": 3000, "type": "compute", "verified": True},
                                        {"pid": NO_SUCH_PID, "used_mib": 500, "type": "compute", "verified": False}]
    assert gpu0["explained_mib"] == 3500 and gpu0["unexplained_mib"] == 500
    assert gpu0["memory_used_mib"] == 4000 and gpu0["memory_reserved_mib"] == 529
    assert gpu1["explained_mib"] == 0 and gpu1["unexplained_mib"] == 3


def test_holder_details_describe_the_real_process(children):
    (pid,) = children(1)
    view = _holders.merge(driver(gpu_reading(0, 0, 10)), {pid: handles(pid, minors=[0])}, psutil)
    (holder,) = view["holders"]
    assert holder["ppid"] == os.getpid()
    assert holder["comm"] == "sleep" and holder["cmdline"] == "sleep 60"
    assert holder["uid"] == os.getuid() and holder["state"] in ("S", "R")
    assert holder["start_ticks"] == _procscan.read_start_ticks(pid)
    assert holder["pgid"] == os.getpgid(pid) and holder["sid"] == os.getsid(pid)


def test_excluded_pids_are_never_holders(children):
    own, other = children(2)
    reading = driver(gpu_reading(0, 0, 2000, processes=[(own, 1000), (other, 1000)]))
    scan = {own: handles(own, minors=[0], control=True), other: handles(other, minors=[0])}
    view = _holders.merge(reading, scan, psutil, exclude_pids=[own])
    assert [h["pid"] for h in view["holders"]] == [other]
    assert view["gpus"][0]["holder_pids"] == [other]
    verified = {p["pid"]: p["verified"] for p in view["gpus"][0]["driver_processes"]}
    assert verified == {own: False, other: True}


def test_driver_listed_pid_that_the_scan_does_not_confirm_is_not_a_holder():
    reading = driver(gpu_reading(0, 0, 900, processes=[(NO_SUCH_PID, 900)]))
    view = _holders.merge(reading, {}, psutil)
    assert view["holders"] == []
    assert view["gpus"][0]["driver_processes"][0]["verified"] is False
    assert view["gpus"][0]["holder_pids"] == []
    assert view["gpus"][0]["unexplained_mib"] == 0  # NVML attributes it, even if we cannot see the process


def test_holder_listed_twice_on_one_gpu_sums_its_memory(children):
    (pid,) = children(1)
    reading = driver(gpu_reading(0, 0, 3000, processes=[(pid, 1000), (pid, 2000)]))
    view = _holders.merge(reading, {pid: handles(pid, minors=[0])}, psutil)
    assert view["holders"][0]["memory_mib"] == {"0": 3000}


def test_vanished_holder_is_dropped():
    reading = driver(gpu_reading(0, 0, 10))
    view = _holders.merge(reading, {NO_SUCH_PID: handles(NO_SUCH_PID, minors=[0])}, psutil)
    assert view["holders"] == [] and view["gpus"][0]["holder_pids"] == []


def test_without_nvml_the_map_comes_from_proc_driver(tmp_path):
    for bus, minor in (("0000:2a:00.0", 0), ("0000:18:00.0", 3)):
        (tmp_path / "driver" / "nvidia" / "gpus" / bus).mkdir(parents=True)
        (tmp_path / "driver" / "nvidia" / "gpus" / bus / "information").write_text(
            "Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t GPU-%s\nDevice Minor: \t %d\n" % (bus, minor))
    table, source = _holders.minor_map({"available": False, "gpus": []}, str(tmp_path))
    assert source == "proc_driver"
    assert [(gpu["index"], gpu["minor"], gpu["pci_bus_id"]) for gpu in table] == [(0, 3, "00000000:18:00.0"),
                                                                                  (1, 0, "00000000:2a:00.0")]
    view = _holders.merge(None, {}, psutil, proc=str(tmp_path))
    assert view["index_source"] == "proc_driver"
    assert [(gpu["index"], gpu["memory_used_mib"], gpu["unexplained_mib"]) for gpu in view["gpus"]] == [
        (0, None, None), (1, None, None)]


def test_without_nvml_and_kernel_module_there_is_no_map(tmp_path, children, monkeypatch):
    assert _holders.minor_map(None, str(tmp_path)) == ([], None)
    monkeypatch.setattr(_procscan, "proc_driver_minors", lambda proc: [])  # holders' details still come from /proc
    (pid,) = children(1)
    view = _holders.merge(None, {pid: handles(pid, minors=[0])}, psutil)
    assert view["index_source"] is None and view["gpus"] == []
    assert view["unmapped_minors"] == [0]
    (holder,) = view["holders"]
    assert (holder["pid"], holder["gpus"], holder["minors"], holder["control_only"]) == (pid, [], [0], False)
