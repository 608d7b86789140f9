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

from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, TypedDict

# How a holder holds a GPU (docs/attribution.md): listed by the driver, or showing the context of an exited creator.
Attribution = Literal["driver", "device_file"]
# A process with device files open: "cuda" maps a GPU's device file, "nvml" maps none.
ProcessKind = Literal["cuda", "nvml"]
# Where a process was seen: a thread's open fd, a line of /proc/PID/maps, the driver's lists.
SeenIn = Literal["fd", "mapping", "driver"]
# The driver's process lists.
ListType = Literal["compute", "graphics", "mps"]
# The process-list versions that answered ("v3-32": the 32-byte _v3 entries of early R535 drivers).
ListVersion = Literal["v3", "v3-32", "v2", "v1"]
# Why a listed PID is not a holder here: its creator exited (its number free, or reused), or it is another
# namespace's (absent here, or another process here that does not hold the GPU).
ForeignReason = Literal["exited", "reused", "not_holding", "absent"]
# What memory that no listed entry explains is (_holders.unexplained_cause).
UnexplainedCause = Literal["leaked", "other_namespace_or_leaked", "unlisted"]
# Which processes a look scanned: all of /proc, or only the PIDs the driver lists.
Scope = Literal["full", "listed"]
# Where the index/minor table came from.
IndexSource = Literal["nvml", "proc_driver"]


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
    cmdline: Optional[str]
    start_time: Optional[str]


class DeviceUser(Process):
    """A process with NVIDIA device files open that holds no GPU's memory (_holders.merge)."""

    device_gpus: List[int]
    minors: List[int]
    kind: ProcessKind
    seen_in: List[SeenIn]
    thread_only: bool


class Holder(DeviceUser):
    """A process holding a GPU's memory (_holders.merge); memory_mib and attribution are keyed by GPU index."""

    gpus: List[int]
    memory_mib: Dict[str, Optional[int]]
    attribution: Dict[str, Attribution]
    control_only: bool
    mig: Dict[str, List[str]]
    contexts_of: Dict[str, List[int]]


class Parent(TypedDict):
    """A holder's parent process: its command line with its arguments joined by spaces ("" for a zombie)."""

    pid: int
    comm: str
    cmdline: str


class SnapshotHolder(Holder):
    """A holder in a snapshot, with its parent ({"pid", "comm", "cmdline"} or None)."""

    parent: Optional[Parent]


class GpuTable(TypedDict):
    """The index/minor table of a GPU (_gpus.minor_map)."""

    index: int
    minor: Optional[int]
    uuid: Optional[str]
    name: Optional[str]
    pci_bus_id: Optional[str]


class ListEntry(TypedDict):
    """One entry of the driver's process lists (_nvml): memory in MiB (None: not available), the list, the MIG ids
    (None when not MIG)."""

    pid: int
    used_mib: Optional[int]
    type: ListType
    gpu_instance_id: Optional[int]
    compute_instance_id: Optional[int]


class _MemoryFigures(TypedDict):
    total_mib: Optional[int]
    used_mib: Optional[int]
    free_mib: Optional[int]
    reserved_mib: Optional[int]
    source: Optional[str]
    used_includes_reserved: Optional[bool]
    used_excluding_reserved_mib: Optional[int]


class Memory(_MemoryFigures, total=False):
    """NVML's memory of a GPU (_nvml.read_gpu "memory"), in MiB; "supported" False where the driver reports none."""

    supported: bool


class MigMode(TypedDict):
    """Whether MIG is enabled now, and after the next reset."""

    current: bool
    pending: bool


class NvmlMigDevice(TypedDict):
    """A MIG device as NVML describes it (_nvml._mig_devices); memory in MiB."""

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


class NvmlGpu(GpuTable):
    """Everything NVML says about one GPU (_nvml.read_gpu)."""

    memory: Optional[Memory]
    processes: List[ListEntry]
    process_list_version: Optional[ListVersion]
    processes_error: Optional[str]
    mig_mode: Optional[MigMode]
    mig_devices: List[NvmlMigDevice]
    error: Optional[str]


class _ReadingBase(TypedDict):
    available: bool
    error: Optional[str]
    driver_version: Optional[str]
    nvml_version: Optional[str]
    cuda_driver_version: Optional[str]
    gpus: List[NvmlGpu]


