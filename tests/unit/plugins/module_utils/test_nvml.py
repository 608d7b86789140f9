# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_nvml against a fake pynvml: same functions and the real pynvml exception classes, no driver behind it."""
from __future__ import annotations

import errno
import json
import os
import time
import types

import pynvml
import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils import _nvml

MIB = 1 << 20


def nvml_error(code):
    """An NVMLError of the subclass pynvml itself would raise for `code` (e.g. NVMLError_GpuIsLost for 15)."""
    return pynvml.NVMLError(code)


class FakeGpu:
    def __init__(self, minor, uuid, name="NVIDIA H100 80GB HBM3", bus="00000000:18:00.0", total_mib=81559,
                 used_mib=1000, reserved_mib=529, compute=(), graphics=(), mps=None, lost=False, memory_v2=True):
        self.minor, self.uuid, self.name, self.bus = minor, uuid, name, bus
        self.total_mib, self.used_mib, self.reserved_mib = total_mib, used_mib, reserved_mib
        self.lists = {"compute": list(compute), "graphics": list(graphics), "mps": mps}
        self.lost, self.memory_v2 = lost, memory_v2
        self.insufficient_size = 0  # how many list calls answer NVML_ERROR_INSUFFICIENT_SIZE first


class FakeNvml:
    """Just enough of pynvml for read_driver/read_gpu. Errors are pynvml's own classes."""

    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_ArgumentVersionMismatch = pynvml.NVMLError_ArgumentVersionMismatch
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, gpus, init_error=None, count_delay=0.0):
        self.gpus = gpus
        self.init_error = init_error
        self.count_delay = count_delay
        self.init_calls = 0

    def nvmlInit(self):
        self.init_calls += 1
        if self.init_error is not None:
            raise nvml_error(self.init_error)

    def nvmlSystemGetDriverVersion(self):
        return "580.95.05"

    def nvmlSystemGetNVMLVersion(self):
        return b"13.580.95.05"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def nvmlDeviceGetCount(self):
        if self.count_delay:
            time.sleep(self.count_delay)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        gpu = self.gpus[index]
        if gpu.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def nvmlDeviceGetMinorNumber(self, gpu):
        return gpu.minor

    def nvmlDeviceGetUUID(self, gpu):
        return gpu.uuid

    def nvmlDeviceGetName(self, gpu):
        return gpu.name.encode()

    def nvmlDeviceGetPciInfo(self, gpu):
        return types.SimpleNamespace(busId=gpu.bus.encode())

    def nvmlDeviceGetMemoryInfo(self, gpu, version=None):
        if version is None:  # v1: used includes reserved
            return types.SimpleNamespace(total=gpu.total_mib * MIB, used=(gpu.used_mib + gpu.reserved_mib) * MIB,
                                         free=(gpu.total_mib - gpu.used_mib - gpu.reserved_mib) * MIB)
        assert version == pynvml.nvmlMemory_v2
        if gpu.memory_v2 is not True:
            raise nvml_error(gpu.memory_v2)
        return types.SimpleNamespace(total=gpu.total_mib * MIB, used=gpu.used_mib * MIB, reserved=gpu.reserved_mib * MIB,
                                     free=(gpu.total_mib - gpu.used_mib - gpu.reserved_mib) * MIB)

    def _list(self, kind, gpu):
        if gpu.lists[kind] is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu.insufficient_size:
            gpu.insufficient_size -= 1
            raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.lists[kind]]

    def nvmlDeviceGetComputeRunningProcesses(self, gpu):
        return self._list("compute", gpu)

    def nvmlDeviceGetGraphicsRunningProcesses(self, gpu):
        return self._list("graphics", gpu)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, gpu):
        return self._list("mps", gpu)


def two_gpus():
    return [
        FakeGpu(5, "GPU-aaaa", compute=[(4242, 70000 * MIB), (4243, None)], graphics=[(4300, 12 * MIB)], used_mib=71000),
        FakeGpu(2, "GPU-bbbb", bus="00000000:2A:00.0", used_mib=0),
    ]


def test_read_driver_full_reading_with_v2_memory():
    fake = FakeNvml(two_gpus())
    reading = _nvml.read_driver(fake)
    assert fake.init_calls == 1
    assert reading["available"] is True and reading["error"] is None
    assert (reading["driver_version"], reading["nvml_version"], reading["cuda_driver_version"]) == (
        "580.95.05", "13.580.95.05", 13000)
    first, second = reading["gpus"]
    assert (first["index"], first["minor"], first["uuid"], first["name"], first["pci_bus_id"]) == (
        0, 5, "GPU-aaaa", "NVIDIA H100 80GB HBM3", "00000000:18:00.0")
    assert first["memory"] == {"total_mib": 81559, "used_mib": 71000, "free_mib": 81559 - 71000 - 529,
                               "reserved_mib": 529, "source": "nvmlDeviceGetMemoryInfo_v2"}
    # usedGpuMemory None (NVML_VALUE_NOT_AVAILABLE) stays None; MPS NotSupported is skipped, not an error.
    assert first["processes"] == [{"pid": 4242, "used_mib": 70000, "type": "compute"},
                                  {"pid": 4243, "used_mib": None, "type": "compute"},
                                  {"pid": 4300, "used_mib": 12, "type": "graphics"}]
    assert first["error"] is None
    assert (second["index"], second["minor"], second["processes"]) == (1, 2, [])
    json.dumps(reading)  # plain data: it crosses the worker pipe as JSON


