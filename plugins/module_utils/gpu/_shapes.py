# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The dicts that the GPU modules return, typed and named once.

Each shape is a TypedDict (Python 3.9 and later); its `*_KEYS` tuple is the shape's keys, in order. The
modules' RETURN documentation says what each key means. _holders builds holders, device users and GPU
entries, _gpus the driver state and the snapshot, _release the wait status entries, and
tests/integration/test_result_contracts.py checks every module's result against these shapes and RETURN.
Memory is in MiB (int), times in seconds (float); None means "not known", never 0.
"""

from __future__ import annotations

from typing import Dict, List, Optional, TypedDict


class Process(TypedDict):
    """A process as the snapshot describes it (_gpus.process_details): /proc/PID/stat, then psutil."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    comm: str
    state: str
    start_ticks: int
    kernel_thread: bool
    user: Optional[str]
    uid: Optional[int]
    cmdline: str
    start_time: Optional[float]


class DeviceUser(Process):
    """A process with NVIDIA device files open that holds no GPU's memory (_holders.merge)."""

    device_gpus: List[int]
    minors: List[int]
    kind: str
    seen_in: List[str]
    thread_only: bool


class Holder(DeviceUser):
    """A process holding a GPU's memory (_holders.merge); memory_mib and attribution are keyed by GPU index."""

    gpus: List[int]
    memory_mib: Dict[str, Optional[int]]
    attribution: Dict[str, str]
    control_only: bool
    mig: Dict[str, List[str]]
    contexts_of: Dict[str, List[int]]


class SnapshotHolder(Holder):
    """A holder in a snapshot, with its parent ({"pid", "comm"} or None)."""

    parent: Optional[dict]


class GpuTable(TypedDict):
    """The index/minor table of a GPU (_gpus.minor_map)."""

    index: int
    minor: Optional[int]
    uuid: Optional[str]
    name: Optional[str]
    pci_bus_id: Optional[str]


class Gpu(GpuTable):
    """One GPU of the snapshot (_holders.merge)."""

    memory_total_mib: Optional[int]
    memory_used_mib: Optional[int]
    memory_free_mib: Optional[int]
    memory_reserved_mib: Optional[int]
    memory_source: Optional[str]
    error: Optional[str]
    driver_processes: List[dict]
    foreign: List[dict]
    suspects: List[dict]
    tolerance_mib: int
    mig_mode: Optional[bool]
    process_list_version: Optional[str]
    processes_error: Optional[str]
    memory_used_includes_reserved: Optional[bool]
    memory_used_excluding_reserved_mib: Optional[int]
    reserved_allowance_mib: int
    mig_devices: List[dict]
    explained_mib: Optional[int]
    unexplained_mib: Optional[int]
    memory_unexplained: Optional[bool]
    holder_pids: List[int]
    device_user_pids: List[int]
    exited: List[dict]
    memory_supported: Optional[bool]
    unexplained_cause: Optional[str]


class DriverProcess(TypedDict):
    """One entry of a GPU's driver_processes: the driver's list entry (_nvml) and whether /proc confirms it."""

    pid: int
    used_mib: Optional[int]
    type: str
    gpu_instance_id: Optional[int]
    compute_instance_id: Optional[int]
    verified: bool


class Foreign(TypedDict):
    """A PID the driver lists that no process here confirms (foreign; exited, with reason "exited" or "reused")."""

    pid: int
    used_mib: Optional[int]
    type: str
    reason: str
    comm: Optional[str]


class MigDevice(TypedDict):
    """One MIG instance of a GPU: _nvml's MIG device, then its holders as for a GPU (_holders.merge)."""

    index: int
    uuid: str
    gpu_instance_id: Optional[int]
    compute_instance_id: Optional[int]
    name: Optional[str]
    profile: Optional[str]
    memory_total_mib: Optional[int]
    memory_used_mib: Optional[int]
    memory_free_mib: Optional[int]
    memory_source: Optional[str]
    listed_mib: Optional[int]
    foreign: List[dict]
    holder_pids: List[int]
    reserved_allowance_mib: int
    tolerance_mib: int
    unexplained_mib: Optional[int]
    memory_unexplained: Optional[bool]
    exited: List[dict]


