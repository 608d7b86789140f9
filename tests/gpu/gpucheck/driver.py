# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The NVIDIA driver as the GPU check reads it: a stdlib-only probe, and pynvml readings of one GPU.

Memory is in MiB (2**20 bytes, rounded down) except where a name says bytes.
"""

from __future__ import annotations

import ctypes

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INSUFFICIENT_SIZE = 7
PROCESS_LISTS = ("compute", "graphics", "mps")


def probe():
    """Whether this host has a working NVIDIA driver with at least one GPU, with the standard library only.

    Returns (True, "N GPU(s)") or (False, reason). Loads libnvidia-ml.so.1 the way pynvml does.
    """
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as error:
        return False, "libnvidia-ml.so.1 cannot be loaded (%s)" % error
    nvml.nvmlErrorString.restype = ctypes.c_char_p
    result = nvml.nvmlInit_v2()
    if result != NVML_SUCCESS:
        return False, "nvmlInit_v2 failed: %s (%d)" % (nvml.nvmlErrorString(result).decode(), result)
    try:
        count = ctypes.c_uint()
        result = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
    finally:
        nvml.nvmlShutdown()
    if result != NVML_SUCCESS:
        return False, "nvmlDeviceGetCount_v2 failed: %s (%d)" % (nvml.nvmlErrorString(result).decode(), result)
    if count.value == 0:
        return False, "the NVIDIA driver reports no GPU"
    return True, "%d GPU(s)" % count.value


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


class Gpu:
    """One GPU through pynvml (nvidia-ml-py). Gpu(pynvml, index); call close() when done.

    identity() -> dict; memory() -> dict; used_bytes() -> int; processes() -> {pid: {"lists", "used_mib"}};
    all_processes() -> {index: processes()}; all_used_mib() -> {index: MiB}; minors() -> [minor number of every GPU of the host];
    mig_mode() -> {"current", "pending", "error"}; recovery() -> what the driver advises (read only).
    """

    def __init__(self, pynvml, index):
        self.nvml = pynvml
        self.index = index
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def close(self):
        self.nvml.nvmlShutdown()

    def identity(self):
        """{"index", "name", "uuid", "minor", "pci_bus_id", "memory_total_mib", "persistence_mode", "compute_mode"
        (0 default, 2 prohibited, 3 exclusive process; None where not supported), "gpu_count", "driver_version",
        "nvml_version", "cuda_driver_version"}."""
        nvml, handle = self.nvml, self.handle
        optional = {}
        for key, call in (
            ("persistence_mode", "nvmlDeviceGetPersistenceMode"),
            ("compute_mode", "nvmlDeviceGetComputeMode"),
        ):
            try:
                optional[key] = getattr(nvml, call)(handle)
            except nvml.NVMLError:
                optional[key] = None
        return dict(
            optional,
            **{
                "index": self.index,
                "name": _text(nvml.nvmlDeviceGetName(handle)),
                "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
                "minor": nvml.nvmlDeviceGetMinorNumber(handle),
                "pci_bus_id": _text(nvml.nvmlDeviceGetPciInfo(handle).busId),
                "memory_total_mib": nvml.nvmlDeviceGetMemoryInfo(handle).total >> 20,
                "gpu_count": nvml.nvmlDeviceGetCount(),
                "driver_version": _text(nvml.nvmlSystemGetDriverVersion()),
                "nvml_version": _text(nvml.nvmlSystemGetNVMLVersion()),
                "cuda_driver_version": nvml.nvmlSystemGetCudaDriverVersion(),
            },
        )

    def minors(self):
        """Minor numbers (the N of /dev/nvidiaN) of every GPU NVML sees, in index order."""
        nvml = self.nvml
        return [
            nvml.nvmlDeviceGetMinorNumber(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())
        ]

    def memory(self):
        """{"total_mib", "used_mib", "free_mib", "reserved_mib", "used_v1_mib"}: v2 (used excludes
        reserved) where the driver has nvmlDeviceGetMemoryInfo_v2, else v2 fields None."""
        nvml = self.nvml
        v1 = nvml.nvmlDeviceGetMemoryInfo(self.handle)
        memory = {
            "total_mib": v1.total >> 20,
            "used_mib": None,
            "free_mib": v1.free >> 20,
            "reserved_mib": None,
            "used_v1_mib": v1.used >> 20,
        }
        v2 = self._memory_v2()
        if v2 is None:
            return memory
        memory.update(used_mib=v2.used >> 20, free_mib=v2.free >> 20, reserved_mib=v2.reserved >> 20)
        return memory

    def _memory_v2(self, handle=None):
        """nvmlDeviceGetMemoryInfo_v2's struct, or None where the driver or pynvml lacks it."""
        nvml = self.nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is None:
            return None
        try:
            return nvml.nvmlDeviceGetMemoryInfo(self.handle if handle is None else handle, version=version)
        except nvml.NVMLError:
            return None

    def used_bytes(self):
        """Used bytes: NVML v2 `used` (reserved excluded), v1 where v2 is missing."""
        v2 = self._memory_v2()
        return v2.used if v2 is not None else self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used

    def mig_mode(self):
        """{"current", "pending"} from nvmlDeviceGetMigMode (1 enabled, 0 disabled), or {"error"} where the GPU or
        the driver has no MIG (NVML_ERROR_NOT_SUPPORTED, a library without the call). Reads only: never changes it."""
        nvml = self.nvml
        try:
            current, pending = nvml.nvmlDeviceGetMigMode(self.handle)
        except nvml.NVMLError as error:
            return {"current": None, "pending": None, "error": str(error)}
        return {"current": int(current), "pending": int(pending), "error": None}

    def recovery(self):
        """What the driver advises about this GPU, each read on its own (an error is recorded, never raised): the
        recovery action (field 230), remapped rows, retired pages pending, persistence mode, the active NVLinks with
        their far end. Reads only: nothing here resets the GPU or changes a setting (tests/gpu/README.md)."""
        nvml, handle, found = self.nvml, self.handle, {}

        def read(key, call, *args):
            try:
                found[key] = call(handle, *args)
            except Exception as error:  # an NVML error, or a library without the call
                found[key] = {"error": str(error)}

        def field(handle):
            value = nvml.nvmlDeviceGetFieldValues(handle, [230])[0]
            return {"return": int(value.nvmlReturn), "value": int(value.value.uiVal)}

        read("recovery_action", field)
        read("remapped_rows", lambda h: list(nvml.nvmlDeviceGetRemappedRows(h)))
        read("retired_pages_pending", lambda h: int(nvml.nvmlDeviceGetRetiredPagesPendingStatus(h)))
        read("persistence_mode", lambda h: int(nvml.nvmlDeviceGetPersistenceMode(h)))
        links = []
        for link in range(36):
            try:
                if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
                remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId
                kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
                links.append({"link": link, "remote_bus_id": _text(remote), "remote_type": int(kind)})
            except Exception as error:  # NOT_SUPPORTED (no NVLink) or INVALID_ARGUMENT (past the last link)
                links.append({"link": link, "error": str(error)})
                break
        found["nvlinks"] = links
        return found

    def all_used_mib(self):
        """{index: used MiB (NVML v2 where the driver has it, else v1)} for every GPU NVML sees."""
        nvml = self.nvml
        used = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            v2 = self._memory_v2(handle)
            used[index] = (v2.used if v2 is not None else nvml.nvmlDeviceGetMemoryInfo(handle).used) >> 20
        return used

    def all_processes(self):
        """{index: processes() of that GPU} for every GPU NVML sees (the driver's lists per GPU)."""
        nvml = self.nvml
        return {
            index: self.processes(nvml.nvmlDeviceGetHandleByIndex(index)) for index in range(nvml.nvmlDeviceGetCount())
        }

    def processes(self, handle=None):
        """{pid: {"lists": names of the driver lists showing it (compute, graphics, mps), "used_mib": int or None}}
        for this GPU (or the GPU of `handle`).

        A list that grew between pynvml's two calls (INSUFFICIENT_SIZE) is read again.
        """
        nvml = self.nvml
        handle = self.handle if handle is None else handle
        calls = dict(
            zip(
                PROCESS_LISTS,
                (
                    nvml.nvmlDeviceGetComputeRunningProcesses,
                    nvml.nvmlDeviceGetGraphicsRunningProcesses,
                    nvml.nvmlDeviceGetMPSComputeRunningProcesses,
                ),
            )
        )
        found = {}
        for list_name, call in calls.items():
            for entry in self._read_list(call, handle):
                item = found.setdefault(entry.pid, {"lists": [], "used_mib": None})
                item["lists"].append(list_name)
                if entry.usedGpuMemory is not None and item["used_mib"] is None:
                    item["used_mib"] = entry.usedGpuMemory >> 20
        return found

    def _read_list(self, call, handle):
        """One process list; [] where the driver does not support it; re-read while it keeps growing."""
        nvml = self.nvml
        for _attempt in range(4):
            try:
                return call(handle)
            except nvml.NVMLError as error:
                if error.value == NVML_ERROR_NOT_SUPPORTED:
                    return []
                if error.value != NVML_ERROR_INSUFFICIENT_SIZE:
                    raise
        return call(handle)
