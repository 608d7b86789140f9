# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Merging what the driver says (NVML) and what the kernel says (/proc) into holders.

Holding a GPU means holding its memory (docs/attribution.md). The driver lists a context under its
creator's PID until the last process holding its file closes it, also after the creator has exited,
and (535.113.01 and later) gives that PID in the caller's PID namespace, leaving out creators it has
no number for. A holder of GPU i is then either a process the driver lists on GPU i (compute,
graphics, MPS) that shows a context there (an rw-s mapping of GPU i's device file: what every real context shows
and NVML clients, nvidia-smi and CUDA-initialized processes never do), or a process that the lists leave out and that
shows a context on GPU i where GPU i carries
the context of a listed PID that has exited (or whose number another process now has): it holds
that context's handles. Every other process with NVIDIA device files open is a device user: NVML
clients and NCCL workers open every /dev/nvidiaN of the host with no context there. GPUs are matched
through the minor number -> NVML index map; minor == index is never assumed. `merge` is pure: the
snapshot (module_utils/gpu/_gpus.py) reads /proc and psutil.

On a MIG-enabled GPU every instance (MIG device) gets the same view: a listed process belongs to the instance
whose GPU/compute instance ids its list entry carries; a process the driver lists nowhere is tied to an instance
by the MIG capability files it holds (/dev/nvidia-caps/nvidia-capN of its GPU and compute instance, docs/mig.md).
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping
from typing import Optional, Sequence, Set, Tuple, TypeVar, cast

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _shapes

if TYPE_CHECKING:  # the scan's types only: merge stays pure, and a look that does not scan never imports _procscan
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._procscan import CapMap, DeviceHandles

# (GPU minor, GPU instance id, compute instance id or None for the GPU instance's own file): what a MIG capability
# file grants (mig_cap, _procscan.cap_map).
CapGrant = Tuple[int, int, Optional[int]]
# A GPU (or MIG device) of the view while merge builds it: a dict that ends with the keys of _shapes.Gpu
# (_shapes.MigDevice), plus working keys ("listed_unknown") that merge removes.
_Building = Dict[str, Any]
# What one merge shares (_context): the scan, the processes, what is held, how this driver numbers PIDs.
_Context = Dict[str, Any]
# A dict with MIG ids ("gpu_instance_id", "compute_instance_id"): a MIG device, built or read from NVML.
_Instance = TypeVar("_Instance", bound=Mapping[str, Any])

# NVML memory info v1 `used` includes the reserved memory since driver R510 (the release that added
# nvmlDeviceGetMemoryInfo_v2 to report it apart: wookayin/gpustat#141, rust-nvml/nvml-wrapper#57), and v1 cannot
# tell it apart. Where only v1 is there (v2 missing or answering FUNCTION_NOT_FOUND, NVIDIA/nvidia-settings#78), the
# tolerance grows by this share of the memory, by no more than V1_RESERVED_MAX_MIB (1 GiB), just above what real
# GPUs were seen to reserve idle: 615 MiB on an H200 (measured on an H200, driver 580.159.04, 2026-12-04: v1 used =
# v2 used + reserved), 912 MB (870 MiB) on an A100 (nvml-wrapper#57), "a few hundred MB to ~1 GB" on
# H20/B200/B300 (scitix/sichek#113). The share alone grew with the GPU (4077 MiB on an 80 GB GPU) and hid a leaked
# context of 3.5 GiB.
V1_RESERVED_SHARE = 0.05
V1_RESERVED_MAX_MIB = 1024
_RESERVED_IN_V1_SINCE = 510

# /proc/driver/nvidia-caps/mig-minors numbers the MIG capability device files the same way on every host (MIG user
# guide, "Device Nodes and Capabilities"): config 1, monitor 2, then per GPU minor m, 15 GPU instances G of one
# access file and 8 compute instances C each: gpu<m>/gi<G>/access = 3 + 135m + 9G, gpu<m>/gi<G>/ci<C>/access
# = that + 1 + C (the guide's table ends with gpu31/gi14/ci7/access 4322).
_CAP_FIRST = 3
# Drivers from 535.113.01 report each PID in the caller's PID namespace and leave out clients whose creator has no
# number there (open-gpu-kernel-modules gpu_rmapi.c _gpuConvertPid -> os-interface.c os_find_ns_pid -> pid_vnr);
# earlier drivers report the initial namespace's number to every caller.
_TRANSLATING_SINCE = (535, 113, 1)
_CAPS_PER_GPU = 135
_CAPS_PER_GI = 9
# States of a process that has ended (/proc/PID/stat): a zombie keeps its number until its parent reaps it.
_ENDED = ("Z", "X")