class Driver(TypedDict):
    """The state of the NVIDIA driver library in a snapshot (_gpus.Inspector.snapshot)."""

    available: bool
    error: Optional[str]
    driver_version: Optional[str]
    nvml_version: Optional[str]
    cuda_driver_version: Optional[str]
    timed_out: bool


class Snapshot(TypedDict):
    """What a snapshot returns (gpu_facts' ansible_facts.nvidia; gpu_kill's before and after)."""

    gpus: List[Gpu]
    holders: List[SnapshotHolder]
    device_users: List[DeviceUser]
    unmapped_minors: List[int]
    index_source: Optional[str]
    scan: str
    driver: Driver
    scan_problems: List[str]


class BriefHolder(TypedDict):
    """A holder in a wait report (_release.brief), with its memory on that GPU."""

    pid: int
    comm: str
    state: str
    cmdline: str
    user: Optional[str]
    memory_mib: Optional[int]
    attribution: Optional[str]
    parent: Optional[dict]


class LeftAlone(BriefHolder):
    """A left-alone holder in a wait report, with why it was left alone, and whether its memory counts in the
    release decision (left alone by the protection rules rather than by the operator's choice: _release)."""

    reason: str
    counted: bool


class WaitGpu(TypedDict):
    """One selected GPU (or MIG instance) in a wait (_release.gpu_status). MIG instances add "mig_profile", a whole
    GPU in MIG mode that is not released "mig_in_use", a GPU that is not released after a wait "next_step"
    (_wait.conclude)."""

    index: Optional[int]
    uuid: Optional[str]
    mig_uuid: Optional[str]
    memory_used_mib: Optional[int]
    memory_reserved_mib: Optional[int]
    unexplained_mib: Optional[int]
    memory_unexplained: Optional[bool]
    holders: List[BriefHolder]
    left_alone: List[LeftAlone]
    left_alone_mib: int
    protected_mib: int
    foreign: List[dict]
    suspects: List[dict]
    memory_checked: bool
    error: Optional[str]
    reserved_allowance_mib: int
    memory_note: Optional[str]
    released: bool


def keys_of(shape):
    """The keys of a TypedDict shape, in order, inherited ones first."""
    return tuple(shape.__annotations__)


PROCESS_KEYS = keys_of(Process)
DEVICE_USER_KEYS = keys_of(DeviceUser)
HOLDER_KEYS = keys_of(Holder)
SNAPSHOT_HOLDER_KEYS = keys_of(SnapshotHolder)
# Added to holders and device users where the snapshot reads owners (_owners.owner_of; its keys: _owners.OWNER_KEYS).
OWNER = "owner"
GPU_TABLE_KEYS = keys_of(GpuTable)
GPU_KEYS = keys_of(Gpu)
DRIVER_PROCESS_KEYS = keys_of(DriverProcess)
FOREIGN_KEYS = keys_of(Foreign)
MIG_DEVICE_KEYS = keys_of(MigDevice)
DRIVER_KEYS = keys_of(Driver)
VIEW_KEYS = keys_of(Snapshot)
BRIEF_HOLDER_KEYS = keys_of(BriefHolder)
LEFT_ALONE_KEYS = keys_of(LeftAlone)
WAIT_GPU_KEYS = keys_of(WaitGpu)


def entry(keys, **values):
    """A dict with exactly `keys`: `values` where given, None for the others. Raises KeyError for a value of a
    key that is not in `keys` (a shape that drifted)."""
    unknown = set(values) - set(keys)
    if unknown:
        raise KeyError("not in the shape: %s" % ", ".join(sorted(unknown)))
    return {key: values.get(key) for key in keys}
