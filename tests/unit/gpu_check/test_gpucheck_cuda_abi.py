"""tests/gpu/workload.py's calls into libcuda.so.1 through ctypes, checked against a stand-in library built from
cuda.h's declarations (no GPU here): CUDA IPC (the 64-byte CUipcMemHandle returned through a pointer, then passed
by value), cuMemHostAlloc for pinned memory, the primary context. A wrong ctypes signature shows as a wrong handle
or argument in the stand-in, which then fails the call."""

import os
import shutil
import subprocess

import pytest

from gpucheck.workloads import WorkloadError, Workloads

MIB = 1 << 20
# Signatures as cuda.h (CUDA 13.0) declares them; every call is written to $MOCK_CUDA_LOG.
MOCK_LIBCUDA = r"""
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
typedef int CUresult;
typedef uint64_t CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;
#define CONTEXT ((void *)0x1234)
#define EXPORTED ((CUdeviceptr)0x7f0000200000ULL)
static void note(const char *format, ...) {
    const char *path = getenv("MOCK_CUDA_LOG");
    FILE *log = path ? fopen(path, "a") : NULL;
    if (!log) return;
    va_list args;
    va_start(args, format);
    vfprintf(log, format, args);
    va_end(args);
    fputc('\n', log);
    fclose(log);
}
static char pattern(int i) { return (char)(i * 7 + 3); }
CUresult cuInit(unsigned int flags) { note("cuInit %u", flags); return 0; }
CUresult cuDriverGetVersion(int *version) { *version = 13000; return 0; }
CUresult cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
CUresult cuDeviceGetCount(int *count) { *count = 1; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **context, int device) { *context = CONTEXT; return device == 0 ? 0 : 101; }
CUresult cuCtxSetCurrent(void *context) { return context == CONTEXT ? 0 : 201; }
CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes) {
    *pointer = EXPORTED;
    note("cuMemAlloc_v2 %zu", bytes);
    return 0;
}
CUresult cuMemHostAlloc(void **pointer, size_t bytes, unsigned int flags) {
    *pointer = malloc(16);
    note("cuMemHostAlloc %zu %u", bytes, flags);
    return 0;
}
CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr pointer) {
    if (pointer != EXPORTED) return 1;
    for (int i = 0; i < 64; i++) handle->reserved[i] = pattern(i);
    note("cuIpcGetMemHandle %llx", (unsigned long long)pointer);
    return 0;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pointer, CUipcMemHandle handle, unsigned int flags) {
    for (int i = 0; i < 64; i++)
        if (handle.reserved[i] != pattern(i)) return 400;
    *pointer = 0x7e0000000000ULL;
    note("cuIpcOpenMemHandle_v2 %u", flags);
    return flags == 1 ? 0 : 1;
}
CUresult cuGetErrorName(CUresult error, const char **name) { *name = "CUDA_ERROR_STAND_IN"; return 0; }
"""


@pytest.fixture
def mock_cuda(tmp_path, monkeypatch):
    """A stand-in libcuda.so.1 on LD_LIBRARY_PATH; returns the path of its call log."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in libcuda.so.1")
    source, library = tmp_path / "mockcuda.c", tmp_path / "lib" / "libcuda.so.1"
    source.write_text(MOCK_LIBCUDA)
    library.parent.mkdir()
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True, timeout=120)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(library.parent))
    log = tmp_path / "calls.log"
    monkeypatch.setenv("MOCK_CUDA_LOG", str(log))
    return log


@pytest.fixture
def workloads(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    made = Workloads(str(run_dir), "gpucheck-abi-%d" % os.getpid(), "cuda", 0, "GPU-test", max_lifetime=60)
    yield made
    assert made.stop_all() == []


def test_an_ipc_handle_goes_from_exporter_to_importer_by_value(mock_cuda, workloads):
    exporter = workloads.wait_ready(["exp"], workloads.start("exp", role="ipc_export", nbytes=64 * MIB), 60)["exp"]
    assert exporter["ipc_handle"] == bytes((i * 7 + 3) % 256 for i in range(64)).hex()
    assert exporter["bytes"] == 64 * MIB and exporter["backend_details"]["ipc"] == "cuIpcGetMemHandle"
    launcher = workloads.start("imp", role="ipc_import", ipc_handle=exporter["ipc_handle"])
    importer = workloads.wait_ready(["imp"], launcher, 60)["imp"]
    assert importer["backend_details"] == {"cuda_driver_api_version": 13000, "ipc": "cuIpcOpenMemHandle_v2"}
    calls = mock_cuda.read_text().splitlines()
    assert "cuMemAlloc_v2 %d" % (64 * MIB) in calls and "cuIpcGetMemHandle 7f0000200000" in calls
    assert "cuIpcOpenMemHandle_v2 1" in calls  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS


def test_a_garbled_handle_is_refused_with_the_drivers_error(mock_cuda, workloads):
    launcher = workloads.start("imp", role="ipc_import", ipc_handle="00" * 64)
    with pytest.raises(WorkloadError, match=r"cuIpcOpenMemHandle_v2 failed: CUDA_ERROR_STAND_IN \(400\)"):
        workloads.wait_ready(["imp"], launcher, 60)
    with pytest.raises(WorkloadError, match="the 64-byte handle in hex, got 3 bytes"):
        workloads.wait_ready(["short"], workloads.start("short", role="ipc_import", ipc_handle="abcdef"), 60)


def test_pinned_host_memory_beside_device_memory(mock_cuda, workloads):
    info = workloads.wait_ready(["pinned"], workloads.start("pinned", nbytes=MIB, pinned_bytes=3 * MIB), 60)["pinned"]
    assert info["pinned_bytes"] == 3 * MIB and info["bytes"] == MIB
    calls = mock_cuda.read_text().splitlines()
    assert calls == ["cuInit 0", "cuMemAlloc_v2 %d" % MIB, "cuMemHostAlloc %d 0" % (3 * MIB)]
