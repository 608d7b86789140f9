"""What CUDA and nvidia-smi do to a process's device files, for the simulated nodes (test infrastructure).

Every simulated process kind opens and maps the NVIDIA device files as the real one does on an NVIDIA H200 with
driver 580.159.04 (tests/sim/README.md, "Device files per process kind", cites the records and the driver source).
The node's device files are empty regular files, so an mmap(MAP_SHARED) of them shows in /proc/PID/maps with the
permissions and size a real mapping has. NVML-only clients are the fake libnvidia-ml.so.1's part (nvmlInit).

Standard library only: it runs under the venv's Python and under /usr/bin/python3 as another user. Import it with
tests/sim on sys.path (`import simcuda`). Every function returns the fds it opened: keep them open, they are what
the process holds (the mappings stay until the process exits).
"""

import ctypes
import mmap
import os
from collections import namedtuple

KIB = 1024
MIB = 1024 * KIB
MAP_FIXED = 0x10  # <sys/mman.h>; Python's mmap module does not export it
MADV_DONTFORK = 10
PROT_NONE = 0  # not in the mmap module before Python 3.13

# The sizes (KiB) of a context's `rw-s` mappings of /dev/nvidiactl: system memory the driver shares with the
# process (src/nvidia/arch/nvalloc/unix/src/osapi.c RmCreateMmapContextLocked sends them to the control device).
CONTEXT_CTL_MAPS_KIB = (4,) * 20 + (2048,) * 4 + (6060, 57344)
MPS_CLIENT_CTL_MAPS_KIB = (4,) * 15 + (2048,) * 4 + (6060, 34816)
MPS_SERVER_CTL_MAPS_KIB = (4,) * 4 + (2048,) * 4 + (6060, 14336)

# One kind of CUDA process: its fds of /dev/nvidiactl and /dev/nvidia-uvm, of the /dev/nvidiaN of a GPU where it
# has a context (gpu_fds) and of every other visible GPU (cuInit's visible_fds), whether it opens
# /dev/nvidia-caps/nvidia-cap1 and -cap2, and the sizes of its `rw-s` nvidiactl mappings (none: no context).
Kind = namedtuple("Kind", "ctl_fds uvm_fds gpu_fds visible_fds caps ctl_maps_kib")

# cuInit only (torch.cuda.is_available()): nvidiactl, nvidia-uvm x2, each visible GPU x4; no context.
CUDA_INIT = Kind(1, 2, 4, 4, False, ())
# The MPS control daemon: CUDA initialized, no nvidia-uvm.
MPS_CONTROL = Kind(1, 0, 4, 4, False, ())
# A context made by torch or JAX (CuPy opens one nvidiactl, two nvidia-uvm, 20 nvidia0 and no caps).
CONTEXT = Kind(2, 4, 23, 4, True, CONTEXT_CTL_MAPS_KIB)
MPS_CLIENT = Kind(2, 4, 19, 4, True, MPS_CLIENT_CTL_MAPS_KIB)
MPS_SERVER = Kind(1, 1, 20, 4, False, MPS_SERVER_CTL_MAPS_KIB)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


def map_file(fd, size, prot, address=None, offset=0):
    """mmap(MAP_SHARED) `size` bytes of `fd` at file offset `offset` (at `address`, MAP_FIXED, if given); returns
    the address. Python's mmap module refuses a mapping past the end of the (empty) file, libc's does not."""
    flags = mmap.MAP_SHARED | (MAP_FIXED if address is not None else 0)
    mapped = _libc.mmap(address, size, prot, flags, fd, offset)
    if mapped in (None, _MAP_FAILED):
        errno = ctypes.get_errno()
        raise OSError(errno, "mmap of a device file failed: %s" % os.strerror(errno))
    return mapped


