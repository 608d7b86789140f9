# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_nvml against a fake pynvml: same functions and the real pynvml exception classes, no driver behind it."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import time
import types

import importlib.metadata
import re
from pathlib import Path

import pynvml
import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _nvml

MIB = 1 << 20


def nvml_error(code):
    """An NVMLError of the subclass pynvml itself would raise for `code` (e.g. NVMLError_GpuIsLost for 15)."""
    return pynvml.NVMLError(code)


NO_ID = 0xFFFFFFFF


class FakeGpu:
    """A GPU, or (parent set) a MIG device. List entries: (pid, bytes or None[, gi, ci])."""

    def __init__(
        self,
        minor,
        uuid,
        name="NVIDIA H100 80GB HBM3",
        bus="00000000:18:00.0",
        total_mib=81559,
        used_mib=1000,
        reserved_mib=529,
        compute=(),
        graphics=(),
        mps=None,
        lost=False,
        memory_v2=True,
        mig_mode=None,
        migs=(),
        privileged=True,
        gi=None,
        ci=None,
    ):
        self.minor, self.uuid, self.name, self.bus = minor, uuid, name, bus
        self.total_mib, self.used_mib, self.reserved_mib = total_mib, used_mib, reserved_mib
        self.lists = {"compute": list(compute), "graphics": list(graphics), "mps": mps}
        self.lost, self.memory_v2 = lost, memory_v2
        self.insufficient_size = 0  # how many list calls answer NVML_ERROR_INSUFFICIENT_SIZE first
        self.mig_mode, self.migs, self.privileged = mig_mode, list(migs), privileged  # mig_mode: None = NotSupported
        self.gi, self.ci, self.parent = gi, ci, None
        for mig in self.migs:
            mig.parent = self

    def aggregate_refused(self):
        return self.mig_mode is not None and self.mig_mode[0] == 1 and not self.privileged


class FakeNvml:
    """Just enough of pynvml for read_driver/read_gpu. Errors are pynvml's own classes."""

    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_ArgumentVersionMismatch = pynvml.NVMLError_ArgumentVersionMismatch
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError

    def __init__(self, gpus, init_error=None, count_delay=0.0, symbols=("v3", "v2", "v1")):
        self.gpus = gpus
        self.init_error = init_error
        self.count_delay = count_delay
        self.init_calls = 0
        self.symbols = symbols  # which process-list symbol versions the "driver library" has
        self.raw_calls = []

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
        if gpu.aggregate_refused():
            raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        if version is None:  # v1: used includes reserved
            return types.SimpleNamespace(
                total=gpu.total_mib * MIB,
                used=(gpu.used_mib + gpu.reserved_mib) * MIB,
                free=(gpu.total_mib - gpu.used_mib - gpu.reserved_mib) * MIB,
            )
        assert version == pynvml.nvmlMemory_v2
        if gpu.memory_v2 is not True:
            raise nvml_error(gpu.memory_v2)
        return types.SimpleNamespace(
            total=gpu.total_mib * MIB,
            used=gpu.used_mib * MIB,
            reserved=gpu.reserved_mib * MIB,
            free=(gpu.total_mib - gpu.used_mib - gpu.reserved_mib) * MIB,
        )

    def _entries(self, kind, gpu):
        if gpu.aggregate_refused():
            raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        if gpu.lists[kind] is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu.insufficient_size:
            gpu.insufficient_size -= 1
            raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        return [tuple(item) + (NO_ID, NO_ID)[len(item) - 2 :] for item in gpu.lists[kind]]

    def _list(self, kind, gpu):
        if "v3" not in self.symbols:  # what pynvml 13.x raises for a missing _v3 symbol
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")
        return [
            types.SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=gi, computeInstanceId=ci)
            for pid, used, gi, ci in self._entries(kind, gpu)
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, gpu):
        return self._list("compute", gpu)

    def nvmlDeviceGetGraphicsRunningProcesses(self, gpu):
        return self._list("graphics", gpu)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, gpu):
        return self._list("mps", gpu)

    def _nvmlGetFunctionPointer(self, name):
        """The C calling convention of the older list symbols: fn(handle, byref(c_uint count), array or None)."""
        version = "v2" if name.endswith("_v2") else "v1"
        if version not in self.symbols or name.endswith("_v3"):
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        kind = "compute" if "Compute" in name and "MPS" not in name else "graphics" if "Graphics" in name else "mps"

        def function(gpu, count_ref, array):
            self.raw_calls.append(name)
            try:
                entries = self._entries(kind, gpu)
            except pynvml.NVMLError as exc:
                return exc.value
            count = count_ref._obj  # pylint: disable=protected-access
            if array is None or count.value < len(entries):
                count.value = len(entries)
                return 0 if not entries else pynvml.NVML_ERROR_INSUFFICIENT_SIZE
            expected = 24 if version == "v2" else 16
            assert ctypes.sizeof(array) // len(array) == expected, "wrong struct for " + name
            for slot, (pid, used, gi, ci) in zip(array, entries):
                slot.pid, slot.usedGpuMemory = pid, (1 << 64) - 1 if used is None else used
                if version == "v2":
                    slot.gpuInstanceId, slot.computeInstanceId = gi, ci
            count.value = len(entries)
            return 0

        return function

    # MIG (a MIG device is a FakeGpu whose parent is set)
    def nvmlDeviceGetMigMode(self, gpu):
        if gpu.parent is not None or gpu.mig_mode is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(gpu.mig_mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu):
        return 7 if gpu.mig_mode and gpu.mig_mode[0] == 1 else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu, index):
        if index >= len(gpu.migs):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return gpu.migs[index]

    def nvmlDeviceGetGpuInstanceId(self, mig):
        return mig.gi

    def nvmlDeviceGetComputeInstanceId(self, mig):
        return mig.ci


