# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Merging what the driver says (NVML) and what the kernel says (/proc) into holders.

Holding a GPU means holding its memory (docs/attribution.md). A holder of GPU i is either a
process the driver lists on GPU i (compute, graphics, MPS) and that this PID namespace confirms
(it holds GPU i's device file; an MPS client: /dev/nvidiactl), or, only where GPU i has memory the
driver's lists do not explain, a CUDA user that holds GPU i's device file without being listed
(an inherited handle, a zombie leader's thread, a mapping). Every other process with NVIDIA
device files open is a device user: NVML clients and NCCL workers open every /dev/nvidiaN of the
host with no context there. GPUs are matched through the minor number -> NVML index map; minor ==
index is never assumed. `merge` is pure: the snapshot (module_utils/_gpus.py) reads /proc and psutil.
"""
from __future__ import annotations


def _memory_unexplained(used, listed, listed_unknown, tolerance_mib):
    """(unexplained MiB or None, whether it counts) for one GPU.

    Unknown used memory (no driver, a lost GPU) counts: nothing explains it, so CUDA users of the
    device file are its holders, as a fuser-style tool would say. A list entry without a figure
    (NVML_VALUE_NOT_AVAILABLE) explains the GPU's memory as far as can be told: it does not count.
    """
    if used is None:
        return None, True
    if listed_unknown:
        return None, False
    unexplained = max(0, used - listed)
    return unexplained, unexplained > tolerance_mib


def _file_indices(handles, by_minor, unmapped):
    indices = set()
    for minor in handles.minors:
        if minor in by_minor:
            indices.add(by_minor[minor])
        else:
            unmapped.add(minor)
    return indices


def merge(driver, table, scan, processes, tolerance_mib=256, exclude_pids=()):
    """Build the per-GPU view, the holders and the device users from one NVML reading and one /proc scan.

    Args:
        driver: read_driver() dict, or None when NVML could not be asked.
        table: minor_map()'s GPU list ([{"index", "minor", "uuid", "name", "pci_bus_id"}]).
        scan: {pid: DeviceHandles} from _procscan (a full scan, or the listed PIDs only).
        processes: {pid: process_details() dict} for the scanned and listed PIDs that exist here.
        tolerance_mib: used memory the driver's lists may leave unexplained before device-file
            users become holders (the idle floor that max_used_mib allows; docs/attribution.md).
        exclude_pids: PIDs that are ours (this module, its NVML worker): never holders or users.

    Returns a dict:
      gpus: [{"index", "minor", "uuid", "name", "pci_bus_id", "memory_total_mib", "memory_used_mib",
              "memory_free_mib", "memory_reserved_mib", "memory_source", "error",
              "driver_processes" ([{pid, used_mib, type, verified}]), "explained_mib" (what the lists say),
              "unexplained_mib" (used minus listed, None when unknown), "memory_unexplained" (bool: beyond
              tolerance_mib, or unknown), "tolerance_mib", "foreign" ([{pid, used_mib, type, reason ("absent" or
              "not_holding"), comm}]: listed PIDs that no process here confirms), "suspects" (PIDs of NVML-only
              clients holding the device file where memory is unexplained and no CUDA user does),
              "holder_pids", "device_user_pids"}]
      holders: [process details + {"gpus" (indices held), "device_gpus" (indices whose device file is open),
                "minors", "memory_mib" ({"<index>": MiB or None}), "attribution" ({"<index>": "driver" or
                "device_file"}), "seen_in" (subset of driver, fd, mapping), "kind" ("cuda" or "nvml"),
                "control_only" (listed while holding no device file: an MPS client), "thread_only"}]
      device_users: [process details + {"device_gpus", "minors", "kind", "seen_in", "thread_only"}]
      unmapped_minors: minors held by some process that no known GPU has.
    """
    exclude = set(exclude_pids)
    by_minor = {gpu["minor"]: gpu["index"] for gpu in table if gpu.get("minor") is not None}
    nvml_gpus = {gpu["index"]: gpu for gpu in (driver or {}).get("gpus", [])}
    unmapped = set()
    files = {pid: _file_indices(handles, by_minor, unmapped) for pid, handles in scan.items() if pid not in exclude}

    held = {}  # pid -> {"gpus": {index: MiB or None}, "attribution": {index: how}}

    def hold(pid, index, mib, how):
        entry = held.setdefault(pid, {"memory": {}, "attribution": {}})
        previous = entry["memory"].get(index)
        entry["memory"][index] = mib if previous is None else previous + (mib or 0)
        entry["attribution"].setdefault(index, how)

    gpus = []
    for entry in table:
        index = entry["index"]
        nvml_gpu = nvml_gpus.get(index, {})
        memory = nvml_gpu.get("memory") or {}
        gpu = dict(entry)
        gpu.update({
            "memory_total_mib": memory.get("total_mib"), "memory_used_mib": memory.get("used_mib"),
            "memory_free_mib": memory.get("free_mib"), "memory_reserved_mib": memory.get("reserved_mib"),
            "memory_source": memory.get("source"), "error": nvml_gpu.get("error"), "driver_processes": [],
            "foreign": [], "suspects": [], "tolerance_mib": tolerance_mib,
        })
        listed, listed_unknown = 0, False
        for item in nvml_gpu.get("processes", []):
            pid = item["pid"]
            handles = scan.get(pid)
            if item["type"] == "mps":
                verified = handles is not None and handles.ctl
            else:
                verified = handles is not None and index in files.get(pid, ())
            verified = verified and pid in processes and pid not in exclude
            gpu["driver_processes"].append(dict(item, verified=verified))
            if item["used_mib"] is None:
                listed_unknown = True
            else:
                listed += item["used_mib"]
            if verified:
                hold(pid, index, item["used_mib"], "driver")
            elif pid not in exclude:
                present = processes.get(pid)
                gpu["foreign"].append({"pid": pid, "used_mib": item["used_mib"], "type": item["type"],
                                       "reason": "not_holding" if present else "absent",
                                       "comm": present["comm"] if present else None})
        gpu["explained_mib"] = listed
        gpu["unexplained_mib"], gpu["memory_unexplained"] = _memory_unexplained(
            gpu["memory_used_mib"], listed, listed_unknown, tolerance_mib)
        gpus.append(gpu)

    listed_here = set(held)
    for gpu in gpus:
        if not gpu["memory_unexplained"]:
            continue
        index = gpu["index"]
        candidates = [pid for pid in sorted(files) if index in files[pid] and pid not in listed_here and pid in processes]
        cuda = [pid for pid in candidates if scan[pid].cuda]
        for pid in cuda:
            hold(pid, index, None, "device_file")
        if not cuda:
            gpu["suspects"] = candidates
    if not table:
        # No index map at all (no NVML, no /proc/driver/nvidia): CUDA users of any GPU's device file hold "a GPU".
        for pid in sorted(files):
            if scan[pid].cuda and scan[pid].minors and pid in processes:
                held.setdefault(pid, {"memory": {}, "attribution": {}})

    holders, users = [], []
    for pid in sorted(set(files) | set(held)):
        if pid not in processes:
            continue
        handles = scan.get(pid)
        details = dict(processes[pid])
        details.update({
            "device_gpus": sorted(files.get(pid, ())), "minors": sorted(handles.minors) if handles else [],
            "kind": "cuda" if handles is not None and handles.cuda else "nvml",
            "seen_in": sorted(handles.seen_in) if handles else [], "thread_only": bool(handles and handles.thread_only),
        })
        if pid in held:
            memory = held[pid]["memory"]
            details.update({
                "gpus": sorted(memory), "memory_mib": {str(i): memory[i] for i in sorted(memory)},
                "attribution": {str(i): how for i, how in sorted(held[pid]["attribution"].items())},
                "control_only": not files.get(pid),
            })
            if "driver" in details["attribution"].values():
                details["seen_in"] = sorted(set(details["seen_in"]) | {"driver"})
            holders.append(details)
        else:
            users.append(details)
    for gpu in gpus:
        gpu["holder_pids"] = [h["pid"] for h in holders if gpu["index"] in h["gpus"]]
        gpu["device_user_pids"] = [u["pid"] for u in users if gpu["index"] in u["device_gpus"]]
    return {"gpus": gpus, "holders": holders, "device_users": users, "unmapped_minors": sorted(unmapped)}
