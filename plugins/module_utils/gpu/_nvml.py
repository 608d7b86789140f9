# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the driver says: GPUs, memory and process lists through NVML (pynvml).

NVML calls can block forever when the driver is wedged, so every query runs in a
worker process forked by `DriverQuery`; the caller waits on it with a deadline and
kills it when the deadline passes. The worker keeps NVML initialized between queries
(nvmlInit is slow on real machines), which means it holds /dev/nvidiactl and every
/dev/nvidiaN open like any NVML client: callers exclude its PID from holder scans.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union, cast

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _proc, _shapes

# pynvml (nvidia-ml-py) has no type information: the module, its handles and its structs are Any here.
Pynvml = Any
# A process-list function: handle -> entries (pynvml's structs, or the ctypes structs of _raw_list).
ListFunction = Callable[[Any], Sequence[Any]]

MIB = 1 << 20
# nvml.h return codes used here.
_NVML_SUCCESS = 0
_NVML_ERROR_NO_PERMISSION = 4
# NVML_ERROR_INSUFFICIENT_SIZE: the process list grew between pynvml's count probe and its read.
_NVML_ERROR_INSUFFICIENT_SIZE = 7
_NVML_ERROR_FUNCTION_NOT_FOUND = 13
_LIST_RETRIES = 5
# nvmlProcessInfo_v2_t.gpuInstanceId / computeInstanceId when the GPU is not in MIG mode.
_NO_INSTANCE_ID = 0xFFFFFFFF
_NVML_DEVICE_MIG_ENABLE = 1
# The aggregate memory and process lists of a MIG-enabled GPU need privileges (nvml.h).
_NO_PERMISSION_TEXT = (
    "NVML answered Insufficient Permissions for the aggregate process lists of this MIG-enabled GPU "
    "(they need root or the mig/monitor capability); the per-MIG-device lists were used instead"
)