class Reading(_ReadingBase, total=False):
    """One NVML reading (_nvml.read_driver); "timed_out" where the worker did not answer (_gpus.Inspector);
    "advice" where it was asked for (_nvml.read_advice, one per GPU)."""

    timed_out: bool
    advice: List[DriverAdvice]


# What a GPU needs (_recovery): a GPU reset, a reboot of the node, or another step (named in its reasons).
RecoveryNeed = Literal["reset", "reboot", "other"]
XidNeed = Literal["reset", "reboot"]


class RemappedRows(TypedDict):
    """nvmlDeviceGetRemappedRows of a GPU."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


class DriverAdvice(TypedDict):
    """What the driver says of a GPU beyond memory and processes (_nvml.read_advice); None where not answered."""

    index: int
    recovery_action: Optional[str]
    remapped_rows: Optional[RemappedRows]
    retired_pages_pending: Optional[bool]
    persistence_mode: Optional[bool]
    nvlink_peers: List[str]
    nvlink_switch: bool
    errors: List[str]


class Xid(TypedDict):
    """An Xid line of the kernel log (_kernel_log.xids)."""

    xid: int
    pci: str
    age_s: float
    text: str
    needs: Optional[XidNeed]
    why: Optional[str]


class Recovery(TypedDict):
    """A GPU's "recovery" in a snapshot taken with recovery=True (_recovery.recovery)."""

    action: Optional[str]
    remapped_rows: Optional[RemappedRows]
    retired_pages_pending: Optional[bool]
    persistence_mode: Optional[bool]
    reset_peers: List[int]
    nvlink_switch: bool
    xids: List[Xid]
    xid_error: Optional[str]
    needs: Optional[RecoveryNeed]
    why: List[str]
    errors: List[str]


class Gpu(GpuTable):
    """One GPU of the snapshot (_holders.merge)."""

    memory_total_mib: Optional[int]
    memory_used_mib: Optional[int]
    memory_free_mib: Optional[int]
    memory_reserved_mib: Optional[int]
    memory_source: Optional[str]
    error: Optional[str]
    driver_processes: List[DriverProcess]
    foreign: List[Foreign]
    suspects: List[int]
    tolerance_mib: int
    mig_mode: Optional[bool]
    process_list_version: Optional[str]
    processes_error: Optional[str]
    memory_used_includes_reserved: Optional[bool]
    memory_used_excluding_reserved_mib: Optional[int]
    reserved_allowance_mib: int
    mig_devices: List[MigDevice]
    explained_mib: Optional[int]
    unexplained_mib: Optional[int]
    memory_unexplained: Optional[bool]
    holder_pids: List[int]
    device_user_pids: List[int]
    exited: List[Foreign]
    memory_supported: Optional[bool]
    unexplained_cause: Optional[UnexplainedCause]
    context_groups: Optional[List[List[int]]]


class DriverProcess(ListEntry):
    """One entry of a GPU's driver_processes: the driver's list entry (_nvml) and whether /proc confirms it."""

    verified: bool


class Foreign(TypedDict):
    """A PID the driver lists that no process here confirms (foreign; exited, with reason "exited" or "reused")."""

    pid: int
    used_mib: Optional[int]
    type: ListType
    reason: ForeignReason
    comm: Optional[str]


class MigDevice(NvmlMigDevice):
    """One MIG instance of a GPU: _nvml's MIG device, then its holders as for a GPU (_holders.merge)."""

    listed_mib: Optional[int]
    foreign: List[Foreign]
    holder_pids: List[int]
    reserved_allowance_mib: int
    tolerance_mib: int
    unexplained_mib: Optional[int]
    memory_unexplained: Optional[bool]
    exited: List[Foreign]


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
    index_source: Optional[IndexSource]
    scan: Scope
    driver: Driver
    scan_problems: List[str]


class Merged(TypedDict):
    """What _holders.merge returns: the GPUs, their holders and device users; the snapshot adds the rest."""

    gpus: List[Gpu]
    holders: List[Holder]
    device_users: List[DeviceUser]
    unmapped_minors: List[int]


class BriefHolder(TypedDict):
    """A holder in a wait report (_release.brief), with its memory on that GPU."""

    pid: int
    comm: str
    state: str
    cmdline: str
    user: Optional[str]
    memory_mib: Optional[int]
    attribution: Optional[Attribution]
    parent: Optional[Parent]


class LeftAlone(BriefHolder):
    """A left-alone holder in a wait report, with why it was left alone, and whether its memory counts in the
    release decision (left alone by the protection rules rather than by the operator's choice: _release)."""

    reason: str
    counted: bool


