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

import json
import os
import select
import signal
import time

MIB = 1 << 20
# NVML_ERROR_INSUFFICIENT_SIZE: the process list grew between pynvml's count probe and its read.
_NVML_ERROR_INSUFFICIENT_SIZE = 7
_LIST_RETRIES = 5


class NvmlTimeout(Exception):
    """An NVML query did not answer within its deadline (the worker was killed)."""


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _process_list(pynvml, function, handle):
    """Call one of the *RunningProcesses functions, retrying when the list grows mid-call."""
    for attempt in range(_LIST_RETRIES):
        try:
            return function(handle)
        except pynvml.NVMLError as exc:
            if exc.value != _NVML_ERROR_INSUFFICIENT_SIZE or attempt == _LIST_RETRIES - 1:
                raise
    return []


def _memory(pynvml, handle):
    """Memory of one GPU in MiB: NVML memory info v2 (reserved separate), v1 where v2 is missing."""
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        return {"total_mib": info.total // MIB, "used_mib": info.used // MIB, "free_mib": info.free // MIB,
                "reserved_mib": info.reserved // MIB, "source": "nvmlDeviceGetMemoryInfo_v2"}
    # A driver without nvmlDeviceGetMemoryInfo_v2 (FunctionNotFound), or one that does not know the v2 struct
    # version (ArgumentVersionMismatch).
    except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported, pynvml.NVMLError_ArgumentVersionMismatch):
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        # v1 `used` includes reserved memory; v1 cannot tell them apart.
        return {"total_mib": info.total // MIB, "used_mib": info.used // MIB, "free_mib": info.free // MIB,
                "reserved_mib": None, "source": "nvmlDeviceGetMemoryInfo"}


def _optional(call, *args):
    try:
        return _text(call(*args))
    except Exception:  # pylint: disable=broad-except
        return None


def read_gpu(pynvml, index):
    """Everything NVML says about GPU `index`, as plain data.

    Returns {"index", "minor", "uuid", "name", "pci_bus_id", "memory": {total_mib, used_mib, free_mib,
    reserved_mib, source}, "processes": [{"pid", "used_mib" (None when NVML reports it as not available),
    "type" (compute, graphics or mps)}], "error" (None, or the NVML error text, e.g. a lost GPU)}.
    """
    gpu = {"index": index, "minor": None, "uuid": None, "name": None, "pci_bus_id": None,
           "memory": None, "processes": [], "error": None}
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        gpu["minor"] = pynvml.nvmlDeviceGetMinorNumber(handle)
        gpu["uuid"] = _text(pynvml.nvmlDeviceGetUUID(handle))
        gpu["name"] = _text(pynvml.nvmlDeviceGetName(handle))
        gpu["pci_bus_id"] = _optional(lambda h: pynvml.nvmlDeviceGetPciInfo(h).busId, handle)
        gpu["memory"] = _memory(pynvml, handle)
        for kind, function in (("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
                               ("graphics", pynvml.nvmlDeviceGetGraphicsRunningProcesses),
                               ("mps", pynvml.nvmlDeviceGetMPSComputeRunningProcesses)):
            try:
                processes = _process_list(pynvml, function, handle)
            except pynvml.NVMLError_NotSupported:
                continue
            for proc in processes:
                used = proc.usedGpuMemory
                gpu["processes"].append({"pid": proc.pid, "used_mib": None if used is None else used // MIB, "type": kind})
    except _errors(pynvml) as exc:
        gpu["error"] = str(exc)
    return gpu


def _errors(pynvml):
    """Exceptions that mean "the driver said no": NVML errors, and pynvml's NVMLLibraryMismatchError
    (a driver library without the _v3 process-list functions; not an NVMLError subclass)."""
    return (pynvml.NVMLError,) + tuple(
        cls for cls in (getattr(pynvml, "NVMLLibraryMismatchError", None),) if isinstance(cls, type))


def read_driver(pynvml, initialized=False):
    """One full NVML reading (run inside the worker): versions and every GPU.

    Returns {"available": bool, "error": str or None, "driver_version", "nvml_version",
    "cuda_driver_version", "gpus": [read_gpu(...)]}. A missing library or driver gives
    available=False with the NVML error text; it never raises NVMLError.
    """
    reading = {"available": False, "error": None, "driver_version": None, "nvml_version": None,
               "cuda_driver_version": None, "gpus": []}
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
    reading["gpus"] = [read_gpu(pynvml, index) for index in range(count)]
    return reading


def _worker(pynvml, requests, replies):
    """Worker loop: one JSON reading per request line, until the request pipe closes."""
    initialized = False
    with os.fdopen(requests, "rb", 0) as req, os.fdopen(replies, "wb", 0) as rep:
        while req.readline():
            reading = read_driver(pynvml, initialized)
            initialized = initialized or reading["available"]
            rep.write(json.dumps(reading).encode("utf-8") + b"\n")


class DriverQuery:
    """NVML readings from a forked worker process, each bounded by a deadline.

    Usage: q = DriverQuery(pynvml); q.read(timeout=10) -> read_driver() dict; q.close().
    `pid` is the worker's PID (exclude it from holder scans: it holds the device files
    while NVML is initialized). After an NvmlTimeout the worker is gone and later reads
    raise NvmlTimeout at once: a wedged driver does not recover within one module run.
    """

    def __init__(self, pynvml):
        self._pynvml = pynvml
        self.pid = None
        self._req = self._rep = None
        self._buffer = b""
        self.timed_out = None  # the first failure's text, once NVML stopped answering

    def _start(self):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            status = 0
            try:
                os.close(req_w)
                os.close(rep_r)
                # Let go of the module's stdio: a worker stuck in the driver must not keep the
                # pipe to Ansible open after the module has gone.
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                _worker(self._pynvml, req_r, rep_w)
            except BaseException:  # pylint: disable=broad-except
                status = 1
            os._exit(status)  # never run the parent's atexit handlers in the fork
        os.close(req_r)
        os.close(rep_w)
        self.pid, self._req, self._rep = pid, req_w, rep_r

    def read(self, timeout):
        """One reading (see read_driver), or NvmlTimeout after `timeout` seconds."""
        if self.timed_out:
            raise NvmlTimeout("%s; not asked again in this run" % self.timed_out)
        if self.pid is None:
            self._start()
        deadline = time.monotonic() + timeout
        try:
            os.write(self._req, b"r\n")
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._rep], [], [], left)[0]:
                    raise NvmlTimeout("an NVML call did not return within %.1f s (driver hung?)" % timeout)
                chunk = os.read(self._rep, 65536)
                if not chunk:
                    raise NvmlTimeout("the NVML worker exited unexpectedly")
                self._buffer += chunk
        except (NvmlTimeout, OSError) as exc:
            self.close()
            if not isinstance(exc, NvmlTimeout):
                exc = NvmlTimeout("the NVML worker failed: %s" % exc)
            self.timed_out = str(exc)
            raise exc
        line, _newline, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line.decode("utf-8"))

    def close(self):
        """End the worker (SIGKILL if it does not leave at once, e.g. stuck in a driver call)."""
        if self.pid is None:
            return
        for fd in (self._req, self._rep):
            try:
                os.close(fd)
            except OSError:
                pass
        pid, self.pid = self.pid, None
        for _attempt in range(20):
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                return
            time.sleep(0.005)
        try:
            os.kill(pid, signal.SIGKILL)  # our own forked child
        except OSError:
            pass
        os.waitpid(pid, 0)