def mig_cap(cap_minor: int) -> Optional[CapGrant]:
    """(GPU minor, GPU instance id, compute instance id or None for the GPU instance's own file) that
    /dev/nvidia-caps/nvidia-cap<cap_minor> grants, by the driver's fixed numbering; None for config, monitor
    or a number outside it."""
    if cap_minor < _CAP_FIRST:
        return None
    gpu_minor, rest = divmod(cap_minor - _CAP_FIRST, _CAPS_PER_GPU)
    gi, slot = divmod(rest, _CAPS_PER_GI)
    return (gpu_minor, gi, None if slot == 0 else slot - 1)


def translates_pids(driver: Optional[Mapping[str, Any]]) -> Optional[bool]:
    """True when the driver gives PIDs in the caller's PID namespace (535.113.01+); None when the version is unknown."""
    version = str((driver or {}).get("driver_version") or "")
    parts = version.split(".")
    if not version or not all(part.isdigit() for part in parts):
        return None
    numbers = tuple(int(part) for part in parts) + (0, 0)
    return numbers[:3] >= _TRANSLATING_SINCE


def numbers_foreign(driver: Optional[Mapping[str, Any]], initial_pidns: bool) -> bool:
    """True when the driver's PIDs are another namespace's numbers: a driver before 535.113.01 gives the initial
    namespace's number to every caller, so seen from a nested PID namespace (a container) a listed number names
    nothing here for sure. Then every process here that shows a context on a GPU holds it (_needs_holders)."""
    return translates_pids(driver) is False and not initial_pidns


def unexplained_cause(translating: Optional[bool], initial_pidns: bool) -> _shapes.UnexplainedCause:
    """What memory that no listed entry explains is, on this driver and in this PID namespace:
    "leaked" (a translating driver seen from the initial PID namespace: every creator has a number here),
    "other_namespace_or_leaked" (a translating driver seen from another namespace: a creator outside it is left out
    of the lists, or nobody), "unlisted" (older drivers list every client, so memory outside the lists is leaked too;
    kept as the device-file rule of docs/attribution.md, rule 5)."""
    if translating:
        return "leaked" if initial_pidns else "other_namespace_or_leaked"
    return "unlisted"


def _memory_unexplained(
    used: Optional[int], listed: int, listed_unknown: bool, tolerance_mib: int
) -> Tuple[Optional[int], bool]:
    """(unexplained MiB or None, whether it counts) for one GPU.

    Unknown used memory (no driver, a lost GPU) counts: nothing explains it, so the processes that show a context
    on the GPU are its holders. A list entry without a figure
    (NVML_VALUE_NOT_AVAILABLE) explains the GPU's memory as far as can be told: it does not count.
    """
    if used is None:
        return None, True
    if listed_unknown:
        return None, False
    unexplained = max(0, used - listed)
    return unexplained, unexplained > tolerance_mib


def _file_indices(handles: DeviceHandles, by_minor: Mapping[int, int], unmapped: Set[int]) -> Set[int]:
    indices = set()
    for minor in handles.minors:
        if minor in by_minor:
            indices.add(by_minor[minor])
        else:
            unmapped.add(minor)
    return indices


def _context_indices(handles: DeviceHandles, by_minor: Mapping[int, int], zero_fb: Set[int]) -> Set[int]:
    """The GPUs (indices) on which a process shows a context: an `rw-s` mapping of the GPU's /dev/nvidiaN, or on a
    zero-framebuffer GPU (index in `zero_fb`) an `rw-s` nvidiactl mapping beside a mapping of its file
    (DeviceHandles.context_on). NVML clients, nvidia-smi and CUDA-initialized processes never show it."""
    return {index for minor, index in by_minor.items() if handles.context_on(minor, index in zero_fb)}


def listed_once(items: Iterable[_shapes.ListEntry]) -> Tuple[Dict[int, Optional[int]], bool]:
    """({pid: MiB, or None where no entry has a figure}, whether some entry has no figure) of process-list entries: a
    PID's memory is taken once, however many lists name it (an MPS client is in the compute list and the MPS list
    with the same memory: measured on an H200, driver 580.159.04). Entries of one list add up (a process in two
    MIG instances of a GPU); the lists' totals do not (the largest is taken)."""
    per_list: Dict[int, Dict[str, Optional[int]]] = {}
    unknown = False
    for item in items:
        figure = item["used_mib"]
        unknown = unknown or figure is None
        lists = per_list.setdefault(item["pid"], {})
        previous = lists.get(item["type"])
        lists[item["type"]] = figure if previous is None else previous + (figure or 0)
    memory: Dict[int, Optional[int]] = {}
    for pid, lists in per_list.items():
        figures = [mib for mib in lists.values() if mib is not None]
        memory[pid] = max(figures) if figures else None
    return memory, unknown


def _listed_mib(items: Iterable[_shapes.ListEntry]) -> Tuple[int, bool]:
    """(MiB the entries charge, each PID once; whether some entry has no figure)."""
    memory, unknown = listed_once(items)
    return sum(mib for mib in memory.values() if mib is not None), unknown