def proc(pid, used_mib, kind, gi=None, ci=None):
    return {"pid": pid, "used_mib": used_mib, "type": kind, "gpu_instance_id": gi, "compute_instance_id": ci}


def two_gpus():
    return [
        FakeGpu(
            5, "GPU-aaaa", compute=[(4242, 70000 * MIB), (4243, None)], graphics=[(4300, 12 * MIB)], used_mib=71000
        ),
        FakeGpu(2, "GPU-bbbb", bus="00000000:2A:00.0", used_mib=0),
    ]


def test_read_driver_full_reading_with_v2_memory():
    fake = FakeNvml(two_gpus())
    reading = _nvml.read_driver(fake)
    assert fake.init_calls == 1
    assert reading["available"] is True and reading["error"] is None
    assert (reading["driver_version"], reading["nvml_version"], reading["cuda_driver_version"]) == (
        "580.95.05",
        "13.580.95.05",
        13000,
    )
    first, second = reading["gpus"]
    assert (first["index"], first["minor"], first["uuid"], first["name"], first["pci_bus_id"]) == (
        0,
        5,
        "GPU-aaaa",
        "NVIDIA H100 80GB HBM3",
        "00000000:18:00.0",
    )
    assert first["memory"] == {
        "total_mib": 81559,
        "used_mib": 71000,
        "free_mib": 81559 - 71000 - 529,
        "reserved_mib": 529,
        "source": "nvmlDeviceGetMemoryInfo_v2",
        "used_includes_reserved": False,
        "used_excluding_reserved_mib": 71000,
    }
    # usedGpuMemory None (NVML_VALUE_NOT_AVAILABLE) stays None; MPS NotSupported is skipped, not an error.
    assert first["processes"] == [proc(4242, 70000, "compute"), proc(4243, None, "compute"), proc(4300, 12, "graphics")]
    assert (first["process_list_version"], first["processes_error"]) == ("v3", None)
    assert (first["mig_mode"], first["mig_devices"]) == (None, [])
    assert first["error"] is None
    assert (second["index"], second["minor"], second["processes"]) == (1, 2, [])
    json.dumps(reading)  # plain data: it crosses the worker pipe as JSON