# The process lists, newest first: (version, compute/graphics/MPS symbols). The _v3 ones are reached through
# pynvml's public functions (which pin _v3 since nvidia-ml-py 12.535.108); the older ones pynvml does not
# wrap (12.535.108 has no _v2 wrappers, no release has a v1 one with the 16-byte v1 struct), so _raw_list
# calls them by name through pynvml's own symbol lookup, with the struct nvml.h gives each.
_LIST_KINDS: Tuple[_shapes.ListType, ...] = ("compute", "graphics", "mps")
_OLDER_LISTS = (
    (
        "v2",
        (
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetGraphicsRunningProcesses_v2",
            "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        ),
    ),
    (
        "v1",
        (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
            "nvmlDeviceGetMPSComputeRunningProcesses",
        ),
    ),
)


class _ProcessInfoV1(ctypes.Structure):  # pylint: disable=too-few-public-methods
    """nvmlProcessInfo_v1_t (nvml.h): the entries of the unversioned process-list symbols, 16 bytes."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessInfoV2(ctypes.Structure):  # pylint: disable=too-few-public-methods
    """nvmlProcessInfo_v2_t (nvml.h): the entries of the _v2 and _v3 symbols, 24 bytes (with padding)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _ProcessInfoV3Legacy(ctypes.Structure):  # pylint: disable=too-few-public-methods
    """The _v3 entry of early R535 drivers (535.43.02-535.86.05): nvmlProcessInfo_v2_t plus usedGpuCcProtectedMemory,
    32 bytes. nvidia-ml-py 12.535.108+ reads it as 24 bytes and garbles every entry after the first (nvitop#75)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
        ("usedGpuCcProtectedMemory", ctypes.c_ulonglong),
    ]


_V3_SYMBOLS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
)


def _has_symbol(pynvml: Pynvml, symbol: str) -> bool:
    try:
        pynvml._nvmlGetFunctionPointer(symbol)  # pylint: disable=protected-access
    except Exception:  # pylint: disable=broad-except
        return False
    return True


def _legacy_v3(pynvml: Pynvml) -> bool:
    """Whether the library writes 32-byte _v3 entries: nvitop 1.7.2's probe (api/libnvml.py): early R535 libraries
    have nvmlDeviceGetConfComputeMemSizeInfo and not yet nvmlDeviceGetRunningProcessDetailList, which came when the
    _v3 layout went back to 24 bytes."""
    return _has_symbol(pynvml, "nvmlDeviceGetConfComputeMemSizeInfo") and not _has_symbol(
        pynvml, "nvmlDeviceGetRunningProcessDetailList"
    )


# How long close() lets the worker leave on its own (seconds): it exits as soon as it reads the end of its request
# pipe, unless a driver call holds it.
_WORKER_EXIT_S = 0.1
# How long close() waits for a SIGKILLed worker to be reaped (seconds). A worker stuck in the driver sleeps
# uninterruptibly (state D), where SIGKILL waits until the driver call returns: it is left behind and reported.
KILLED_EXIT_S = 1.0
# The deadline of the worker's first nvmlInit (seconds), apart from the reading's: with persistence mode off the
# first client initializes every GPU, seconds on real hosts (NVIDIA/nvidia-container-toolkit#202), which is not a
# hung driver. The reading that follows gets the caller's timeout.
INIT_TIMEOUT_S = 30.0
_INIT_DONE = b'{"initialized": true}'


class NvmlTimeout(Exception):
    """An NVML query did not answer within its deadline (the worker was killed)."""


class NvmlWorkerError(Exception):
    """The NVML worker failed with a Python error, or exited on its own: a defect, not a driver that did not answer."""


def _text(value: Union[bytes, str]) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _process_list(pynvml: Pynvml, function: ListFunction, handle: Any) -> Sequence[Any]:
    """Call one of the *RunningProcesses functions, retrying when the list grows mid-call."""
    for attempt in range(_LIST_RETRIES):
        try:
            return function(handle)
        except pynvml.NVMLError as exc:
            if exc.value != _NVML_ERROR_INSUFFICIENT_SIZE or attempt == _LIST_RETRIES - 1:
                raise
    return []


def _raw_list(pynvml: Pynvml, symbol: str, entry_type: Type[ctypes.Structure]) -> ListFunction:
    """A process-list function pynvml does not wrap, called with pynvml's count-probe protocol
    (count 0 and no buffer first, then count*2+5 entries) and the `entry_type` struct."""
    function = pynvml._nvmlGetFunctionPointer(symbol)  # pylint: disable=protected-access

    def call(handle: Any) -> List[Any]:
        count = ctypes.c_uint(0)
        ret = function(handle, ctypes.byref(count), None)
        if ret == _NVML_SUCCESS:
            return []
        if ret != _NVML_ERROR_INSUFFICIENT_SIZE:
            raise pynvml.NVMLError(ret)
        count.value = count.value * 2 + 5
        entries = (entry_type * count.value)()
        ret = function(handle, ctypes.byref(count), entries)
        if ret != _NVML_SUCCESS:
            raise pynvml.NVMLError(ret)
        return list(entries[: count.value])

    return call


def _missing_symbol(pynvml: Pynvml, exc: BaseException) -> bool:
    """Whether `exc` says the driver library lacks the function: pynvml 13.x raises NVMLLibraryMismatchError
    for a missing _v3 process-list symbol, 12.x NVMLError_FunctionNotFound."""
    mismatch = getattr(pynvml, "NVMLLibraryMismatchError", None)
    if isinstance(mismatch, type) and isinstance(exc, mismatch):
        return True
    return isinstance(exc, pynvml.NVMLError) and getattr(exc, "value", None) == _NVML_ERROR_FUNCTION_NOT_FOUND


def _instance_id(value: Optional[int]) -> Optional[int]:
    return None if value is None or value == _NO_INSTANCE_ID else int(value)


def _entry(proc: Any, kind: _shapes.ListType) -> _shapes.ListEntry:
    used = getattr(proc, "usedGpuMemory", None)
    if used is not None and used >= (1 << 64) - 1:  # NVML_VALUE_NOT_AVAILABLE (pynvml maps it to None itself)
        used = None
    return {
        "pid": int(proc.pid),
        "used_mib": None if used is None else used // MIB,
        "type": kind,
        "gpu_instance_id": _instance_id(getattr(proc, "gpuInstanceId", None)),
        "compute_instance_id": _instance_id(getattr(proc, "computeInstanceId", None)),
    }


def _process_lists(
    pynvml: Pynvml, handle: Any, versions: List[_shapes.ListVersion]
) -> Tuple[List[_shapes.ListEntry], _shapes.ListVersion]:
    """Compute, graphics and MPS lists of `handle` (a GPU or MIG device handle) as entries; the list
    version that answered ("v3", "v2" or "v1"). `versions` is the list of versions still worth trying
    (the first missing symbol removes its version for the rest of the reading)."""
    while True:
        version = versions[0]
        try:
            if version == "v3" and _legacy_v3(pynvml):
                versions[0] = version = "v3-32"
            if version == "v3-32":
                functions = tuple(_raw_list(pynvml, symbol, _ProcessInfoV3Legacy) for symbol in _V3_SYMBOLS)
            elif version == "v3":
                functions = (
                    pynvml.nvmlDeviceGetComputeRunningProcesses,
                    pynvml.nvmlDeviceGetGraphicsRunningProcesses,
                    pynvml.nvmlDeviceGetMPSComputeRunningProcesses,
                )
            else:
                entry_type = _ProcessInfoV2 if version == "v2" else _ProcessInfoV1
                functions = tuple(_raw_list(pynvml, symbol, entry_type) for symbol in dict(_OLDER_LISTS)[version])
            entries: List[_shapes.ListEntry] = []
            for kind, function in zip(_LIST_KINDS, functions):
                try:
                    processes = _process_list(pynvml, function, handle)
                except pynvml.NVMLError_NotSupported:
                    continue
                entries.extend(_entry(proc, kind) for proc in processes)
            return entries, version
        except Exception as exc:  # pylint: disable=broad-except
            if not _missing_symbol(pynvml, exc) or len(versions) == 1:
                raise
            versions.pop(0)


_UNSUPPORTED_MEMORY: _shapes.Memory = {
    "total_mib": None,
    "used_mib": None,
    "free_mib": None,
    "reserved_mib": None,
    "source": None,
    "used_includes_reserved": None,
    "used_excluding_reserved_mib": None,
    "supported": False,
}


def _memory(pynvml: Pynvml, handle: Any) -> _shapes.Memory:
    """Memory of one GPU (or MIG device) in MiB: NVML memory info v2 (reserved separate), v1 where v2 is missing.

    `used_excluding_reserved_mib` is the figure to hold against a tolerance such as max_used_mib: v2 `used`
    (nvml.h: v2 accounts reserved memory separately), None with v1, whose `used` includes the reserved memory
    on current drivers (`used_includes_reserved`) and cannot be split."""
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        return {
            "total_mib": info.total // MIB,
            "used_mib": info.used // MIB,
            "free_mib": info.free // MIB,
            "reserved_mib": info.reserved // MIB,
            "source": "nvmlDeviceGetMemoryInfo_v2",
            "used_includes_reserved": False,
            "used_excluding_reserved_mib": info.used // MIB,
        }
    # A driver without nvmlDeviceGetMemoryInfo_v2 (FunctionNotFound), or one that does not know the v2 struct
    # version (ArgumentVersionMismatch).
    except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported, pynvml.NVMLError_ArgumentVersionMismatch):
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError_NotSupported:
            # A unified-memory GPU (NVIDIA GB10) reports no memory, v1 and v2 alike, while its process lists answer
            # (XuehaiPan/nvitop PR 208): not an error of the GPU; it is judged by its lists and device files.
            return _UNSUPPORTED_MEMORY.copy()
        # v1 `used` includes reserved memory; v1 cannot tell them apart.
        return {
            "total_mib": info.total // MIB,
            "used_mib": info.used // MIB,
            "free_mib": info.free // MIB,
            "reserved_mib": None,
            "source": "nvmlDeviceGetMemoryInfo",
            "used_includes_reserved": True,
            "used_excluding_reserved_mib": None,
        }


def _mig_name_profile(name: str) -> Optional[str]:
    """ "NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb" (the MIG device name ends with its profile)."""
    head, sep, profile = name.rpartition(" MIG ")
    return profile if sep and head else None


def _mig_devices(pynvml: Pynvml, handle: Any) -> List[Tuple[Any, _shapes.NvmlMigDevice]]:
    """The MIG devices of a MIG-enabled GPU: [(mig handle, description)]."""
    devices: List[Tuple[Any, _shapes.NvmlMigDevice]] = []
    for position in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, position)
        except pynvml.NVMLError_NotFound:
            continue
        name = _text(pynvml.nvmlDeviceGetName(mig))
        memory = _memory(pynvml, mig)
        devices.append(
            (
                mig,
                {
                    "index": position,
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(mig)),
                    "gpu_instance_id": pynvml.nvmlDeviceGetGpuInstanceId(mig),
                    "compute_instance_id": pynvml.nvmlDeviceGetComputeInstanceId(mig),
                    "name": name,
                    "profile": _mig_name_profile(name),
                    "memory_total_mib": memory["total_mib"],
                    "memory_used_mib": memory["used_mib"],
                    "memory_free_mib": memory["free_mib"],
                    "memory_source": memory["source"],
                },
            )
        )
    return devices


def _mig_mode(pynvml: Pynvml, handle: Any) -> Optional[_shapes.MigMode]:
    """{"current": bool, "pending": bool}, or None where the GPU or the driver has no MIG."""
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return None
    return {"current": current == _NVML_DEVICE_MIG_ENABLE, "pending": pending == _NVML_DEVICE_MIG_ENABLE}


def _no_permission(pynvml: Pynvml, exc: BaseException) -> bool:
    return isinstance(exc, pynvml.NVMLError) and getattr(exc, "value", None) == _NVML_ERROR_NO_PERMISSION


def _optional(call: Callable[..., Any], *args: Any) -> Optional[str]:
    try:
        return _text(call(*args))
    except Exception:  # pylint: disable=broad-except
        return None


def read_gpu(pynvml: Pynvml, index: int, list_versions: Optional[List[_shapes.ListVersion]] = None) -> _shapes.NvmlGpu:
    """Everything NVML says about GPU `index`, as plain data.

    Returns {"index", "minor", "uuid", "name", "pci_bus_id",
    "memory": {total_mib, used_mib, free_mib, reserved_mib (None with v1), source (the NVML call, or
    "mig_devices" when the aggregate was refused: the sum of the MIG devices), used_includes_reserved,
    used_excluding_reserved_mib (None with v1)},
    "processes": [{"pid", "used_mib" (None when NVML reports it as not available), "type" (compute, graphics
    or mps), "gpu_instance_id", "compute_instance_id" (None when not MIG)}],
    "process_list_version" ("v3", "v3-32" (early R535 32-byte entries), "v2", "v1"; None when no list was read),
    "processes_error" (None, or why the lists are partial: the aggregate lists of a MIG-enabled GPU need
    privileges; not a GPU error),
    "mig_mode" ({"current": bool, "pending": bool}; None when the GPU or driver has no MIG),
    "mig_devices" ([{"index", "uuid", "gpu_instance_id", "compute_instance_id", "name", "profile",
    "memory_total_mib", "memory_used_mib", "memory_free_mib", "memory_source"}] when MIG is enabled),
    "error" (None, or the NVML error text, e.g. a lost GPU)}.
    `list_versions` (shared by the GPUs of one reading) is the process-list versions still worth trying.
    """
    versions: List[_shapes.ListVersion] = list_versions if list_versions is not None else ["v3", "v2", "v1"]
    gpu: _shapes.NvmlGpu = {
        "index": index,
        "minor": None,
        "uuid": None,
        "name": None,
        "pci_bus_id": None,
        "memory": None,
        "processes": [],
        "process_list_version": None,
        "processes_error": None,
        "mig_mode": None,
        "mig_devices": [],
        "error": None,
    }
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        gpu["minor"] = pynvml.nvmlDeviceGetMinorNumber(handle)
        gpu["uuid"] = _text(pynvml.nvmlDeviceGetUUID(handle))
        gpu["name"] = _text(pynvml.nvmlDeviceGetName(handle))
        gpu["pci_bus_id"] = _optional(lambda h: pynvml.nvmlDeviceGetPciInfo(h).busId, handle)
        gpu["mig_mode"] = _mig_mode(pynvml, handle)
        migs = _mig_devices(pynvml, handle) if gpu["mig_mode"] and gpu["mig_mode"]["current"] else []
        gpu["mig_devices"] = [description for _mig, description in migs]
        gpu["memory"] = _gpu_memory(pynvml, handle, migs)
        _read_processes(pynvml, handle, migs, versions, gpu)
    except _errors(pynvml) as exc:
        gpu["error"] = str(exc)
    return gpu


def _gpu_memory(pynvml: Pynvml, handle: Any, migs: List[Tuple[Any, _shapes.NvmlMigDevice]]) -> _shapes.Memory:
    """read_gpu's "memory" of GPU `handle`: NVML's aggregate, or on a MIG-enabled GPU that refuses it for lack of
    privileges, the sum of its MIG devices (`migs`: _mig_devices' (handle, description) pairs)."""
    try:
        return _memory(pynvml, handle)
    except pynvml.NVMLError as exc:
        if not (migs and _no_permission(pynvml, exc)):
            raise
    # nvml.h: on a MIG-enabled GPU the aggregate needs privileges; per-instance figures do not.
    mig_devices = [description for _mig, description in migs]
    return {
        "total_mib": _sum_mib([m["memory_total_mib"] for m in mig_devices]),
        "used_mib": _sum_mib([m["memory_used_mib"] for m in mig_devices]),
        "free_mib": _sum_mib([m["memory_free_mib"] for m in mig_devices]),
        "reserved_mib": None,
        "source": "mig_devices",
        "used_includes_reserved": False,
        "used_excluding_reserved_mib": _sum_mib([m["memory_used_mib"] for m in mig_devices]),
    }


def _sum_mib(figures: List[Optional[int]]) -> int:
    """The sum of the MIG devices' figures (MiB). Each is known where the aggregate is refused (a MIG device without
    a figure raises TypeError here, as sum() always did)."""
    return sum(cast(List[int], figures))


def _read_processes(
    pynvml: Pynvml,
    handle: Any,
    migs: List[Tuple[Any, _shapes.NvmlMigDevice]],
    versions: List[_shapes.ListVersion],
    gpu: _shapes.NvmlGpu,
) -> None:
    """Set read_gpu's "processes" and "process_list_version" of `gpu`: the GPU's lists, or on a MIG-enabled GPU that
    refuses them for lack of privileges, its MIG devices' lists, with "processes_error" saying why."""
    try:
        gpu["processes"], gpu["process_list_version"] = _process_lists(pynvml, handle, versions)
    except pynvml.NVMLError as exc:
        if not (migs and _no_permission(pynvml, exc)):
            raise
        gpu["processes_error"] = _NO_PERMISSION_TEXT
        for mig, _description in migs:
            entries, gpu["process_list_version"] = _process_lists(pynvml, mig, versions)
            gpu["processes"].extend(entries)


# The driver's advice (read_advice): what _recovery judges a GPU to need.
# nvmlDeviceGpuRecoveryAction_t, in its order (nvidia-ml-py 13.615.71: NVML_GPU_RECOVERY_ACTION_NONE = 0 ...).
ACTIONS: Tuple[str, ...] = (
    "none",
    "gpu_reset",
    "node_reboot",
    "drain_p2p",
    "drain_and_reset",
    "recover_imex_domain",
    "bus_reset",
    "system_reboot",
)
FIELD_RECOVERY_ACTION = 230
_NVLINK_DEVICE_TYPE_GPU = 0
_NVLINK_LINKS = 36  # NVML_NVLINK_MAX_LINKS of nvidia-ml-py 13.x; a GPU with fewer answers an error past its last


def _call(pynvml: Any, function: str, *args: Any) -> Tuple[Any, Optional[str]]:
    """pynvml.function(*args) and None, or None and the NVML error (a driver without the call: its error too)."""
    try:
        return getattr(pynvml, function)(*args), None
    except Exception as exc:  # pylint: disable=broad-except
        return None, "%s: %s" % (function, exc)


def _recovery_action(pynvml: Any, handle: Any) -> Tuple[Optional[str], Optional[str]]:
    values, error = _call(pynvml, "nvmlDeviceGetFieldValues", handle, [FIELD_RECOVERY_ACTION])
    if error:
        return None, error
    value = values[0]
    if value.nvmlReturn != 0:
        return None, "field %d (the recovery action): NVML error %d" % (FIELD_RECOVERY_ACTION, value.nvmlReturn)
    code = int(value.value.uiVal)
    return (ACTIONS[code] if code < len(ACTIONS) else "unknown_%d" % code), None


def _nvlink_peers(pynvml: Any, handle: Any) -> Tuple[List[str], bool]:
    """Bus ids of the GPUs on this GPU's active NVLinks, and whether any link reaches an NVSwitch."""
    peers: List[str] = []
    switch = False
    for link in range(_NVLINK_LINKS):
        active, error = _call(pynvml, "nvmlDeviceGetNvLinkState", handle, link)
        if error:
            break  # NOT_SUPPORTED (no NVLink) or INVALID_ARGUMENT (past its last link)
        if not active:
            continue
        kind, _error = _call(pynvml, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if kind is not None and kind != _NVLINK_DEVICE_TYPE_GPU:
            switch = True
            continue
        pci, _error = _call(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        bus_id = getattr(pci, "busId", None)
        if bus_id:
            text = _text(bus_id)
            if text not in peers:
                peers.append(text)
    return peers, switch


def read_advice(pynvml: Any, index: int) -> _shapes.DriverAdvice:
    """What the driver says of GPU `index` beyond memory and processes, in the NVML worker (read_driver with advice):
    the recovery action (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 230), remapped rows, retired pages pending,
    persistence mode and the GPUs at the far end of its NVLinks (nvidia-ml-py 13.615.71). Each figure is None where
    the driver does not answer it; `errors` says why. What a GPU then needs is _recovery's to say."""
    errors: List[str] = []
    advice: _shapes.DriverAdvice = {
        "index": index,
        "recovery_action": None,
        "remapped_rows": None,
        "retired_pages_pending": None,
        "persistence_mode": None,
        "nvlink_peers": [],
        "nvlink_switch": False,
        "errors": errors,
    }
    handle, error = _call(pynvml, "nvmlDeviceGetHandleByIndex", index)
    if error:
        errors.append(error)
        return advice
    advice["recovery_action"], error = _recovery_action(pynvml, handle)
    rows, row_error = _call(pynvml, "nvmlDeviceGetRemappedRows", handle)
    if rows is not None:
        advice["remapped_rows"] = {
            "correctable": int(rows[0]),
            "uncorrectable": int(rows[1]),
            "pending": bool(rows[2]),
            "failure": bool(rows[3]),
        }
    pending, pages_error = _call(pynvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    advice["retired_pages_pending"] = None if pending is None else bool(pending)
    mode, mode_error = _call(pynvml, "nvmlDeviceGetPersistenceMode", handle)
    advice["persistence_mode"] = None if mode is None else bool(mode)
    advice["nvlink_peers"], advice["nvlink_switch"] = _nvlink_peers(pynvml, handle)
    errors.extend(text for text in (error, row_error, pages_error, mode_error) if text)
    return advice


def _errors(pynvml: Pynvml) -> Tuple[Type[BaseException], ...]:
    """Exceptions that mean "the driver said no": NVML errors, and pynvml's NVMLLibraryMismatchError
    (a driver library without the _v3 process-list functions; not an NVMLError subclass)."""
    return (pynvml.NVMLError,) + tuple(
        cls for cls in (getattr(pynvml, "NVMLLibraryMismatchError", None),) if isinstance(cls, type)
    )


def read_driver(pynvml: Pynvml, initialized: bool = False, advice: bool = False) -> _shapes.Reading:
    """One full NVML reading (run inside the worker): versions and every GPU.

    Returns {"available": bool, "error": str or None, "driver_version", "nvml_version",
    "cuda_driver_version", "gpus": [read_gpu(...)]}, with `advice` also "advice": [read_advice(...)]
    (the recovery action, remapped rows, persistence mode, NVLink peers of each GPU). A missing library or driver
    gives available=False with the NVML error text; it never raises NVMLError.
    """
    reading: _shapes.Reading = {
        "available": False,
        "error": None,
        "driver_version": None,
        "nvml_version": None,
        "cuda_driver_version": None,
        "gpus": [],
    }
    try:
        if not initialized:
            pynvml.nvmlInit()
        reading["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        reading["nvml_version"] = _optional(pynvml.nvmlSystemGetNVMLVersion)
        reading["cuda_driver_version"] = _optional(pynvml.nvmlSystemGetCudaDriverVersion)
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        reading["error"] = "%s: %s" % (type(exc).__name__, exc)
        return reading
    reading["available"] = True
    list_versions: List[_shapes.ListVersion] = ["v3", "v2", "v1"]
    reading["gpus"] = [read_gpu(pynvml, index, list_versions) for index in range(count)]
    if advice:
        reading["advice"] = [read_advice(pynvml, index) for index in range(count)]
    return reading


def _worker(pynvml: Pynvml, requests: int, replies: int) -> None:
    """Worker loop: one JSON reading per request line ("r", or "a": with the driver's advice), until the request
    pipe closes."""
    initialized = False
    with os.fdopen(requests, "rb", 0) as req, os.fdopen(replies, "wb", 0) as rep:
        for request in iter(req.readline, b""):
            try:
                if not initialized:
                    try:
                        pynvml.nvmlInit()
                        initialized = True
                    except pynvml.NVMLError:
                        pass  # read_driver tries again and reports the error
                    rep.write(_INIT_DONE + b"\n")
                reading = read_driver(pynvml, initialized, advice=request == b"a\n")
            except Exception as exc:  # pylint: disable=broad-except
                rep.write(json.dumps({"worker_error": "%s: %s" % (type(exc).__name__, exc)}).encode("utf-8") + b"\n")
                return
            rep.write(json.dumps(reading).encode("utf-8") + b"\n")


def _exited_within(pid: int, timeout: float) -> bool:
    """Whether our child `pid` exits within `timeout` seconds; reaped when it did. Waited for through a pidfd (Linux 5.3+,
    Python 3.9+), one wakeup when it exits; else by polling waitpid every 5 ms, each poll a wakeup of this process that
    costs CPU on a busy host."""
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = None
    if pidfd is not None:
        try:
            select.select([pidfd], [], [], timeout)  # readable once the child has exited
        finally:
            os.close(pidfd)
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    deadline = time.monotonic() + timeout
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


class DriverQuery:
    """NVML readings from a forked worker process, each bounded by a deadline.

    Usage: q = DriverQuery(pynvml); q.read(timeout=10) -> read_driver() dict; q.close().
    `pid` is the worker's PID (exclude it from holder scans: it holds the device files
    while NVML is initialized). After an NvmlTimeout the worker is gone and later reads
    raise NvmlTimeout at once: a wedged driver does not recover within one module run.
    """

    def __init__(self, pynvml: Pynvml) -> None:
        self._pynvml = pynvml
        self.pid: Optional[int] = None
        self._req: Optional[int] = None
        self._rep: Optional[int] = None
        self._buffer = b""
        self.timed_out: Optional[str] = None  # the first failure's text, once NVML stopped answering
        self.failed: Optional[str] = None  # the worker's Python error, once it had one
        self.left_behind: List[int] = []  # workers that SIGKILL did not end within KILLED_EXIT_S (stuck in the driver)
        self._initialized = False  # the worker has answered its nvmlInit

    def _start(self) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = _proc.fork_worker(lambda: _worker(self._pynvml, req_r, rep_w), close=(req_w, rep_r))
        os.close(req_r)
        os.close(rep_w)
        self.pid, self._req, self._rep = pid, req_w, rep_r
        self._initialized = False

    def read(self, timeout: float, advice: bool = False) -> _shapes.Reading:
        """One reading (see read_driver; `advice`: with the driver's advice), or NvmlTimeout after `timeout` seconds
        (the worker's first nvmlInit has INIT_TIMEOUT_S of its own)."""
        if self.timed_out:
            raise NvmlTimeout("%s; not asked again in this run" % self.timed_out)
        if self.failed:
            raise NvmlWorkerError(self.failed)
        if self.pid is None:
            self._start()
        # Set by _start: the ends of the request and reply pipes.
        req, rep = cast(int, self._req), cast(int, self._rep)
        deadline = time.monotonic() + (timeout if self._initialized else max(timeout, INIT_TIMEOUT_S))
        try:
            os.write(req, b"a\n" if advice else b"r\n")
            while True:
                while b"\n" not in self._buffer:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([rep], [], [], left)[0]:
                        raise NvmlTimeout(
                            "an NVML call did not return within %.1f s (driver hung?)" % timeout
                            if self._initialized
                            else "nvmlInit did not return within %.1f s (a first initialization with persistence mode "
                            "off takes seconds; this long: driver hung?)" % max(timeout, INIT_TIMEOUT_S)
                        )
                    chunk = os.read(rep, 65536)
                    if not chunk:
                        raise NvmlWorkerError("the NVML worker exited unexpectedly (a defect, not a driver that hung)")
                    self._buffer += chunk
                if self._buffer.startswith(_INIT_DONE + b"\n"):
                    self._buffer = self._buffer[len(_INIT_DONE) + 1 :]
                    self._initialized = True
                    deadline = time.monotonic() + timeout
                    continue
                break
        except (NvmlTimeout, NvmlWorkerError, OSError) as exc:
            behind = self.close()
            if isinstance(exc, NvmlWorkerError):
                self.failed = str(exc)
                raise
            if not isinstance(exc, NvmlTimeout):
                exc = NvmlTimeout("the NVML worker failed: %s" % exc)
            self.timed_out = str(exc) + _left_behind_text(behind)
            raise NvmlTimeout(self.timed_out)
        line, _newline, self._buffer = self._buffer.partition(b"\n")
        reading: Dict[str, Any] = json.loads(line.decode("utf-8"))
        if "worker_error" in reading:
            self.close()
            self.failed = "the NVML worker failed with a Python error: %s" % reading["worker_error"]
            raise NvmlWorkerError(self.failed)
        return cast(_shapes.Reading, reading)

    def close(self) -> Optional[int]:
        """End the worker (SIGKILL if it does not leave at once, e.g. stuck in a driver call). Returns the worker's PID
        when it was left behind (not reaped within KILLED_EXIT_S of SIGKILL: stuck in the driver), else None."""
        if self.pid is None:
            return None
        for fd in (cast(int, self._req), cast(int, self._rep)):
            try:
                os.close(fd)
            except OSError:
                pass
        pid, self.pid = self.pid, None
        if _exited_within(pid, _WORKER_EXIT_S):
            return None
        try:
            os.kill(pid, signal.SIGKILL)  # our own forked child
        except OSError:
            pass
        if _exited_within(pid, KILLED_EXIT_S):
            return None
        self.left_behind.append(pid)
        return pid


def _left_behind_text(pid: Optional[int]) -> str:
    if pid is None:
        return ""
    return (
        "; the NVML worker (PID %d) did not end within %.1f s of SIGKILL (uninterruptible sleep in the driver) "
        "and was left behind" % (pid, KILLED_EXIT_S)
    )
