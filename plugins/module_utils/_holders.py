# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Merging what the driver says (NVML) and what the kernel says (/proc) into holders.

A holder is a process that holds a GPU: it is in one of the driver's process lists
(compute, graphics, MPS) for that GPU, and/or one of its threads has /dev/nvidia<minor>
open, and/or it maps that file. GPUs are matched through the minor number -> NVML index
map; minor == index is never assumed.
"""
from __future__ import annotations

import datetime
import pwd

from ansible_collections.gpuops.nvidia.plugins.module_utils import _procscan


def minor_map(driver, proc="/proc"):
    """Index/minor table of the GPUs: [{"index", "minor", "uuid", "name", "pci_bus_id"}] and its source.

    From NVML when the driver answered (nvmlDeviceGetMinorNumber); otherwise from the kernel
    module's /proc/driver/nvidia/gpus/*/information (indices in PCI bus order, NVML's default);
    otherwise [] (no mapping: GPUs can then only be selected all together).
    Returns (gpus, source) with source "nvml", "proc_driver" or None.
    """
    if driver and driver.get("available"):
        return ([{k: gpu.get(k) for k in ("index", "minor", "uuid", "name", "pci_bus_id")} for gpu in driver["gpus"]],
                "nvml")
    gpus = _procscan.proc_driver_minors(proc)
    if gpus:
        for index, gpu in enumerate(gpus):
            gpu["index"] = index
        return gpus, "proc_driver"
    return [], None


def _user(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def process_details(psutil, pid, proc="/proc"):
    """Identity and description of one process, or None when it is gone.

    Returns {"pid", "ppid", "pgid", "sid", "comm", "state", "start_ticks"} from /proc/PID/stat,
    and {"user", "uid", "cmdline" (str: /proc/PID/cmdline joined by spaces, trailing blanks removed, "" for a zombie),
    "start_time" (ISO 8601, UTC)} from psutil (None where access is denied).
    """
    details = _procscan.read_stat(pid, proc)
    if details is None:
        return None
    details.update(pid=pid, user=None, uid=None, cmdline=None, start_time=None)
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            details["uid"] = process.uids().real
            details["user"] = _user(details["uid"])
            details["start_time"] = datetime.datetime.fromtimestamp(process.create_time(), datetime.timezone.utc).isoformat()
        try:
            # rstrip: setproctitle (vLLM's VLLM::* titles) pads the argv area with spaces.
            details["cmdline"] = " ".join(process.cmdline()).rstrip()
        except psutil.ZombieProcess:
            details["cmdline"] = ""
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        pass
    return details


def merge(driver, scan, psutil, proc="/proc", exclude_pids=()):
    """Build the per-GPU view and the holder list from one NVML reading and one /proc scan.

    Args:
        driver: read_driver() dict, or None when NVML could not be asked.
        scan: {pid: DeviceHandles} from _procscan.scan_holders().
        psutil: the psutil module.
        exclude_pids: PIDs that are ours (this module, its NVML worker): never holders.

    Returns a dict:
      gpus: [{"index", "minor", "uuid", "name", "pci_bus_id", "memory_total_mib", "memory_used_mib",
              "memory_free_mib", "memory_reserved_mib", "memory_source", "error", "holder_pids",
              "driver_processes" (the driver's lists, [{pid, used_mib, type, verified}]),
              "explained_mib" (sum of driver-reported memory), "unexplained_mib" (used minus explained)}]
      holders: [process_details() + {"gpus" (indices), "minors", "memory_mib" ({"<index>": MiB or None}),
                "seen_in" (subset of driver, fd, mapping), "control_only" (holds only /dev/nvidiactl,
                /dev/nvidia-uvm*...: uses the driver, no GPU of its own), "thread_only"}]
      unmapped_minors: minors held by some process that no known GPU has.
      index_source: "nvml", "proc_driver" or None.
    A PID from the driver's lists counts as a holder only when /proc confirms it holds NVIDIA
    device files: inside a container NVML reports host PIDs, which may not exist or may name
    unrelated processes here. Unconfirmed ones stay in driver_processes with verified=false.
    """
    exclude = set(exclude_pids)
    table, index_source = minor_map(driver, proc)
    by_minor = {gpu["minor"]: gpu["index"] for gpu in table if gpu.get("minor") is not None}
    nvml_gpus = {gpu["index"]: gpu for gpu in (driver or {}).get("gpus", [])}

    holders = {}
    unmapped = set()
    for pid, handles in scan.items():
        if pid in exclude:
            continue
        indices = set()
        for minor in handles.minors:
            if minor in by_minor:
                indices.add(by_minor[minor])
            else:
                unmapped.add(minor)
        holders[pid] = {"gpus": indices, "minors": set(handles.minors), "memory_mib": {},
                        "seen_in": set(handles.seen_in), "control_only": not handles.minors,
                        "thread_only": handles.thread_only}

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
        })
        explained = 0
        for listed in nvml_gpu.get("processes", []):
            pid = listed["pid"]
            verified = pid in holders
            gpu["driver_processes"].append(dict(listed, verified=verified))
            explained += listed["used_mib"] or 0
            if not verified:
                continue
            holder = holders[pid]
            holder["gpus"].add(index)
            holder["control_only"] = False
            holder["seen_in"].add("driver")
            previous = holder["memory_mib"].get(index)
            used = listed["used_mib"]
            holder["memory_mib"][index] = used if previous is None else previous + (used or 0)
        gpu["explained_mib"] = explained
        used = gpu["memory_used_mib"]
        gpu["unexplained_mib"] = None if used is None else max(0, used - explained)
        gpus.append(gpu)

    result_holders = []
    for pid in sorted(holders):
        details = process_details(psutil, pid, proc)
        if details is None:  # vanished since the scan
            continue
        holder = holders[pid]
        details.update({
            "gpus": sorted(holder["gpus"]), "minors": sorted(holder["minors"]),
            "memory_mib": {str(index): holder["memory_mib"].get(index) for index in sorted(holder["gpus"])},
            "seen_in": sorted(holder["seen_in"]), "control_only": holder["control_only"], "thread_only": holder["thread_only"],
        })
        result_holders.append(details)
    for gpu in gpus:
        gpu["holder_pids"] = [h["pid"] for h in result_holders if gpu["index"] in h["gpus"]]
    return {"gpus": gpus, "holders": result_holders, "unmapped_minors": sorted(unmapped), "index_source": index_source}