def test_read_driver_already_initialized_does_not_init_again():
    fake = FakeNvml(two_gpus())
    assert _nvml.read_driver(fake, initialized=True)["available"] is True
    assert fake.init_calls == 0


@pytest.mark.parametrize(
    "v2_error",
    [
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    ],
)
def test_memory_falls_back_to_v1_without_reserved(v2_error):
    fake = FakeNvml([FakeGpu(0, "GPU-aaaa", used_mib=100, reserved_mib=900, memory_v2=v2_error)])
    gpu = _nvml.read_gpu(fake, 0)
    assert gpu["error"] is None
    assert gpu["memory"] == {
        "total_mib": 81559,
        "used_mib": 1000,
        "free_mib": 81559 - 1000,
        "reserved_mib": None,
        "source": "nvmlDeviceGetMemoryInfo",
        "used_includes_reserved": True,
        "used_excluding_reserved_mib": None,
    }


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
    assert reading["processes"] == [proc(4242, 10, "compute")]


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


@pytest.mark.parametrize(
    "code, name",
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVMLError_LibraryNotFound"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVMLError_DriverNotLoaded"),
    ],
)
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
    started = time.monotonic()
    with pytest.raises(_nvml.NvmlWorkerError, match="Python error: RuntimeError: not an NVML error"):
        query.read(timeout=5)
    assert time.monotonic() - started < 2  # at once: not waited for as a hung driver
    assert gone(pid) and query.timed_out is None
    with pytest.raises(_nvml.NvmlWorkerError, match="Python error"):
        query.read(timeout=5)


def test_driver_query_worker_that_exits_on_its_own_is_a_worker_error_not_a_hang():
    class Exiting(FakeNvml):
        def nvmlDeviceGetCount(self):
            os._exit(3)

    query = _nvml.DriverQuery(Exiting(two_gpus()))
    with pytest.raises(_nvml.NvmlWorkerError, match="exited unexpectedly"):
        query.read(timeout=5)
    assert query.timed_out is None


def test_driver_query_leaves_behind_a_worker_that_cannot_be_reaped_in_time(monkeypatch):
    """A worker stuck in the driver sleeps in state D, where SIGKILL does nothing until the call returns. Modelled by a
    SIGKILL that does not arrive: close() gives up after KILLED_EXIT_S, reports the worker, and the read says so."""
    query = _nvml.DriverQuery(FakeNvml(two_gpus(), count_delay=60))
    query._start()  # pylint: disable=protected-access
    pid = query.pid
    monkeypatch.setattr(_nvml, "KILLED_EXIT_S", 0.3)
    real_kill = os.kill
    monkeypatch.setattr(os, "kill", lambda target, sig: None if target == pid else real_kill(target, sig))
    started = time.monotonic()
    try:
        with pytest.raises(_nvml.NvmlTimeout, match=r"PID %d\) did not end within 0.3 s of SIGKILL" % pid):
            query.read(timeout=0.3)
        assert time.monotonic() - started < 1.5 and query.left_behind == [pid] and query.pid is None
    finally:
        real_kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


# ---- process-list versions: _v3 -> _v2 -> v1 ------------------------------------------------------


@pytest.mark.parametrize("symbols, version", [(("v2", "v1"), "v2"), (("v1",), "v1")])
def test_process_lists_fall_back_when_v3_symbols_are_missing(symbols, version):
    fake = FakeNvml(two_gpus(), symbols=symbols)
    reading = _nvml.read_driver(fake)
    first, second = reading["gpus"]
    assert first["error"] is None and second["error"] is None
    assert first["processes"] == [proc(4242, 70000, "compute"), proc(4243, None, "compute"), proc(4300, 12, "graphics")]
    assert (first["process_list_version"], second["process_list_version"]) == (version, version)
    called = {name.rsplit("_v", 1)[0] if name.endswith("_v2") else name for name in fake.raw_calls}
    assert called == {
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetMPSComputeRunningProcesses",
    }
    assert all(name.endswith("_v2") == (version == "v2") for name in fake.raw_calls)