def map_uvm(fd, size=2 * MIB):
    """The `rw-s` mapping of /dev/nvidia-uvm that a context has: its file offset is its own address (uvm.c
    uvm_mmap: "UVM mappings are required to set offset == VA") and it is VM_DONTCOPY there, so a forked child
    does not inherit it (here madvise(MADV_DONTFORK), which sets that flag)."""
    reserved = _libc.mmap(None, size, PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if reserved in (None, _MAP_FAILED):
        raise OSError(ctypes.get_errno(), "cannot reserve an address for the nvidia-uvm mapping")
    address = map_file(fd, size, mmap.PROT_READ | mmap.PROT_WRITE, address=reserved, offset=reserved)
    if _libc.madvise(address, size, MADV_DONTFORK) != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_DONTFORK) of the nvidia-uvm mapping failed")
    return address


def _open(dev_dir, name, count, flags=os.O_RDWR):
    return [os.open(os.path.join(dev_dir, name), flags) for _fd in range(count)]


def open_caps(dev_dir):
    """/dev/nvidia-caps/nvidia-cap1 (mig/config, root's alone) and -cap2 (mig/monitor, everyone's), read-only, as
    far as this process may open them (a non-root process gets cap2 alone); absent files are skipped."""
    fds = []
    for name in ("nvidia-cap1", "nvidia-cap2"):
        try:
            fds += _open(dev_dir, os.path.join("nvidia-caps", name), 1, os.O_RDONLY)
        except (PermissionError, FileNotFoundError):
            pass
    return fds


def zero_framebuffer(run_dir=None):
    """True on a node that models a zero-framebuffer GPU (NVIDIA GB10): node.conf `memory_info=unsupported`, the
    driver's answer on a GB10 (tests/sim/README.md, "The driver model")."""
    run_dir = run_dir or os.environ.get("GPUSIM_RUN", "/run/gpusim")
    try:
        with open(os.path.join(run_dir, "node.conf")) as conf:
            return any(line.strip() == "memory_info=unsupported" for line in conf)
    except OSError:
        return False


def map_context(gpu_fd, ctl_fd, uvm_fd=None, kind=CONTEXT, zero_fb=None):
    """Map what a context maps besides cuInit's: its GPU's file `rw-s` (2 MiB, offset 0), nvidiactl `rw-s`
    (kind.ctl_maps_kib) and, with `uvm_fd`, nvidia-uvm (map_uvm: not inherited by a forked child).

    A zero-framebuffer GPU (GB10; `zero_fb` None: zero_framebuffer()) has no framebuffer to map: its memory is
    system memory, which open-gpu-kernel-modules (src/nvidia/arch/nvalloc/unix/src/osapi.c RmCreateMmapContextLocked)
    attaches to nvidiactl; its GPU's file gets no `rw-s` mapping there. Decided from the source, not measured."""
    if not (zero_framebuffer() if zero_fb is None else zero_fb):
        map_file(gpu_fd, 2 * MIB, mmap.PROT_READ | mmap.PROT_WRITE)
    for size in kind.ctl_maps_kib:
        map_file(ctl_fd, size * KIB, mmap.PROT_READ | mmap.PROT_WRITE)
    if uvm_fd is not None:
        map_uvm(uvm_fd)