def _reserved_in_used(memory: Mapping[str, Any], driver: Optional[Mapping[str, Any]]) -> bool:
    """True when `memory` (an _nvml memory dict, or a MIG device's) comes from NVML memory info v1 of a driver whose
    v1 `used` includes reserved memory (R510 and later, or an unknown version)."""
    if (
        memory.get("used_includes_reserved") is False
        or memory.get("source", memory.get("memory_source")) != "nvmlDeviceGetMemoryInfo"
    ):
        return False
    major = str((driver or {}).get("driver_version") or "").split(".", 1)[0]
    return not (major.isdigit() and int(major) < _RESERVED_IN_V1_SINCE)


def reserved_allowance(total_mib: Optional[int], memory: Mapping[str, Any], driver: Optional[Mapping[str, Any]]) -> int:
    """MiB added to the tolerance where used memory includes reserved memory (v1), else 0: 5% of the memory, at most
    V1_RESERVED_MAX_MIB."""
    if total_mib is None or not _reserved_in_used(memory, driver):
        return 0
    return min(int(total_mib * V1_RESERVED_SHARE), V1_RESERVED_MAX_MIB)


def lists_explain(nvml_gpu: _shapes.NvmlGpu, driver: Optional[Mapping[str, Any]], tolerance_mib: int) -> bool:
    """True when the driver's lists explain a GPU's used memory, and each of its MIG instances', within the tolerance
    (plus the v1 reserved allowance), as merge judges it: then no process the lists leave out can be a holder there,
    and a look needs only the listed PIDs' fds (_gpus.Inspector.snapshot, scope "listed"). Stricter than merge in one
    case: an entry without a figure (NVML_VALUE_NOT_AVAILABLE) is not taken as explaining anything here, so such a
    GPU is always looked at with a full scan."""
    memory: Mapping[str, Any] = nvml_gpu.get("memory") or {}
    items = nvml_gpu.get("processes", [])
    if memory.get("supported") is False and not nvml_gpu.get("error"):
        # No memory figures (a unified-memory GPU): the lists are all there is; the snapshot rescans in full where a
        # listed PID shows no context here.
        return True
    if nvml_gpu.get("error") or memory.get("used_mib") is None or any(item["used_mib"] is None for item in items):
        return False
    parts: List[Tuple[Mapping[str, Any], List[_shapes.ListEntry]]] = [(memory, items)] + [
        (device, [item for item in items if _instance_of(item, [device]) is device])
        for device in nvml_gpu.get("mig_devices") or ()
    ]
    for part, listed in parts:
        total = part.get("total_mib", part.get("memory_total_mib"))
        used = part.get("used_mib", part.get("memory_used_mib"))
        tolerance = tolerance_mib + reserved_allowance(total, part, driver)
        if _memory_unexplained(used, _listed_mib(listed)[0], False, tolerance)[1]:
            return False
    return True


def _instances_held(
    cap_minors: Iterable[int],
    gpu_minor: Optional[int],
    instances: Sequence[_Building],
    lookup: Callable[[int], Optional[CapGrant]],
) -> List[_Building]:
    """The MIG devices of GPU minor `gpu_minor` (`instances`: mig_devices entries) whose capability files a process
    holds (`cap_minors`): those whose compute instance file it holds, or, for a GPU instance file alone, every
    compute instance of that GPU instance."""
    gis: Set[int] = set()
    cis: Set[Tuple[int, int]] = set()
    for cap in cap_minors:
        granted = lookup(cap)
        if granted is None or granted[0] != gpu_minor:
            continue
        if granted[2] is None:
            gis.add(granted[1])
        else:
            cis.add((granted[1], granted[2]))
    ci_gis = {gi for gi, _ci in cis}
    return [
        d
        for d in instances
        if (d["gpu_instance_id"], d["compute_instance_id"]) in cis
        or (d["gpu_instance_id"] in gis and d["gpu_instance_id"] not in ci_gis)
    ]


def _instance_of(item: Mapping[str, Any], instances: Iterable[_Instance]) -> Optional[_Instance]:
    """The MIG device whose ids a process-list entry carries, or None (no ids: not MIG, or a v1 list)."""
    for device in instances:
        if (
            item.get("gpu_instance_id") is not None
            and item.get("gpu_instance_id") == device["gpu_instance_id"]
            and item.get("compute_instance_id") == device["compute_instance_id"]
        ):
            return device
    return None