class KeptContexts(TypedDict):
    """The contexts of exited creators on a GPU that holders left alone keep (_release.kept_contexts)."""

    creators: List[int]
    mib: int
    holders: List[int]
    shared: List[List[int]]
    unheld: int


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
    unexplained_cause: Optional[UnexplainedCause]
    holders: List[BriefHolder]
    left_alone: List[LeftAlone]
    left_alone_mib: int
    protected_mib: int
    foreign: List[Foreign]
    exited: List[Foreign]
    kept: Optional[KeptContexts]
    suspects: List[int]
    memory_checked: bool
    error: Optional[str]
    reserved_allowance_mib: int
    memory_note: Optional[str]
    released: bool


class MigInUse(TypedDict):
    """A MIG instance that keeps a whole GPU in MIG mode from being released (_release.gpu_status)."""

    uuid: Optional[str]
    profile: Optional[str]
    memory_used_mib: Optional[int]
    holder_pids: Optional[List[int]]


class WaitStatus(WaitGpu, total=False):
    """A WaitGpu with the keys only some entries have: "mig_profile" (a MIG instance), "mig_in_use" (a whole GPU in
    MIG mode, not released), "next_step" (not released after a wait: _wait.conclude)."""

    mig_profile: Optional[str]
    mig_in_use: List[MigInUse]
    next_step: str


class _WaitedBase(TypedDict):
    released: bool
    elapsed_s: float
    polls: int
    gpus: List[WaitStatus]
    driver: Driver


class Waited(_WaitedBase, total=False):
    """What _wait.wait_released returns, "snapshot" included (the last look); _wait.conclude adds "memory_checked" and
    "left_alone" (a left-alone holder per GPU it holds: LeftAlone plus "gpu"). gpu_wait returns the last look as
    "after" instead of "snapshot"."""

    snapshot: Snapshot
    memory_checked: bool
    left_alone: List[Dict[str, Any]]
    after: Snapshot
    advice: List[Dict[str, Any]]


def holds(holder: Mapping[str, Any], index: int, mig_uuid: Optional[str] = None) -> bool:
    """Whether a holder (a Holder, or one being built by _holders) holds GPU `index`; where `mig_uuid` is given, MIG
    instance `mig_uuid` of it. The one test of "holds GPU reference R" of _holders, _release and the vllm_server
    role's checks (plugins/plugin_utils/_vllm_checks.py)."""
    if mig_uuid is None:
        return index in (holder.get("gpus") or ())
    return mig_uuid in (holder.get("mig") or {}).get(str(index), ())


def keys_of(shape: type) -> Tuple[str, ...]:
    """The keys of a TypedDict shape, in order, inherited ones first."""
    return tuple(shape.__annotations__)


PROCESS_KEYS = keys_of(Process)
DEVICE_USER_KEYS = keys_of(DeviceUser)
HOLDER_KEYS = keys_of(Holder)
SNAPSHOT_HOLDER_KEYS = keys_of(SnapshotHolder)
# Added to holders and device users where the snapshot reads owners (_owners.owner_of; its keys: _owners.OWNER_KEYS).
OWNER = "owner"
# Added to each GPU where the snapshot reads the driver's advice (recovery=True; _recovery.recovery).
RECOVERY = "recovery"
GPU_TABLE_KEYS = keys_of(GpuTable)
GPU_KEYS = keys_of(Gpu)
RECOVERY_KEYS = keys_of(Recovery)
DRIVER_PROCESS_KEYS = keys_of(DriverProcess)
FOREIGN_KEYS = keys_of(Foreign)
MIG_DEVICE_KEYS = keys_of(MigDevice)
DRIVER_KEYS = keys_of(Driver)
VIEW_KEYS = keys_of(Snapshot)
BRIEF_HOLDER_KEYS = keys_of(BriefHolder)
LEFT_ALONE_KEYS = keys_of(LeftAlone)
WAIT_GPU_KEYS = keys_of(WaitGpu)


def entry(keys: Sequence[str], **values: Any) -> Dict[str, Any]:
    """A dict with exactly `keys`: `values` where given, None for the others. Raises KeyError for a value of a
    key that is not in `keys` (a shape that drifted)."""
    unknown = set(values) - set(keys)
    if unknown:
        raise KeyError("not in the shape: %s" % ", ".join(sorted(unknown)))
    return {key: values.get(key) for key in keys}