def test_v2_entries_keep_instance_ids_and_not_available_memory():
    gpu = FakeGpu(0, "GPU-aaaa", compute=[(7, 100 * MIB, 3, 0), (8, None)])
    reading = _nvml.read_gpu(FakeNvml([gpu], symbols=("v2", "v1")), 0)
    assert reading["processes"] == [proc(7, 100, "compute", 3, 0), proc(8, None, "compute")]


def test_no_process_list_symbol_at_all_is_the_gpus_error():
    reading = _nvml.read_gpu(FakeNvml(two_gpus(), symbols=()), 0)
    assert reading["error"] == "Function Not Found"


def test_process_struct_of_pinned_pynvml_is_24_bytes():
    """nvidia-ml-py 12.535.77 declared 32 bytes (usedGpuCcProtectedMemory) for the 24-byte _v3 entries."""
    assert ctypes.sizeof(pynvml.c_nvmlProcessInfo_t) == 24
    assert ctypes.sizeof(_nvml._ProcessInfoV2) == 24 and ctypes.sizeof(_nvml._ProcessInfoV1) == 16  # pylint: disable=protected-access


def _version(text):
    return tuple(int(part) for part in text.split("."))


def test_nvidia_ml_py_floor_is_declared_everywhere_and_installed():
    root = Path(__file__).resolve().parents[4]
    floors = set()
    for path in ("requirements.txt", "execution-environment.yml", "meta/execution-environment.yml"):
        if (root / path).exists():
            floors.update(re.findall(r"nvidia-ml-py\s*>=\s*([0-9.]+)", (root / path).read_text()))
    assert floors == {"12.535.108"}
    installed = importlib.metadata.version("nvidia-ml-py")
    assert _version(installed) >= _version("12.535.108")


# ---- MIG ---------------------------------------------------------------------------------------


def mig_gpu(privileged=True):
    migs = [
        FakeGpu(
            None,
            "MIG-1111",
            name="NVIDIA H100 80GB HBM3 MIG 3g.40gb",
            total_mib=40448,
            used_mib=5000,
            reserved_mib=0,
            compute=[(501, 5000 * MIB, 2, 0)],
            gi=2,
            ci=0,
        ),
        FakeGpu(
            None,
            "MIG-2222",
            name="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
            total_mib=9984,
            used_mib=0,
            reserved_mib=0,
            compute=[],
            gi=7,
            ci=0,
        ),
    ]
    return FakeGpu(
        0,
        "GPU-aaaa",
        used_mib=5000,
        compute=[(501, 5000 * MIB, 2, 0)],
        mig_mode=(1, 1),
        migs=migs,
        privileged=privileged,
    )


def test_mig_facts_and_instance_ids_privileged():
    gpu = _nvml.read_gpu(FakeNvml([mig_gpu()]), 0)
    assert gpu["error"] is None and gpu["processes_error"] is None
    assert gpu["mig_mode"] == {"current": True, "pending": True}
    assert gpu["memory"]["source"] == "nvmlDeviceGetMemoryInfo_v2"
    assert gpu["processes"] == [proc(501, 5000, "compute", 2, 0)]
    assert gpu["mig_devices"] == [
        {
            "index": 0,
            "uuid": "MIG-1111",
            "gpu_instance_id": 2,
            "compute_instance_id": 0,
            "name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
            "profile": "3g.40gb",
            "memory_total_mib": 40448,
            "memory_used_mib": 5000,
            "memory_free_mib": 40448 - 5000,
            "memory_source": "nvmlDeviceGetMemoryInfo_v2",
        },
        {
            "index": 1,
            "uuid": "MIG-2222",
            "gpu_instance_id": 7,
            "compute_instance_id": 0,
            "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
            "profile": "1g.10gb",
            "memory_total_mib": 9984,
            "memory_used_mib": 0,
            "memory_free_mib": 9984,
            "memory_source": "nvmlDeviceGetMemoryInfo_v2",
        },
    ]
    json.dumps(gpu)