def test_read_driver_already_initialized_does_not_init_again():
    fake = FakeNvml(two_gpus())
    assert _nvml.read_driver(fake, initialized=True)["available"] is True
    assert fake.init_calls == 0


@pytest.mark.parametrize("v2_error", [pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED,
                                      pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH])
def test_memory_falls_back_to_v1_without_reserved(v2_error):
    fake = FakeNvml([FakeGpu(0, "GPU-aaaa", used_mib=100, reserved_mib=900, memory_v2=v2_error)])
    gpu = _nvml.read_gpu(fake, 0)
    assert gpu["error"] is None
    assert gpu["memory"] == {"total_mib": 81559, "used_mib": 1000, "free_mib": 81559 - 1000, "reserved_mib": None,
                             "source": "nvmlDeviceGetMemoryInfo"}


def test_memory_error_other_than_missing_v2_is_the_gpus_error():
    fake = FakeNvml([FakeGpu(0, "GPU-aaaa", memory_v2=pynvml.NVML_ERROR_GPU_IS_LOST)])
    gpu = _nvml.read_gpu(fake, 0)
    assert gpu["memory"] is None
    assert gpu["error"] == "GPU is lost"


def test_process_list_retried_when_it_grows_mid_call():
    gpu = FakeGpu(0, "GPU-aaaa", compute=[(4242, 10 * MIB)])
    gpu.insufficient_size = 2
    reading = _nvml.read_gpu(FakeNvml([gpu]), 0)
    assert reading["error"] is None
    assert reading["processes"] == [{"pid": 4242, "used_mib": 10, "type": "compute"}]


def test_process_list_that_keeps_growing_gives_up_with_the_error():
    gpu = FakeGpu(0, "GPU-aaaa", compute=[(4242, 10 * MIB)])
    gpu.insufficient_size = 100
    reading = _nvml.read_gpu(FakeNvml([gpu]), 0)
    assert reading["error"] == "Insufficient Size"
    assert reading["processes"] == []


def test_lost_gpu_is_an_error_of_that_gpu_only():
    gpus = two_gpus()
    gpus[0].lost = True
    reading = _nvml.read_driver(FakeNvml(gpus))
    assert reading["available"] is True
    assert reading["gpus"][0]["error"] == "GPU is lost"
    assert reading["gpus"][0]["minor"] is None and reading["gpus"][0]["memory"] is None
    assert reading["gpus"][1]["error"] is None and reading["gpus"][1]["minor"] == 2


@pytest.mark.parametrize("code, name", [(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVMLError_LibraryNotFound"),
                                        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVMLError_DriverNotLoaded")])
def test_library_or_driver_missing_gives_available_false(code, name):
    reading = _nvml.read_driver(FakeNvml(two_gpus(), init_error=code))
    assert reading["available"] is False
    assert reading["error"].startswith(name + ": ")
    assert reading["gpus"] == [] and reading["driver_version"] is None


def gone(pid):
    """True when `pid` (our child) has been reaped and no longer exists."""
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.ESRCH
    return False


def test_driver_query_reuses_one_worker():
    fake = FakeNvml(two_gpus())
    query = _nvml.DriverQuery(fake)
    try:
        first = query.read(timeout=5)
        pid = query.pid
        assert pid is not None and pid != os.getpid()
        second = query.read(timeout=5)
        assert query.pid == pid
        assert first == second == json.loads(json.dumps(_nvml.read_driver(FakeNvml(two_gpus()))))
    finally:
        query.close()
    assert query.pid is None
    assert gone(pid)


def test_driver_query_timeout_kills_and_reaps_the_worker_and_stays_failed():
    query = _nvml.DriverQuery(FakeNvml(two_gpus(), count_delay=30))
    query._start()  # pylint: disable=protected-access
    pid = query.pid
    started = time.monotonic()
    with pytest.raises(_nvml.NvmlTimeout, match="did not return within 0.5 s"):
        query.read(timeout=0.5)
    assert time.monotonic() - started < 1.5
    assert query.timed_out == "an NVML call did not return within 0.5 s (driver hung?)" and query.pid is None
    assert gone(pid)
    started = time.monotonic()
    with pytest.raises(_nvml.NvmlTimeout, match=r"did not return within 0.5 s .*not asked again"):
        query.read(timeout=5)
    assert time.monotonic() - started < 0.1
    query.close()  # harmless after the worker is gone


def test_driver_query_worker_that_dies_is_reported():
    class Crashing(FakeNvml):
        def nvmlDeviceGetCount(self):
            raise RuntimeError("not an NVML error: the worker exits")

    query = _nvml.DriverQuery(Crashing(two_gpus()))
    query._start()  # pylint: disable=protected-access
    pid = query.pid
    with pytest.raises(_nvml.NvmlTimeout, match="exited unexpectedly"):
        query.read(timeout=5)
    assert gone(pid)