def merge(
    driver: Optional[_shapes.Reading],
    table: Sequence[_shapes.GpuTable],
    scan: Mapping[int, DeviceHandles],
    processes: Mapping[int, _shapes.Process],
    tolerance_mib: int = 256,
    exclude_pids: Iterable[int] = (),
    caps: Optional[CapMap] = None,
    initial_pidns: bool = False,
) -> _shapes.Merged:
    """Build the per-GPU view, the holders and the device users from one NVML reading and one /proc scan.

    Args:
        driver: read_driver() dict, or None when NVML could not be asked.
        table: minor_map()'s GPU list (dicts with _shapes.GPU_TABLE_KEYS).
        scan: {pid: DeviceHandles} from _procscan (a full scan, or the listed PIDs only).
        processes: {pid: process_details() dict} for the scanned and listed PIDs that exist here.
        tolerance_mib: used memory the driver's lists may leave unexplained before device-file
            users become holders (the idle floor that max_used_mib allows; docs/attribution.md); plus
            reserved_allowance() where used memory includes reserved memory (NVML memory info v1).
        exclude_pids: PIDs that are ours (this module, its NVML worker).
        caps: _procscan.cap_map() ({cap minor: (GPU minor, GPU instance id, compute instance id or None)}), or None
            for the driver's fixed numbering (mig_cap).
        initial_pidns: /proc is the initial PID namespace's (_gpus.initial_pid_namespace).

    Returns a dict (the keys of each shape are in _shapes; gpu_facts' RETURN says what each means):
      gpus: [dicts with _shapes.GPU_KEYS]: "driver_processes" ([_shapes.DRIVER_PROCESS_KEYS]), "explained_mib" (what
            the lists say), "unexplained_mib" (used minus listed, None when unknown), "memory_unexplained" (beyond
            tolerance_mib, or unknown), "foreign" ([_shapes.FOREIGN_KEYS]: listed PIDs maybe another namespace's),
            "exited" (the same shape, reason "exited"/"reused": creators gone, their contexts held by device-file
            holders), "memory_supported", "unexplained_cause" (see unexplained_cause), "suspects" (processes
            with the device file open where a holder is looked for and none shows a context), "mig_devices" ([_shapes.MIG_DEVICE_KEYS]).
      holders: [dicts with _shapes.HOLDER_KEYS]: process details plus "gpus" (indices held), "memory_mib"
               ({"<index>": MiB or None}), "attribution" ({"<index>": "driver" or "device_file"}), "mig"
               ({"<index>": [MIG UUIDs]}), "control_only" (listed while holding no device file: an MPS client).
      device_users: [dicts with _shapes.DEVICE_USER_KEYS].
      unmapped_minors: minors held by some process that no known GPU has.
    """
    exclude = set(exclude_pids)
    by_minor = {cast(int, gpu.get("minor")): gpu["index"] for gpu in table if gpu.get("minor") is not None}
    nvml_gpus: Dict[int, Mapping[str, Any]] = {gpu["index"]: gpu for gpu in (driver.get("gpus", []) if driver else [])}
    unmapped: Set[int] = set()
    files = {pid: _file_indices(handles, by_minor, unmapped) for pid, handles in scan.items() if pid not in exclude}
    zero_fb = {i for i, gpu in nvml_gpus.items() if (gpu.get("memory") or {}).get("supported") is False}
    held = _Held()
    context = _context(driver, initial_pidns, scan=scan, files=files, processes=processes, exclude=exclude, held=held)
    context["contexts"] = {pid: _context_indices(scan[pid], by_minor, zero_fb) for pid in files}
    gpus = [_listed_gpu(entry, nvml_gpus.get(entry["index"], {}), driver, tolerance_mib, context) for entry in table]
    lookup: Callable[[int], Optional[CapGrant]] = mig_cap if caps is None else caps.get
    _unlisted_holders(gpus, set(held.pids), lookup, context)
    if not table:
        # No index map at all (no NVML, no /proc/driver/nvidia): processes that show a context hold "a GPU".
        for pid in sorted(files):
            if scan[pid].contexts and pid in processes:
                held.entry(pid)
    return _merged(gpus, context, unmapped)


def _listed_gpu(
    entry: _shapes.GpuTable,
    nvml_gpu: Mapping[str, Any],
    driver: Optional[Mapping[str, Any]],
    tolerance_mib: int,
    context: _Context,
) -> _Building:
    """A GPU of the view with what the driver's lists say: its listed holders, exited creators and foreign PIDs, and
    its explained and unexplained memory. The device-file holders come after (_device_file_holders)."""
    gpu = _gpu_entry(entry, nvml_gpu, driver, tolerance_mib)
    listed, listed_unknown = _read_lists(gpu, nvml_gpu, context)
    _judge_memory(gpu, listed, listed_unknown, tolerance_mib, driver, context["cause"])
    return gpu


def _merged(gpus: List[_Building], context: _Context, unmapped: Set[int]) -> _shapes.Merged:
    """merge's result, once every GPU is judged and every holder found."""
    holders, users = _processes(context)
    _name_pids(gpus, holders, users)
    return {
        "gpus": cast(List[_shapes.Gpu], gpus),
        "holders": cast(List[_shapes.Holder], holders),
        "device_users": cast(List[_shapes.DeviceUser], users),
        "unmapped_minors": sorted(unmapped),
    }