def test_mig_without_privilege_is_said_per_gpu_not_a_gpu_error():
    gpu = _nvml.read_gpu(FakeNvml([mig_gpu(privileged=False)]), 0)
    assert gpu["error"] is None
    assert "Insufficient Permissions" in gpu["processes_error"] and "per-MIG-device" in gpu["processes_error"]
    assert gpu["processes"] == [proc(501, 5000, "compute", 2, 0)]  # from the MIG device handles
    assert gpu["memory"] == {
        "total_mib": 40448 + 9984,
        "used_mib": 5000,
        "free_mib": 40448 + 9984 - 5000,
        "reserved_mib": None,
        "source": "mig_devices",
        "used_includes_reserved": False,
        "used_excluding_reserved_mib": 5000,
    }


def test_mig_pending_only_lists_no_devices():
    gpu = FakeGpu(0, "GPU-aaaa", mig_mode=(0, 1))
    reading = _nvml.read_gpu(FakeNvml([gpu]), 0)
    assert reading["mig_mode"] == {"current": False, "pending": True} and reading["mig_devices"] == []


@pytest.mark.parametrize("with_pidfd", [True, False], ids=["pidfd", "waitpid polls"])
def test_exited_within_reaps_a_worker_that_leaves_and_gives_up_on_one_that_stays(monkeypatch, with_pidfd):
    if not with_pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    leaving = os.fork()
    if leaving == 0:
        os._exit(0)
    assert _nvml._exited_within(leaving, 5)  # pylint: disable=protected-access
    assert gone(leaving)  # reaped: no zombie left behind
    staying = os.fork()
    if staying == 0:
        time.sleep(30)
        os._exit(0)
    try:
        started = time.monotonic()
        assert not _nvml._exited_within(staying, 0.2)  # pylint: disable=protected-access
        assert 0.2 <= time.monotonic() - started < 2
        assert os.waitpid(staying, os.WNOHANG) == (0, 0)  # still running, not reaped
    finally:
        os.kill(staying, signal.SIGKILL)  # our own forked child
        os.waitpid(staying, 0)


def test_slow_first_init_has_its_own_deadline_and_is_not_a_hang(monkeypatch):
    """Persistence mode off: the first nvmlInit initializes every GPU (seconds). It gets INIT_TIMEOUT_S; the reading
    after it gets the caller's timeout; an init past its own deadline is reported as such."""

    class SlowInit(FakeNvml):
        init_seconds = 1.0

        def nvmlInit(self):
            time.sleep(self.init_seconds)
            return super().nvmlInit()

    monkeypatch.setattr(_nvml, "INIT_TIMEOUT_S", 5.0)
    query = _nvml.DriverQuery(SlowInit(two_gpus()))
    try:
        started = time.monotonic()
        reading = query.read(timeout=0.3)
        assert reading["available"] is True and time.monotonic() - started >= 1.0
        started = time.monotonic()
        assert query.read(timeout=0.3)["available"] is True and time.monotonic() - started < 0.3
    finally:
        query.close()
    monkeypatch.setattr(_nvml, "INIT_TIMEOUT_S", 0.4)
    SlowInit.init_seconds = 5.0
    query = _nvml.DriverQuery(SlowInit(two_gpus()))
    with pytest.raises(_nvml.NvmlTimeout, match="nvmlInit did not return within 0.4 s"):
        query.read(timeout=0.2)
