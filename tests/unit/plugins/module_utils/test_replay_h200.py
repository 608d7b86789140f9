# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Replay of the records of a real NVIDIA H200 (driver 580.159.04, 2026-12-04; tests/fixtures/hardware/) through the
code the modules use: each recorded process's /dev/nvidia* fds and /proc/PID/maps lines become a /proc tree that
_procscan.scan_holders reads, the recorded process lists and memory become the NVML reading, and _holders.merge decides.
Every process kind of tests/fixtures/hardware/README.md (point 2) must get the role the real driver implies: a holder
where it has a context, a device user otherwise.

The records keep the first 40 maps lines that name "nvidia" (libraries included): a process that loaded libcuda may
have its device mappings cut off. That only hides mappings of processes without a context (their device mappings come
after the libraries); every context's rw-s /dev/nvidia0 mapping is at a low address and recorded.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _holders, _procscan

RECORDS = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "hardware" / "h200-580.159.04"
TOTAL_MIB, RESERVED_MIB = 143771, 615


def steps(name):
    """{step name: value} of one record file."""
    with open(RECORDS / name) as handle:
        return {step["name"]: step["value"] for step in json.load(handle)["steps"]}


def maps_line(line, number):
    """A full /proc/PID/maps line; probe5 keeps "perms offset sizeK path": it gets an address of its own."""
    fields = line.split()
    if len(fields) == 4 and fields[2].endswith("K"):
        start = 0x7F0000000000 + number * 0x1000000
        return "%x-%x %s %s 00:06 142 %s" % (start, start + int(fields[2][:-1]) * 1024, fields[0], fields[1], fields[3])
    return line


def plant(proc, pid, record):
    """proc/PID with the recorded fds (path -> count) and maps lines."""
    base = proc / str(pid)
    (base / "fd").mkdir(parents=True)
    fd = 3
    for path, count in sorted(record["fds"].items()):
        for _copy in range(count):
            os.symlink(path, str(base / "fd" / str(fd)))
            fd += 1
    (base / "task" / str(pid)).mkdir(parents=True)
    os.symlink(str(base / "fd"), str(base / "task" / str(pid) / "fd"))
    lines = [maps_line(line, n) for n, line in enumerate(record.get("maps", []))]
    (base / "maps").write_text("".join(line + "\n" for line in lines))


def details(pids):
    return {
        pid: {
            "pid": pid,
            "ppid": 1,
            "pgid": pid,
            "sid": pid,
            "comm": "python3",
            "state": "S",
            "start_ticks": 1,
            "kernel_thread": False,
            "user": "root",
            "uid": 0,
            "cmdline": "python3",
            "start_time": None,
        }
        for pid in pids
    }


def reading(used_mib, lists):
    """The NVML reading of GPU 0 (minor 0): memory info v2 and the process lists ({type: [(pid, MiB)]})."""
    processes = [
        {"pid": pid, "used_mib": mib, "type": kind, "gpu_instance_id": None, "compute_instance_id": None}
        for kind, entries in lists.items()
        for pid, mib in entries
    ]
    memory = {
        "total_mib": TOTAL_MIB,
        "used_mib": used_mib,
        "free_mib": TOTAL_MIB - RESERVED_MIB - used_mib,
        "reserved_mib": RESERVED_MIB,
        "source": "nvmlDeviceGetMemoryInfo_v2",
        "used_includes_reserved": False,
        "used_excluding_reserved_mib": used_mib,
        "supported": True,
    }
    gpu = {"index": 0, "minor": 0, "uuid": "GPU-h200", "name": "NVIDIA H200", "pci_bus_id": "00000000:00:06.0"}
    gpu.update(error=None, memory=memory, processes=processes, mig_mode={"current": False, "pending": False})
    gpu.update(mig_devices=[], process_list_version="v3", processes_error=None)
    return {
        "available": True,
        "error": None,
        "driver_version": "580.159.04",
        "nvml_version": "13.580.159.04",
        "cuda_driver_version": 13000,
        "gpus": [gpu],
    }


def replay(tmp_path, records, used_mib, lists, initial_pidns=True):
    """Scan the planted processes with _procscan and merge them with the reading, as gpu_facts does."""
    proc = tmp_path / "proc"
    for pid, record in records.items():
        plant(proc, pid, record)
    scan = _procscan.scan_holders(str(proc), workers=1)
    listed = {pid for entries in lists.values() for pid, _mib in entries}
    table = [{"index": 0, "minor": 0, "uuid": "GPU-h200", "name": "NVIDIA H200", "pci_bus_id": "00000000:00:06.0"}]
    return _holders.merge(
        reading(used_mib, lists), table, scan, details(set(records) & (set(scan) | listed)), initial_pidns=initial_pidns
    )


def roles(view):
    holders = {h["pid"]: (h["attribution"]["0"], h["memory_mib"]["0"]) for h in view["holders"]}
    return holders, sorted(u["pid"] for u in view["device_users"])


