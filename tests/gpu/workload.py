# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A process that the GPU check (check.py) starts: it holds GPU memory the way vLLM's processes do.

    python3 workload.py --name NAME --run-dir DIR --marker MARKER --backend torch|cuda|sim
                        [--role hold|engine|api|nvml|cuinit|available|ipc_export|ipc_import] [--bytes N]
                        [--pinned-bytes N] [--ipc-handle HEX] [--title TITLE] [--ignore-sigterm]
                        [--fork-child] [--tp K] [--gpu-index I] [--lifeline-fd FD] [--max-lifetime S]

Roles:
- hold: allocate N bytes of device memory (a CUDA context plus cuMemAlloc, or a torch tensor),
  then wait. --fork-child: after allocating, fork a child that only inherits the device handles
  (it never calls CUDA); the child reports as NAME.child. --pinned-bytes: also allocate that much
  page-locked host memory (torch `pin_memory=True`, else cuMemHostAlloc).
- engine: like vLLM's EngineCore with TP=K > 1: starts K `hold` workers titled
  VLLM::Worker_TP0..K-1 (reporting as NAME.tp0..), holds no GPU itself.
- api: like vLLM's API server: starts an `engine` (reporting as NAME.engine), holds no GPU.
- nvml: an NVML-only client, as a GPU exporter or nvtop: pynvml.nvmlInit() and never nvmlShutdown (any
  backend; on a simulated node the fake libnvidia-ml.so.1 answers).
- cuinit: CUDA initialized without a context: cuInit(0) and cuDeviceGetCount through libcuda.so.1 with
  ctypes (backends torch and cuda).
- available: `torch.cuda.is_available()` (backend torch; it initializes CUDA without a context), else as cuinit.
- ipc_export: a context with N bytes from cuMemAlloc_v2 and a CUDA IPC handle of them (cuIpcGetMemHandle), written
  hex into the ready file as "ipc_handle"; ipc_import: opens --ipc-handle (cuIpcOpenMemHandle_v2) in its own
  context. Both through libcuda.so.1 with ctypes, with backend torch too (no CuPy needed).

On a simulated node (backend sim) a process opens and maps the device files as the real one does on an H200 with
driver 580.159.04 (PLANTS; tests/fixtures/hardware/README.md, table 2) and a context is declared the simulator's
way (tests/sim/README.md, "Creating a CUDA context"). There is no pinned memory and no IPC there.

Every process writes DIR/NAME.json once ready (atomically): {"name", "pid" (getpid(), in its own
PID namespace), "role", "comm", "cmdline", "retitled_with", "bytes", "backend", "backend_details",
"device_files", "error"} (ipc_export also "ipc_handle"); on failure "error" is set and it exits 1.

--title retitles the process as vLLM does, with setproctitle when importable (cmdline and comm;
MARKER is appended to the title so that the check can still match its own processes), else with
prctl(PR_SET_NAME) (comm only, cut to 15 bytes: the cmdline keeps `--marker MARKER`). The kernel's
comm is all that process lookups by name see, so prctl suffices for the check.

The GPU is chosen by the environment for torch and cuda (check.py sets CUDA_VISIBLE_DEVICES to the
GPU's UUID, so CUDA device 0 is that GPU) and by --gpu-index for sim (simulated nodes, contract in
tests/sim/README.md, "Creating a CUDA context").

Lifetime: every process waits on --lifeline-fd, the read end of a pipe whose write end only
check.py holds, and exits when it reaches EOF (check.py is gone) or after --max-lifetime seconds.
SIGTERM ends it (default disposition) unless --ignore-sigterm.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_NAME = 15
COMM_BYTES = 15
ROLES = ("hold", "engine", "api", "nvml", "cuinit", "available", "ipc_export", "ipc_import")
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
MADV_DONTFORK = 10
# What a real process opens and maps, as an H200 with driver 580.159.04 showed it (tests/fixtures/hardware/README.md,
# table 2), planted by the sim backend: fds ((file, count)), mappings ((file, "rw" | "w" | "r", KiB, count,
# not inherited by a fork)). "gpu" is the GPU's /dev/nvidiaN. Every offset is 0 (the driver requires it). A context
# maps its GPU's file read-write and shared (2 MiB) beside a write-only doorbell, nvidiactl read-write many times and
# nvidia-uvm once (VM_DONTCOPY in the UVM driver: a forked child lacks it); cuInit alone maps two doorbells and
# nvidiactl read-only.
PLANTS = {
    "context": (
        (("nvidiactl", 2), ("nvidia-uvm", 4), ("gpu", 20)),
        (
            ("gpu", "rw", 2048, 1, False),
            ("gpu", "w", 64, 1, False),
            ("nvidiactl", "rw", 4, 26, False),
            ("nvidia-uvm", "rw", 2048, 1, True),
        ),
    ),
    "cuinit": (
        (("nvidiactl", 1), ("nvidia-uvm", 2), ("gpu", 3)),
        (("gpu", "w", 64, 2, False), ("nvidiactl", "r", 4, 1, False)),
    ),
}
_PROT = {"rw": mmap.PROT_READ | mmap.PROT_WRITE, "w": mmap.PROT_WRITE, "r": mmap.PROT_READ}
# What keeps this process's GPU memory allocated (tensor, CUDA context and pointer, or sim fds).
HELD = []


