# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A process that the GPU check (check.py) starts: it holds GPU memory the way vLLM's processes do.

    python3 workload.py --name NAME --run-dir DIR --marker MARKER --backend torch|cuda|sim
                        [--role hold|engine|api|nvml|cuinit] [--bytes N] [--title TITLE] [--ignore-sigterm]
                        [--fork-child] [--tp K] [--gpu-index I] [--lifeline-fd FD] [--max-lifetime S]

Roles:
- hold: allocate N bytes of device memory (a CUDA context plus cuMemAlloc, or a torch tensor),
  then wait. --fork-child: after allocating, fork a child that only inherits the device handles
  (it never calls CUDA); the child reports as NAME.child.
- engine: like vLLM's EngineCore with TP=K > 1: starts K `hold` workers titled
  VLLM::Worker_TP0..K-1 (reporting as NAME.tp0..), holds no GPU itself.
- api: like vLLM's API server: starts an `engine` (reporting as NAME.engine), holds no GPU.
- nvml: an NVML-only client, as a GPU exporter or nvtop: pynvml.nvmlInit() and never nvmlShutdown (any
  backend; on a simulated node the fake libnvidia-ml.so.1 answers).
- cuinit: CUDA initialized without a context: cuInit(0) and cuDeviceGetCount through libcuda.so.1 with
  ctypes (backends torch and cuda); on a simulated node it opens what tests/sim/README.md's CUDA process
  opens at cuInit (/dev/nvidiactl, /dev/nvidia-uvm, the visible GPU's /dev/nvidiaN at position 0) and writes
  no context.

Every process writes DIR/NAME.json once ready (atomically): {"name", "pid" (getpid(), in its own
PID namespace), "role", "comm", "cmdline", "retitled_with", "bytes", "backend", "backend_details",
"device_files", "error"}; on failure "error" is set and it exits 1.

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
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_NAME = 15
COMM_BYTES = 15
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
    parser.add_argument("--role", choices=("hold", "engine", "api", "nvml", "cuinit"), default="hold")
    parser.add_argument("--bytes", type=int, default=0, dest="nbytes")
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


def allocate_torch(nbytes):
    """Allocate `nbytes` on CUDA device 0 with PyTorch; returns (keep-alive object, details)."""
    import torch

    tensor = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    return tensor, {"torch": torch.__version__, "torch_cuda": torch.version.cuda}


def allocate_cuda(nbytes):
    """Allocate `nbytes` on CUDA device 0 through the CUDA driver API (libcuda.so.1) with ctypes:
    cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain + cuCtxSetCurrent, cuMemAlloc_v2.
    Returns (keep-alive tuple, details). Raises WorkloadError naming the failing call."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise WorkloadError("cannot load libcuda.so.1: %s" % error) from None

    def call(name, *args):
        result = getattr(cuda, name)(*args)
        if result != 0:
            text = ctypes.c_char_p()
            cuda.cuGetErrorName(result, ctypes.byref(text))
            raise WorkloadError("%s failed: %s (%d)" % (name, (text.value or b"?").decode(), result))

    device, context, pointer, version = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_int()
    call("cuInit", 0)
    call("cuDriverGetVersion", ctypes.byref(version))
    call("cuDeviceGet", ctypes.byref(device), 0)
    call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
    call("cuCtxSetCurrent", context)
    if nbytes:
        call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(nbytes))
    return (cuda, context, pointer), {"cuda_driver_api_version": version.value}


def allocate_sim(nbytes, gpu_index):
    """Create a context of nbytes // MiB on a simulated node, as simvllm does (tests/sim/README.md):
    open nvidiactl, nvidia-uvm and nvidia<minor>, seek the latter to our node PID, write the context file.
    Returns (open fds, details)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sim"))
    from simvllm.gpu import NodeGpus, node_pid

    gpus = NodeGpus.load()
    paths = ["nvidiactl", "nvidia-uvm", "nvidia%d" % gpus.minors[gpu_index]]
    fds = [os.open(os.path.join(gpus.dev_dir, path), os.O_RDWR) for path in paths]
    token = node_pid(gpus.run_dir)
    os.lseek(fds[-1], token, os.SEEK_SET)
    temporary = os.path.join(gpus.run_dir, "contexts", ".%d.tmp" % token)
    with open(temporary, "w") as context_file:
        context_file.write("%d %d\n" % (gpu_index, nbytes >> 20))
    os.replace(temporary, os.path.join(gpus.run_dir, "contexts", str(token)))
    return fds, {"sim_token": token}


def init_nvml():
    """pynvml.nvmlInit() and stay initialized; returns (pynvml, details)."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml, {"nvml_gpu_count": pynvml.nvmlDeviceGetCount()}


def init_cuda(backend, gpu_index):
    """Initialize CUDA without creating a context; returns (keep-alive object, details)."""
    if backend == "sim":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sim"))
        from simvllm.gpu import NodeGpus

        gpus = NodeGpus.load()
        paths = ["nvidiactl", "nvidia-uvm", "nvidia%d" % gpus.minors[gpu_index]]
        return [os.open(os.path.join(gpus.dev_dir, path), os.O_RDWR) for path in paths], {"cuda_init": "sim"}
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise WorkloadError("cannot load libcuda.so.1: %s" % error) from None
    count = ctypes.c_int()
    for name, call_args in (("cuInit", (0,)), ("cuDeviceGetCount", (ctypes.byref(count),))):
        result = getattr(cuda, name)(*call_args)
        if result != 0:
            raise WorkloadError("%s failed: %d" % (name, result))
    return cuda, {"cuda_init": "cuInit", "cuda_device_count": count.value}


def allocate(args):
    if args.backend == "torch":
        return allocate_torch(args.nbytes)
    if args.backend == "cuda":
        return allocate_cuda(args.nbytes)
    return allocate_sim(args.nbytes, args.gpu_index)


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
        elif args.role in ("nvml", "cuinit"):
            library, details = init_nvml() if args.role == "nvml" else init_cuda(args.backend, args.gpu_index)
            HELD.append(library)
            report(args, args.name, args.role, retitled_with=retitled_with, backend_details=details)
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
            report(args, args.name, "hold", retitled_with=retitled_with, bytes=args.nbytes, backend_details=details)
    except Exception as error:  # the check reads the reason from the ready file
        report(args, args.name, args.role, retitled_with=retitled_with, error="%s: %s" % (type(error).__name__, error))
        return 1
    wait_for_lifeline(args, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