def compute(nvml_step):
    return {"compute": [(item["pid"], item["mib"]) for item in nvml_step["procs"]]}


def test_dead_creator_beside_bystanders_names_the_inherited_child_alone(tmp_path):
    """probe2-bystanders.json: a 1 GiB context, a small context, an NVML client, torch.cuda.is_available(),
    torch.cuda.device_count() and nvidia-smi -l 1 beside a dead creator (PID 449, 2566 MiB) whose forked child holds
    its handles. Only the contexts and the child hold GPU 0; the child gets the creator's memory."""
    record = steps("probe2-bystanders.json")
    pids = record["pids"]
    procs = dict(record["before_kill.procs"])
    records = {procs[name]["pid"]: procs[name] for name in ("ctx", "small_ctx", "nvml", "is_available")}
    records.update({procs[name]["pid"]: procs[name] for name in ("device_count", "nvidia_smi_loop")})
    records[pids["inherited_child"]] = record["after_kill.inherited_child"]
    after = record["after_kill.nvml"]
    view = replay(tmp_path, records, after["mem_v2"]["used"], compute(after))
    holders, users = roles(view)
    assert holders == {
        pids["ctx"]: ("driver", 1542),
        pids["small_ctx"]: ("driver", 612),
        pids["inherited_child"]: ("device_file", 2566),
    }
    assert users == sorted(pids[name] for name in ("nvml", "is_available", "device_count", "nvidia_smi_loop"))
    gpu = view["gpus"][0]
    assert [(e["pid"], e["reason"]) for e in gpu["exited"]] == [(pids["dead_parent"], "exited")]
    assert gpu["memory_unexplained"] is False and gpu["suspects"] == []


def test_a_reused_pid_is_not_a_holder_and_the_child_gets_the_memory(tmp_path):
    """probe3-reuse-pinned.json: an NVML client got the dead creator's number (435), still listed with 2566 MiB. The
    child that holds the context (its fds and maps: probe2's inherited child, the same kind of process) holds it."""
    record = steps("probe3-reuse-pinned.json")
    pids = record["reuse.pids"]
    child = steps("probe2-bystanders.json")["after_kill.inherited_child"]
    records = {pids["reuser"]: record["reuse.reuser_proc"], pids["child"]: child}
    view = replay(tmp_path, records, record["reuse.nvml"]["mem_v2"]["used"], compute(record["reuse.nvml"]))
    holders, users = roles(view)
    assert holders == {pids["child"]: ("device_file", 2566)}
    assert users == [pids["reuser"]]
    assert [(e["pid"], e["reason"]) for e in view["gpus"][0]["exited"]] == [(pids["reuser"], "reused")]


def test_mps_client_counted_once_and_the_control_daemon_is_a_device_user(tmp_path):
    """probe4-ipc-mps.json: the client (1540 MiB) is in the compute and the MPS list, the server (66 MiB) in the compute
    list, the control daemon in none; GPU 0 uses 1614 MiB."""
    record = steps("probe4-ipc-mps.json")
    pids, lists = record["mps.pids"], record["mps.lists"]
    records = {int(pid): proc for pid, proc in record["mps.procs"].items()}
    view = replay(
        tmp_path,
        records,
        lists["used"],
        {"compute": lists["mputeRunningProcesses"], "mps": lists["SComputeRunningProcesses"]},
    )
    holders, users = roles(view)
    assert holders == {pids["client"]: ("driver", 1540), pids["server"][0]: ("driver", 66)}
    assert users == pids["control"]
    gpu = view["gpus"][0]
    assert gpu["explained_mib"] == 1606 and gpu["unexplained_mib"] == 8 and not gpu["memory_unexplained"]


@pytest.mark.parametrize("name", ["jax_array", "jax_devices", "cupy_array", "torch_vmm", "torch_freed", "nobody_torch"])
def test_every_framework_context_is_a_holder_and_an_nvml_client_is_not(tmp_path, name):
    """probe5-frameworks.json: contexts made by JAX, CuPy, torch (CUDA VMM, after freeing everything, as uid 65534) and a
    non-root NVML client: each context holds its listed memory, the NVML client is a device user."""
    record = steps("probe5-frameworks.json")
    rows = record["rows"]
    records = {rows[name]["pid"]: rows[name], rows["nobody_nvml"]["pid"]: rows["nobody_nvml"]}
    listed = [(item["pid"], item["mib"]) for item in record["nvml"]["procs"] if item["pid"] == rows[name]["pid"]]
    view = replay(tmp_path, records, rows[name]["listed_mib"], {"compute": listed})
    holders, users = roles(view)
    assert holders == {rows[name]["pid"]: ("driver", rows[name]["listed_mib"])}
    assert users == [rows["nobody_nvml"]["pid"]]