class WorkloadError(RuntimeError):
    """The GPU allocation or a child's start failed; the message goes into the ready file."""


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--marker", required=True)
    parser.add_argument("--backend", choices=("torch", "cuda", "sim"), required=True)
    parser.add_argument("--role", choices=ROLES, default="hold")
    parser.add_argument("--bytes", type=int, default=0, dest="nbytes")
    parser.add_argument("--pinned-bytes", type=int, default=0)
    parser.add_argument("--ipc-handle")
    parser.add_argument("--title")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--fork-child", action="store_true")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--gpu-index", type=int, default=0)
    parser.add_argument("--lifeline-fd", type=int)
    parser.add_argument("--max-lifetime", type=float, default=600.0)
    return parser.parse_args(argv)


def retitle(title, marker):
    """Retitle this process; returns "setproctitle", "prctl" or None (title empty)."""
    if not title:
        return None
    try:
        import setproctitle
    except ImportError:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(title.encode()[:COMM_BYTES]), 0, 0, 0)
        return "prctl"
    setproctitle.setproctitle("%s [%s]" % (title, marker))
    return "setproctitle"


def device_files():
    """Sorted distinct /dev/nvidia* paths this process holds open (from /proc/self/fd)."""
    paths = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            paths.add(target)
    return sorted(paths)


def allocate_torch(nbytes, pinned_bytes=0):
    """Allocate `nbytes` on CUDA device 0 with PyTorch (and `pinned_bytes` of page-locked host memory);
    returns (keep-alive object, details)."""
    import torch

    tensor = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    pinned = torch.empty(pinned_bytes, dtype=torch.uint8, pin_memory=True) if pinned_bytes else None
    torch.cuda.synchronize()
    return (tensor, pinned), {"torch": torch.__version__, "torch_cuda": torch.version.cuda}


class IpcHandle(ctypes.Structure):  # pylint: disable=too-few-public-methods
    """CUipcMemHandle (cuda.h): 64 opaque bytes, passed by value to cuIpcOpenMemHandle."""

    _fields_ = [("reserved", ctypes.c_char * 64)]