def _name_pids(gpus: List[_Building], holders: List[_Building], users: List[_Building]) -> None:
    """Give each GPU and each of its MIG devices the PIDs of its holders ("holder_pids"), and each GPU the PIDs of its
    device users ("device_user_pids")."""
    for gpu in gpus:
        gpu["holder_pids"] = [h["pid"] for h in holders if _shapes.holds(h, gpu["index"])]
        gpu["device_user_pids"] = [u["pid"] for u in users if gpu["index"] in u["device_gpus"]]
        for instance in gpu["mig_devices"]:
            instance["holder_pids"] = [h["pid"] for h in holders if _shapes.holds(h, gpu["index"], instance["uuid"])]


def _context(driver: Optional[Mapping[str, Any]], initial_pidns: bool, **parts: Any) -> _Context:
    """What one merge shares: `parts` plus how this driver numbers PIDs here."""
    translating = translates_pids(driver)
    # A listed PID absent here is an exited creator where the driver numbers PIDs in this namespace, or where this is
    # the initial namespace (older drivers number every PID there).
    parts.update(
        creators_here=bool(translating) or initial_pidns,
        numbers_foreign=numbers_foreign(driver, initial_pidns),
        cause=unexplained_cause(translating, initial_pidns),
    )
    return parts


class _Held:
    """What each holder holds: {pid: {"memory": {index: MiB or None}, "attribution": {index: how}, "mig": {index: {uuid}}}}."""

    def __init__(self) -> None:
        self.pids: Dict[int, Dict[str, Dict[int, Any]]] = {}

    def entry(self, pid: int) -> Dict[str, Dict[int, Any]]:
        return self.pids.setdefault(pid, {"memory": {}, "attribution": {}, "mig": {}, "contexts_of": {}})

    def hold(
        self,
        pid: int,
        index: int,
        mib: Optional[int],
        how: _shapes.Attribution,
        instances: Iterable[_Building] = (),
        contexts_of: Iterable[int] = (),
    ) -> None:
        """PID holds GPU `index` with `mib` MiB there (its memory, taken once: listed_once; None: not reported),
        attributed `how`, in MIG `instances`; `contexts_of`: the exited creators whose contexts it holds there."""
        entry = self.entry(pid)
        if contexts_of:
            entry["contexts_of"].setdefault(index, set()).update(contexts_of)
        previous = entry["memory"].get(index)
        entry["memory"][index] = mib if previous is None else max(previous, mib or 0)
        entry["attribution"].setdefault(index, how)
        for device in instances:
            entry["mig"].setdefault(index, set()).add(device["uuid"])


def _gpu_entry(
    entry: _shapes.GpuTable, nvml_gpu: Mapping[str, Any], driver: Optional[Mapping[str, Any]], tolerance_mib: int
) -> _Building:
    """A GPU of the view from its table entry and its NVML reading, before the lists are read."""
    memory: Mapping[str, Any] = nvml_gpu.get("memory") or {}
    gpu: _Building = dict(entry)
    gpu.update(
        {
            "memory_total_mib": memory.get("total_mib"),
            "memory_used_mib": memory.get("used_mib"),
            "memory_free_mib": memory.get("free_mib"),
            "memory_reserved_mib": memory.get("reserved_mib"),
            "memory_source": memory.get("source"),
            "error": nvml_gpu.get("error"),
            "driver_processes": [],
            "foreign": [],
            "exited": [],
            "suspects": [],
            "tolerance_mib": tolerance_mib,
            "memory_supported": None if not memory else memory.get("supported", True),
            "mig_mode": nvml_gpu.get("mig_mode"),
            "process_list_version": nvml_gpu.get("process_list_version"),
            "processes_error": nvml_gpu.get("processes_error"),
            "memory_used_includes_reserved": _reserved_in_used(memory, driver) if memory else None,
            "memory_used_excluding_reserved_mib": memory.get("used_excluding_reserved_mib"),
            "reserved_allowance_mib": reserved_allowance(memory.get("total_mib"), memory, driver),
            "mig_devices": [
                dict(device, listed_mib=0, listed_unknown=False, foreign=[], exited=[], holder_pids=[])
                for device in nvml_gpu.get("mig_devices") or ()
            ],
        }
    )
    return gpu


