# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The keys of the dicts that the GPU modules return, named once.

The modules' RETURN documentation says what each key means; these tuples say which keys there are.
_holders builds holders, device users and GPU entries with them, _gpus the driver state, _select the
wait status entries, and tests/integration/test_result_contracts.py checks every module's result
against both (these shapes and RETURN).
"""
from __future__ import annotations

# A process as the snapshot describes it (_gpus.process_details): /proc/PID/stat, then psutil.
PROCESS_KEYS = ("pid", "ppid", "pgid", "sid", "comm", "state", "start_ticks", "kernel_thread", "user", "uid", "cmdline",
                "start_time")
# A process with NVIDIA device files open that holds no GPU's memory (_holders.merge).
DEVICE_USER_KEYS = PROCESS_KEYS + ("device_gpus", "minors", "kind", "seen_in", "thread_only")
# A process holding a GPU's memory (_holders.merge); the snapshot adds "parent".
HOLDER_KEYS = DEVICE_USER_KEYS + ("gpus", "memory_mib", "attribution", "control_only", "mig", "contexts_of")
SNAPSHOT_HOLDER_KEYS = HOLDER_KEYS + ("parent",)
# Added to holders and device users where the snapshot reads owners (_owners.owner_of; its keys: _owners.OWNER_KEYS).
OWNER = "owner"

# The index/minor table of a GPU (_gpus.minor_map).
GPU_TABLE_KEYS = ("index", "minor", "uuid", "name", "pci_bus_id")
# One GPU of the snapshot (_holders.merge).
GPU_KEYS = GPU_TABLE_KEYS + (
    "memory_total_mib", "memory_used_mib", "memory_free_mib", "memory_reserved_mib", "memory_source", "error",
    "driver_processes", "foreign", "suspects", "tolerance_mib", "mig_mode", "process_list_version", "processes_error",
    "memory_used_includes_reserved", "memory_used_excluding_reserved_mib", "reserved_allowance_mib", "mig_devices",
    "explained_mib", "unexplained_mib", "memory_unexplained", "holder_pids", "device_user_pids",
    "exited", "memory_supported", "unexplained_cause")
# One entry of a GPU's driver_processes: the driver's list entry (_nvml) and whether /proc confirms it.
DRIVER_PROCESS_KEYS = ("pid", "used_mib", "type", "gpu_instance_id", "compute_instance_id", "verified")
# A PID the driver lists that no process here confirms (foreign; exited, with reason "exited" or "reused").
FOREIGN_KEYS = ("pid", "used_mib", "type", "reason", "comm")
# One MIG instance of a GPU: _nvml's MIG device, then its holders as for a GPU (_holders.merge).
MIG_DEVICE_KEYS = ("index", "uuid", "gpu_instance_id", "compute_instance_id", "name", "profile", "memory_total_mib",
                   "memory_used_mib", "memory_free_mib", "memory_source", "listed_mib", "foreign", "holder_pids",
                   "reserved_allowance_mib", "tolerance_mib", "unexplained_mib", "memory_unexplained", "exited")
# The state of the NVIDIA driver library in a snapshot (_gpus.Inspector.snapshot).
DRIVER_KEYS = ("available", "error", "driver_version", "nvml_version", "cuda_driver_version", "timed_out")
# What the snapshot returns (gpu_facts' ansible_facts.nvidia; gpu_kill's before and after).
VIEW_KEYS = ("gpus", "holders", "device_users", "unmapped_minors", "index_source", "scan", "driver", "scan_problems")

# A holder in a wait report (_select.brief), and a left-alone one (with its reason).
BRIEF_HOLDER_KEYS = ("pid", "comm", "state", "cmdline", "user", "memory_mib", "attribution", "parent")
LEFT_ALONE_KEYS = BRIEF_HOLDER_KEYS + ("reason",)
# One selected GPU (or MIG instance) in a wait (_select.Selection.gpu_status); MIG instances add "mig_profile",
# a whole GPU in MIG mode that is not released "mig_in_use", a GPU that is not released after a wait "next_step"
# (_wait.conclude).
WAIT_GPU_KEYS = ("index", "uuid", "mig_uuid", "memory_used_mib", "memory_reserved_mib", "unexplained_mib",
                 "memory_unexplained", "holders", "left_alone", "left_alone_mib", "foreign", "suspects", "memory_checked",
                 "error", "reserved_allowance_mib", "memory_note", "released")


def entry(keys, **values):
    """A dict with exactly `keys`: `values` where given, None for the others. Raises KeyError for a value of a
    key that is not in `keys` (a shape that drifted)."""
    unknown = set(values) - set(keys)
    if unknown:
        raise KeyError("not in the shape: %s" % ", ".join(sorted(unknown)))
    return {key: values.get(key) for key in keys}