class CudaDriver:
    """The CUDA driver API through libcuda.so.1 with ctypes. CudaDriver(): call(name, *args) raises WorkloadError
    naming the failing call; context() makes device 0's primary context current and returns the driver's version."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise WorkloadError("cannot load libcuda.so.1: %s" % error) from None

    def call(self, name, *args):
        result = getattr(self.lib, name)(*args)
        if result != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorName(result, ctypes.byref(text))
            raise WorkloadError("%s failed: %s (%d)" % (name, (text.value or b"?").decode(), result))

    def context(self):
        device, context, version = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_int()
        self.call("cuInit", 0)
        self.call("cuDriverGetVersion", ctypes.byref(version))
        self.call("cuDeviceGet", ctypes.byref(device), 0)
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        self.call("cuCtxSetCurrent", context)
        return version.value

    def alloc(self, nbytes):
        pointer = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(nbytes))
        return pointer


def allocate_cuda(nbytes, pinned_bytes=0):
    """Allocate `nbytes` on CUDA device 0 through the CUDA driver API (libcuda.so.1) with ctypes:
    cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain + cuCtxSetCurrent, cuMemAlloc_v2 (and cuMemHostAlloc for
    `pinned_bytes`). Returns (keep-alive tuple, details). Raises WorkloadError naming the failing call."""
    cuda = CudaDriver()
    version = cuda.context()
    pointer = cuda.alloc(nbytes) if nbytes else None
    host = ctypes.c_void_p()
    if pinned_bytes:
        cuda.call("cuMemHostAlloc", ctypes.byref(host), ctypes.c_size_t(pinned_bytes), ctypes.c_uint(0))
    return (cuda, pointer, host), {"cuda_driver_api_version": version}


def export_ipc(nbytes):
    """A context with `nbytes` from cuMemAlloc_v2 and their CUDA IPC handle; returns (keep-alive, details, hex)."""
    cuda = CudaDriver()
    version = cuda.context()
    pointer = cuda.alloc(nbytes)
    handle = IpcHandle()
    cuda.lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(IpcHandle), ctypes.c_uint64]
    cuda.call("cuIpcGetMemHandle", ctypes.byref(handle), pointer.value)
    raw = ctypes.string_at(ctypes.addressof(handle), ctypes.sizeof(handle))
    return (cuda, pointer), {"cuda_driver_api_version": version, "ipc": "cuIpcGetMemHandle"}, raw.hex()


def import_ipc(handle_hex):
    """Open a CUDA IPC handle (hex of its 64 bytes) in this process's own context; returns (keep-alive, details)."""
    raw = bytes.fromhex(handle_hex or "")
    if len(raw) != ctypes.sizeof(IpcHandle):
        raise WorkloadError("--ipc-handle must be the 64-byte handle in hex, got %d bytes" % len(raw))
    cuda = CudaDriver()
    version = cuda.context()
    handle = IpcHandle()
    ctypes.memmove(ctypes.addressof(handle), raw, len(raw))
    name = "cuIpcOpenMemHandle_v2" if hasattr(cuda.lib, "cuIpcOpenMemHandle_v2") else "cuIpcOpenMemHandle"
    getattr(cuda.lib, name).argtypes = [ctypes.POINTER(ctypes.c_uint64), IpcHandle, ctypes.c_uint]
    pointer = ctypes.c_uint64()
    cuda.call(name, ctypes.byref(pointer), handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    return (cuda, pointer), {"cuda_driver_api_version": version, "ipc": name}


def _sim_gpus():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sim"))
    from simvllm.gpu import NodeGpus

    return NodeGpus.load()


def plant(kind, dev_dir, minor):
    """Open and map the device files as a real process of `kind` (PLANTS) does, GPU file /dev/nvidia<minor> under
    `dev_dir`; returns (fds of the GPU's file, everything to keep alive)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    opened, mappings = PLANTS[kind]
    fds = {}
    for name, count in opened:
        path = os.path.join(dev_dir, "nvidia%d" % minor if name == "gpu" else name)
        fds[name] = [os.open(path, os.O_RDWR) for _copy in range(count)]
    addresses = []
    for name, prot, kib, count, dontfork in mappings:
        for _copy in range(count):
            address = libc.mmap(None, kib << 10, _PROT[prot], mmap.MAP_SHARED, fds[name][0], 0)
            if address in (None, ctypes.c_void_p(-1).value):
                raise WorkloadError("mmap of %s failed: %s" % (name, os.strerror(ctypes.get_errno())))
            if dontfork:
                libc.madvise(address, kib << 10, MADV_DONTFORK)
            addresses.append(address)
    return fds["gpu"], (fds, addresses)


def allocate_sim(nbytes, gpu_index):
    """Create a context of nbytes // MiB on a simulated node (tests/sim/README.md): open and map the device files as a
    real context does (plant), seek one handle of the GPU's file to our node PID, write the context file.
    Returns (what keeps it, details)."""
    gpus = _sim_gpus()
    from simvllm.gpu import node_pid  # pylint: disable=import-outside-toplevel

    token = node_pid(gpus.run_dir)
    gpu_fds, kept = plant("context", gpus.dev_dir, gpus.minors[gpu_index])
    os.lseek(gpu_fds[0], token, os.SEEK_SET)
    temporary = os.path.join(gpus.run_dir, "contexts", ".%d.tmp" % token)
    with open(temporary, "w") as context_file:
        context_file.write("%d %d\n" % (gpu_index, nbytes >> 20))
    os.replace(temporary, os.path.join(gpus.run_dir, "contexts", str(token)))
    return kept, {"sim_token": token}


def init_nvml():
    """pynvml.nvmlInit() and stay initialized; returns (pynvml, details)."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml, {"nvml_gpu_count": pynvml.nvmlDeviceGetCount()}


def init_cuda(backend, gpu_index):
    """Initialize CUDA without creating a context; returns (keep-alive object, details)."""
    if backend == "sim":
        gpus = _sim_gpus()
        return plant("cuinit", gpus.dev_dir, gpus.minors[gpu_index]), {"cuda_init": "sim"}
    cuda = CudaDriver()
    count = ctypes.c_int()
    cuda.call("cuInit", 0)
    cuda.call("cuDeviceGetCount", ctypes.byref(count))
    return cuda, {"cuda_init": "cuInit", "cuda_device_count": count.value}


def init_available(backend, gpu_index):
    """torch.cuda.is_available() and stay (backend torch), else init_cuda; returns (keep-alive, details)."""
    if backend != "torch":
        return init_cuda(backend, gpu_index)
    import torch

    if not torch.cuda.is_available():
        raise WorkloadError("torch.cuda.is_available() is False")
    return torch, {"cuda_init": "torch.cuda.is_available()", "torch": torch.__version__}


def allocate(args):
    if args.backend == "sim" and args.pinned_bytes:
        raise WorkloadError("a simulated node has no pinned host memory")
    if args.backend == "torch":
        return allocate_torch(args.nbytes, args.pinned_bytes)
    if args.backend == "cuda":
        return allocate_cuda(args.nbytes, args.pinned_bytes)
    return allocate_sim(args.nbytes, args.gpu_index)


def initialize(args):
    """The roles that hold no memory of their own or share it (nvml, cuinit, available, ipc_*): (keep-alive, details,
    extra ready fields)."""
    if args.role in ("ipc_export", "ipc_import") and args.backend == "sim":
        raise WorkloadError("a simulated node has no CUDA IPC")
    if args.role == "ipc_export":
        kept, details, handle = export_ipc(args.nbytes)
        return kept, details, {"ipc_handle": handle, "bytes": args.nbytes}
    if args.role == "ipc_import":
        kept, details = import_ipc(args.ipc_handle)
        return kept, details, {}
    if args.role == "nvml":
        kept, details = init_nvml()
    elif args.role == "available":
        kept, details = init_available(args.backend, args.gpu_index)
    else:
        kept, details = init_cuda(args.backend, args.gpu_index)
    return kept, details, {}


def report(args, name, role, **fields):
    """Write RUN_DIR/NAME.json atomically (see the module docstring for its keys)."""
    with open("/proc/self/comm") as comm_file:
        comm = comm_file.read().rstrip("\n")
    with open("/proc/self/cmdline", "rb") as cmdline_file:
        cmdline = cmdline_file.read().replace(b"\0", b" ").decode(errors="replace").strip()
    info = {
        "name": name,
        "pid": os.getpid(),
        "role": role,
        "comm": comm,
        "cmdline": cmdline,
        "retitled_with": None,
        "bytes": 0,
        "backend": args.backend,
        "backend_details": {},
        "device_files": device_files(),
        "error": None,
    }
    info.update(fields)
    path = os.path.join(args.run_dir, name + ".json")
    with open(path + ".tmp", "w") as ready_file:
        json.dump(info, ready_file)
    os.replace(path + ".tmp", path)


def wait_for_lifeline(args, started):
    """Block until the lifeline pipe reaches EOF or --max-lifetime passes, then exit at once."""
    remaining = max(0.0, args.max_lifetime - (time.monotonic() - started))
    if args.lifeline_fd is None:
        time.sleep(remaining)
    else:
        select.select([args.lifeline_fd], [], [], remaining)
    os._exit(0)


def spawn(args, name, role, title=None):
    """Start another workload process with the same run dir, marker, backend, GPU and lifeline."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--name",
        name,
        "--role",
        role,
        "--run-dir",
        args.run_dir,
        "--marker",
        args.marker,
        "--backend",
        args.backend,
        "--bytes",
        str(args.nbytes),
        "--tp",
        str(args.tp),
        "--gpu-index",
        str(args.gpu_index),
        "--max-lifetime",
        str(args.max_lifetime),
    ]
    if title:
        command += ["--title", title]
    pass_fds = ()
    if args.lifeline_fd is not None:
        command += ["--lifeline-fd", str(args.lifeline_fd)]
        pass_fds = (args.lifeline_fd,)
    log = open(os.path.join(args.run_dir, name + ".log"), "wb")
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=pass_fds)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    retitled_with = retitle(args.title, args.marker)
    try:
        if args.role == "api":
            spawn(args, args.name + ".engine", "engine", title="VLLM::EngineCore")
            report(args, args.name, "api")
        elif args.role == "engine":
            for rank in range(args.tp):
                spawn(args, "%s.tp%d" % (args.name, rank), "hold", title="VLLM::Worker_TP%d" % rank)
            report(args, args.name, "engine", retitled_with=retitled_with)
        elif args.role != "hold":
            kept, details, fields = initialize(args)
            HELD.append(kept)
            report(args, args.name, args.role, retitled_with=retitled_with, backend_details=details, **fields)
        else:
            allocation, details = allocate(args)
            HELD.append(allocation)
            if args.fork_child and os.fork() == 0:
                # The child only inherited the device handles: it never calls CUDA (or Python's atexit).
                try:
                    report(
                        args, args.name + ".child", "inherited", retitled_with=retitled_with, backend_details=details
                    )
                    wait_for_lifeline(args, started)
                finally:
                    os._exit(1)
            report(
                args,
                args.name,
                "hold",
                retitled_with=retitled_with,
                bytes=args.nbytes,
                pinned_bytes=args.pinned_bytes,
                backend_details=details,
            )
    except Exception as error:  # the check reads the reason from the ready file
        report(args, args.name, args.role, retitled_with=retitled_with, error="%s: %s" % (type(error).__name__, error))
        return 1
    wait_for_lifeline(args, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