def _read_lists(gpu: _Building, nvml_gpu: Mapping[str, Any], context: _Context) -> Tuple[int, bool]:
    """The driver's process lists of one GPU: a listed PID whose process shows a context here holds it; the others
    are exited creators (their number free, or reused) or foreign. Each PID once, however many lists name it.
    Returns (MiB listed, whether some entry has no figure)."""
    index, processes, exclude = gpu["index"], context["processes"], context["exclude"]
    items = nvml_gpu.get("processes", [])
    memory, _unknown = listed_once(items)
    for instance in gpu["mig_devices"]:
        instance["listed_mib"], instance["listed_unknown"] = _listed_mib(
            [item for item in items if _instance_of(item, [instance]) is instance]
        )
    seen: Set[int] = set()
    for item in items:
        pid = item["pid"]
        # A context shows as an rw-s mapping of this GPU's device file. An NVML client, nvidia-smi or a process that
        # only initialized CUDA with a listed number shows none: the number is reused, the process never a holder.
        verified = index in context["contexts"].get(pid, ()) and pid in processes and pid not in exclude
        gpu["driver_processes"].append(dict(item, verified=verified))
        instance = _instance_of(item, gpu["mig_devices"])
        if verified:
            context["held"].hold(pid, index, memory[pid], "driver", [instance] if instance else ())
        if verified or pid in seen or pid in exclude:
            continue
        seen.add(pid)
        present = processes.get(pid)
        reason: _shapes.ForeignReason
        if context["creators_here"]:
            # The creator has exited (its number is free here, or it is a zombie not yet reaped: the creator itself) or
            # another process has its number now: the context lives on in whoever shows it.
            reused = present is not None and present["state"] not in _ENDED
            key, reason = "exited", "reused" if reused else "exited"
        else:
            key, reason = "foreign", "not_holding" if present else "absent"
        foreign: _shapes.Foreign = {
            "pid": pid,
            "used_mib": memory[pid],
            "type": item["type"],
            "reason": reason,
            "comm": present["comm"] if present else None,
        }
        gpu[key].append(foreign)
        if instance is not None:
            instance[key].append(foreign)
    return _listed_mib(items)


def _judge_memory(
    gpu: _Building,
    listed: int,
    listed_unknown: bool,
    tolerance_mib: int,
    driver: Optional[Mapping[str, Any]],
    cause: Optional[_shapes.UnexplainedCause] = None,
) -> None:
    """Explained and unexplained memory of a GPU and of each of its MIG instances, against the tolerance."""
    gpu["explained_mib"] = listed
    gpu["tolerance_mib"] = tolerance_mib + gpu["reserved_allowance_mib"]
    if gpu["memory_supported"] is False and not gpu["error"]:
        # NVML reports no memory for this GPU (unified memory, a GB10): the lists and device files decide. Its used
        # memory is what the lists charge (memory_source "process_lists"), so a wait releases it once they are empty.
        gpu["memory_used_mib"], gpu["memory_source"] = listed, "process_lists"
        gpu["unexplained_mib"], gpu["memory_unexplained"] = 0, False
    else:
        gpu["unexplained_mib"], gpu["memory_unexplained"] = _memory_unexplained(
            gpu["memory_used_mib"], listed, listed_unknown, gpu["tolerance_mib"]
        )
    gpu["unexplained_cause"] = cause if gpu["memory_unexplained"] and gpu["memory_used_mib"] is not None else None
    for instance in gpu["mig_devices"]:
        instance["reserved_allowance_mib"] = reserved_allowance(instance.get("memory_total_mib"), instance, driver)
        instance["tolerance_mib"] = tolerance_mib + instance["reserved_allowance_mib"]
        instance["unexplained_mib"], instance["memory_unexplained"] = _memory_unexplained(
            instance.get("memory_used_mib"),
            instance["listed_mib"],
            instance.pop("listed_unknown"),
            instance["tolerance_mib"],
        )


def _needs_holders(part: _Building, context: _Context, unknown: bool) -> bool:
    """Whether the unlisted processes that show a context on a GPU (or MIG instance) hold it: it carries the context
    of an exited creator, or memory outside the lists that this namespace's processes may hold (memory unknown;
    drivers before 535.113.01), or the lists' numbers are another namespace's (numbers_foreign: the list cannot name
    them, so a context shown here is all there is). On a translating driver memory outside the lists is another
    namespace's or leaked: never theirs."""
    if part.get("exited") or context["numbers_foreign"]:
        return True
    if not part.get("memory_unexplained"):
        return False
    return unknown or context["cause"] == "unlisted"


# A device-file holder found on a GPU: (PID, the MIG devices it holds there, the exited creators whose contexts it holds).
_Found = Tuple[int, Sequence[_Building], List[int]]