def cuda_process(dev_dir, visible, compute=(), kind=CONTEXT, token=0, token_on_ctl=False):
    """Open and map what a CUDA process of `kind` does; return its fds.

    `visible`: minors of the GPUs it sees (CUDA_VISIBLE_DEVICES); `compute`: minors where it has a context (each
    also visible). Every visible GPU's file is opened (the context's GPU more often) and mapped write-only twice
    (`-w-s`, 64 KiB: cuInit's); nvidiactl is mapped read-only once (`r--s`, 4 KiB). With a context: each
    context's GPU mapped `rw-s` (2 MiB, offset 0), nvidiactl `rw-s` (kind.ctl_maps_kib), nvidia-uvm `rw-s` once
    (see map_uvm); on a zero-framebuffer node no `rw-s` GPU mapping (map_context). `token` > 0: the simulator's
    bookkeeping (tests/sim/README.md, "Creating a CUDA context"): the
    first fd of each context's GPU (of nvidiactl with `token_on_ctl`, an MPS client) is seeked to it.
    """
    zero_fb = zero_framebuffer()
    ctl = _open(dev_dir, "nvidiactl", kind.ctl_fds)
    uvm = _open(dev_dir, "nvidia-uvm", kind.uvm_fds)
    fds = ctl + uvm
    for minor in sorted(set(visible) | set(compute)):
        gpu = _open(dev_dir, "nvidia%d" % minor, kind.gpu_fds if minor in compute else kind.visible_fds)
        fds += gpu
        for _doorbell in range(2):
            map_file(gpu[0], 64 * KIB, mmap.PROT_WRITE)
        if minor in compute:
            if not zero_fb:  # see map_context
                map_file(gpu[0], 2 * MIB, mmap.PROT_READ | mmap.PROT_WRITE)
            if token and not token_on_ctl:
                os.lseek(gpu[0], token, os.SEEK_SET)
    if kind.caps:
        fds += open_caps(dev_dir)
    map_file(ctl[0], 4 * KIB, mmap.PROT_READ)
    if compute:
        for size in kind.ctl_maps_kib:
            map_file(ctl[0], size * KIB, mmap.PROT_READ | mmap.PROT_WRITE)
        if uvm:
            map_uvm(uvm[0])
        if token and token_on_ctl:
            os.lseek(ctl[0], token, os.SEEK_SET)
    return fds


def context_file_name(token):
    """The name of a context file in <run>/contexts/ for `token`: "<T>", or "<T>.<G>" for T + (G << 32)."""
    pid, generation = token & 0xFFFFFFFF, token >> 32
    return str(pid) if not generation else "%d.%d" % (pid, generation)


def is_context_file_name(name):
    """True for "<T>" and "<T>.<G>" (temporary files start with ".")."""
    pid, _dot, generation = name.partition(".")
    return pid.isdigit() and (not _dot or generation.isdigit())


def context_token(run_dir, pid):
    """The token of a new context of the process whose node PID is `pid`: `pid` itself, or, while an earlier
    context file of that number is there (a dead creator's, whose forked child holds it: the driver keeps listing
    its number), pid + (G << 32) for the first free "<pid>.<G>" (tests/sim/README.md, "Creating a CUDA context").
    Only the process with that number creates contexts of it, so the name stays free until write_context."""
    contexts = os.path.join(run_dir, "contexts")
    generation = 0
    while os.path.lexists(os.path.join(contexts, context_file_name(pid + (generation << 32)))):
        generation += 1
    return pid + (generation << 32)


def write_context(run_dir, token, lines):
    """Write the context file of `token` (context_token) with `lines` ("<index> <MiB> [words]"), atomically."""
    contexts = os.path.join(run_dir, "contexts")
    name = context_file_name(token)
    temporary = os.path.join(contexts, ".%s.tmp" % name)
    with open(temporary, "w") as context_file:
        context_file.write("".join(line + "\n" for line in lines))
    os.rename(temporary, os.path.join(contexts, name))


def nvidia_smi(dev_dir, minors):
    """What `nvidia-smi -l 1` holds besides NVML's files (the caller has initialized NVML through the driver
    library): each GPU's file three more times, and one `r--s` 4 KiB mapping of nvidiactl (the fd it was made on
    is closed again: nvidia-smi keeps one nvidiactl fd, NVML's)."""
    fds = []
    for minor in minors:
        fds += _open(dev_dir, "nvidia%d" % minor, 3)
    ctl = os.open(os.path.join(dev_dir, "nvidiactl"), os.O_RDWR)
    map_file(ctl, 4 * KIB, mmap.PROT_READ)
    os.close(ctl)
    return fds