def _device_file_holders(
    gpu: _Building, listed_here: Set[int], lookup: Callable[[int], Optional[CapGrant]], context: _Context
) -> None:
    """Where a GPU (or one of its MIG instances) carries the context of an exited creator, or memory that its
    processes may hold (_needs_holders), the processes the driver lists nowhere that show a context on it (an rw-s
    mapping of its device file) hold it. With none, the other processes with its device file open are its suspects:
    named, never signalled."""
    instances = gpu["mig_devices"]
    unknown = gpu["memory_used_mib"] is None and gpu["memory_supported"] is not False
    whole = _needs_holders(gpu, context, unknown)
    wanted = {d["uuid"] for d in instances if _needs_holders(d, context, d.get("memory_used_mib") is None)}
    if not whole and not wanted:
        return
    index, files, contexts = gpu["index"], context["files"], context["contexts"]
    candidates = [
        pid for pid in sorted(files) if index in files[pid] and pid not in listed_here and pid in context["processes"]
    ]
    found: List[_Found] = []
    for pid in candidates:
        if index not in contexts[pid]:
            continue
        # On a MIG GPU, a process holding capability files of instances is judged by those instances' memory.
        mine = _instances_held(context["scan"][pid].caps, gpu["minor"], instances, lookup) if instances else []
        if mine:
            mine = [d for d in mine if d["uuid"] in wanted]
            if mine:
                found.append((pid, mine, sorted({item["pid"] for d in mine for item in d["exited"]})))
        elif whole:
            found.append((pid, (), sorted({item["pid"] for item in gpu["exited"]})))
    for pid, held_mig, creators in found:
        context["held"].hold(pid, index, _inherited_mib(gpu, found), "device_file", held_mig, creators)
    if not found and whole:
        gpu["suspects"] = candidates


def _unlisted_holders(
    gpus: List[_Building], listed_here: Set[int], lookup: Callable[[int], Optional[CapGrant]], context: _Context
) -> None:
    """The holders the lists leave out, on every GPU: first those of exited creators' contexts (_device_file_holders),
    then those of a dead creator's context listed under a number another process has now (_shared_numbers). Where
    several listed numbers could be that one (_sharer_candidates), the evidence of every GPU narrows them: a forked
    child holds its creator's contexts, listed under the creator's one number on every GPU. So the numbers of the
    exited creators whose contexts it holds on another GPU, else the numbers it could share on every GPU where it
    could share one, else all of them."""
    for gpu in gpus:
        _device_file_holders(gpu, listed_here, lookup, context)
    known = {pid: set().union(*entry["contexts_of"].values()) for pid, entry in context["held"].pids.items()}
    found = {gpu["index"]: _sharer_candidates(gpu, listed_here, lookup, context) for gpu in gpus}
    everywhere: Dict[int, Set[int]] = {}
    for candidates in found.values():
        for pid, _mine, sharers in candidates:
            everywhere[pid] = everywhere[pid].intersection(sharers) if pid in everywhere else set(sharers)
    for gpu in gpus:
        narrowed = [
            (pid, mine, sorted(known.get(pid, set()).intersection(sharers) or everywhere[pid] or sharers))
            for pid, mine, sharers in found[gpu["index"]]
        ]
        _shared_numbers(gpu, narrowed, context)


def _sharer_candidates(
    gpu: _Building, listed_here: Set[int], lookup: Callable[[int], Optional[CapGrant]], context: _Context
) -> List[_Found]:
    """The processes the lists leave out that show a context on the GPU that cannot be theirs, each with the listed
    numbers that may be its dead creator's (PID, the MIG devices it holds there, those numbers).

    A listed holder P may share its number with a dead creator where a process the lists leave out shows a context
    here (on P's MIG instance, by its capability files) that cannot be P's: it started before P or in the same clock
    tick (no child inherits a context made after it started) and descends from no listed holder of the GPU (a forked
    child of a live creator holds that creator's). Where the lists name an exited creator there already, such a
    process may hold that creator's context: no evidence then."""
    if not context["creators_here"]:
        return []
    processes, instances = context["processes"], gpu["mig_devices"]
    entries = [item for item in gpu["driver_processes"] if item["verified"]]
    owners = {item["pid"] for item in entries}
    found: List[_Found] = []
    for pid in _unlisted_contexts(gpu, listed_here, context):
        mine = _instances_held(context["scan"][pid].caps, gpu["minor"], instances, lookup) if instances else []
        parts = mine or ([] if instances else [gpu])
        if not parts or any(part["exited"] for part in parts) or _descends_from(pid, owners, processes):
            continue
        there = {item["pid"] for item in entries if not instances or _instance_of(item, mine) is not None}
        sharers = sorted(p for p in there if processes[p]["start_ticks"] >= processes[pid]["start_ticks"])
        if sharers:
            found.append((pid, mine, sharers))
    return found


def _shared_numbers(gpu: _Building, found: List[_Found], context: _Context) -> None:
    """Two driver clients under one number: the context of a creator that has exited, and the context of the process
    that got its number. The driver lists that number once with the memory of both (open-gpu-kernel-modules
    gpu_rmapi.c: gpuGetProcWithObject_IMPL skips a client whose number is listed already,
    gpuFindClientInfoWithPidIterator_IMPL adds up the memory of every client with it), or in one list twice (a MIG
    instance keeps an entry per context).

    A listed holder P shares its number so where it is listed twice in one list (on one MIG instance), or where a
    process of `found` (_sharer_candidates, narrowed by _unlisted_holders) may hold the dead creator's context listed
    under P. Such a process holds that context (`contexts_of` P, its memory not known). The GPU's `exited` (and the
    instance's) gets P (reason "reused", the memory listed under P: the two contexts together), and P's own memory is
    not known."""
    if not context["creators_here"]:
        return
    index, processes, held, instances = gpu["index"], context["processes"], context["held"], gpu["mig_devices"]
    entries = [item for item in gpu["driver_processes"] if item["verified"]]
    counts = collections.Counter(
        (item["pid"], item["type"], item.get("gpu_instance_id"), item.get("compute_instance_id")) for item in entries
    )
    shared = {key[0] for key, count in counts.items() if count > 1}
    for pid, mine, sharers in found:
        held.hold(pid, index, None, "device_file", mine, sharers)
        held.pids[pid]["memory"][index] = None  # a share of the memory listed under another number
        shared.update(sharers)
    memory, _unknown = listed_once(entries)
    for pid in sorted(shared):
        item = next(item for item in entries if item["pid"] == pid)
        reused: _shapes.Foreign = {
            "pid": pid,
            "used_mib": memory[pid],
            "type": item["type"],
            "reason": "reused",
            "comm": processes[pid]["comm"],
        }
        gpu["exited"].append(reused)
        listing = [_instance_of(e, instances) for e in entries if e["pid"] == pid]
        for instance in {d["uuid"]: d for d in listing if d is not None}.values():
            instance["exited"].append(dict(reused))
        held.pids[pid]["memory"][index] = None


def _unlisted_contexts(gpu: _Building, listed_here: Set[int], context: _Context) -> List[int]:
    """The processes here that the driver lists nowhere and that show a context on the GPU, by PID."""
    index, files, contexts = gpu["index"], context["files"], context["contexts"]
    return [
        pid
        for pid in sorted(files)
        if index in contexts[pid] and pid not in listed_here and pid in context["processes"]
    ]


# How many parents _descends_from follows at most (a loop in a torn /proc read must end).
_MAX_ANCESTORS = 64


def _descends_from(pid: int, ancestors: Set[int], processes: Mapping[int, _shapes.Process]) -> bool:
    """True when one of `ancestors` is the parent of `pid`, or of its parent, and so on, as far as the processes known
    to the merge go (a process with a context, or listed)."""
    for _hop in range(_MAX_ANCESTORS):
        process = processes.get(pid)
        if process is None:
            return False
        pid = process["ppid"]
        if pid in ancestors:
            return True
    return False


def _inherited_mib(gpu: _Building, found: List[_Found]) -> Optional[int]:
    """The memory a device-file holder is charged: the exited creators' listed memory when it alone holds their
    contexts on the whole GPU (a reused or exited creator's memory goes to whoever shows the context), else None
    (several share it, or it is memory outside the lists)."""
    if len(found) != 1 or found[0][1] or not gpu["exited"]:
        return None
    figures = [item["used_mib"] for item in gpu["exited"]]
    return None if None in figures else sum(figures)


def _processes(context: _Context) -> Tuple[List[_Building], List[_Building]]:
    """(holders, device users): the details of every process with device files or held memory."""
    scan, files, processes, held = context["scan"], context["files"], context["processes"], context["held"].pids
    holders: List[_Building] = []
    users: List[_Building] = []
    for pid in sorted(set(files) | set(held)):
        if pid not in processes:
            continue
        handles = scan.get(pid)
        details: _Building = dict(processes[pid])
        details.update(
            {
                "device_gpus": sorted(files.get(pid, ())),
                "minors": sorted(handles.minors) if handles else [],
                "kind": "cuda" if handles is not None and handles.cuda else "nvml",
                "seen_in": sorted(handles.seen_in) if handles else [],
                "thread_only": bool(handles and handles.thread_only),
            }
        )
        if pid not in held:
            users.append(details)
            continue
        memory = held[pid]["memory"]
        details.update(
            {
                "gpus": sorted(memory),
                "memory_mib": {str(i): memory[i] for i in sorted(memory)},
                "attribution": {str(i): how for i, how in sorted(held[pid]["attribution"].items())},
                "control_only": not files.get(pid),
                "mig": {str(i): sorted(uuids) for i, uuids in sorted(held[pid]["mig"].items())},
                # {"<index>": [PID, ...]}: the listed creators, exited (or their number reused), whose contexts it holds.
                "contexts_of": {str(i): sorted(pids) for i, pids in sorted(held[pid]["contexts_of"].items())},
            }
        )
        if "driver" in details["attribution"].values():
            details["seen_in"] = sorted(set(details["seen_in"]) | {"driver"})
        holders.append(details)
    return holders, users
