"""The node's GPUs as a CUDA program sees them, and CUDA contexts per the simulator contract.

Reads `<run dir>/node.conf` (run dir: env GPUSIM_RUN, default /run/gpusim), `key=value` lines:
`gpus`, `memory_total_mib`, `minors` (comma list, index order), `reserved_mib`, `idle_used_mib`,
`stray_mib` (`index:MiB,...`) and `dev_dir` (where the nvidia device files are, default /dev).
A context of M MiB on GPU index i (tests/sim/README.md, "Creating a CUDA context"): open
/dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia<minor> of every visible GPU (CUDA_VISIBLE_DEVICES),
seek GPU i's to our PID in the node's root PID namespace, write `<run dir>/contexts/<PID>` =
`<i> <M>` atomically. `nccl_init_nvml` initializes NVML and never shuts it down, as NCCL does.
"""

import os
from dataclasses import dataclass, field

DEFAULT_RUN_DIR = "/run/gpusim"
MIB_PER_GIB = 1024


class GpuError(RuntimeError):
    """No GPU, too few GPUs, or not enough free memory; the message reads like vLLM's."""


def run_dir():
    """The node's run directory: env GPUSIM_RUN, else /run/gpusim."""
    return os.environ.get("GPUSIM_RUN", DEFAULT_RUN_DIR)


def node_pid(run_directory):
    """This process's PID in the node's root PID namespace (the context token).

    The first `NSpid:` entry of <run dir>/proc/self/status when the node exposes its /proc there,
    else getpid().
    """
    try:
        with open(os.path.join(run_directory, "proc", "self", "status")) as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return os.getpid()


def _parse_int_list(text):
    return [int(item) for item in text.split(",") if item.strip()]


@dataclass(frozen=True)
class NodeGpus:
    """The GPUs of the node described by one node.conf. Memory in MiB."""

    run_dir: str
    count: int
    memory_total_mib: int
    minors: list
    reserved_mib: int
    idle_used_mib: int = 0
    stray_mib: dict = field(default_factory=dict)
    dev_dir: str = "/dev"

    @classmethod
    def load(cls, run_directory=None):
        """Read node.conf of `run_directory` (default: run_dir()).

        Raises GpuError like vLLM on a host without GPUs when there is no node.conf.
        """
        run_directory = run_directory or run_dir()
        try:
            with open(os.path.join(run_directory, "node.conf")) as conf_file:
                lines = conf_file.read().splitlines()
        except OSError:
            raise GpuError("Failed to infer device type: no CUDA GPUs are available") from None
        conf = {}
        for line in lines:
            key, sep, value = line.partition("=")
            if sep and not line.lstrip().startswith("#"):
                conf[key.strip()] = value.strip()
        count = int(conf.get("gpus", 8))
        stray = {}
        for item in conf.get("stray_mib", "").split(","):
            if item.strip():
                index, mib = item.split(":")
                stray[int(index)] = int(mib)
        return cls(
            run_dir=run_directory,
            count=count,
            memory_total_mib=int(conf.get("memory_total_mib", 81559)),
            minors=_parse_int_list(conf["minors"]) if conf.get("minors") else list(range(count)),
            reserved_mib=int(conf.get("reserved_mib", 529)),
            idle_used_mib=int(conf.get("idle_used_mib", 0)),
            stray_mib=stray,
            dev_dir=conf.get("dev_dir") or "/dev",
        )

    def visible_indices(self, cuda_visible_devices):
        """GPU indices a CUDA program sees, in CUDA order.

        `cuda_visible_devices`: the CUDA_VISIBLE_DEVICES value or None (all GPUs). As in CUDA, the
        list ends at the first entry that is not a valid index.
        """
        if cuda_visible_devices is None:
            return list(range(self.count))
        indices = []
        for item in cuda_visible_devices.split(","):
            item = item.strip()
            if not item.isdigit() or int(item) >= self.count or int(item) in indices:
                break
            indices.append(int(item))
        return indices

    def context_mib(self, index):
        """MiB held by the context files on GPU `index` (live contexts and ones not yet released)."""
        contexts_dir = os.path.join(self.run_dir, "contexts")
        total = 0
        try:
            names = os.listdir(contexts_dir)
        except FileNotFoundError:
            return 0
        for name in names:
            if not name.isdigit():
                continue
            try:
                with open(os.path.join(contexts_dir, name)) as context_file:
                    lines = context_file.read().splitlines()
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if len(fields) >= 2 and fields[0] == str(index):
                    total += int(fields[1])
        return total

    def free_mib(self, index):
        """Free memory of GPU `index`: total - reserved - idle used - stray - contexts."""
        return (
            self.memory_total_mib
            - self.reserved_mib
            - self.idle_used_mib
            - self.stray_mib.get(index, 0)
            - self.context_mib(index)
        )

    def create_context(self, index, local_rank, gpu_memory_utilization, visible=None):
        """Create this process's CUDA context on GPU `index`, sized like vLLM's memory pool.

        Size: int(gpu_memory_utilization * memory_total_mib) MiB. Raises GpuError with vLLM's
        message when the GPU has less free memory. Opens /dev/nvidiactl, /dev/nvidia-uvm and, as
        CUDA does at cuInit, the device file of every GPU in `visible` (indices; default [index])
        at position 0; GPU `index`'s file carries the context (seeked to the token). Returns the
        open fds; the context lives as long as they stay open.
        """
        requested_mib = int(gpu_memory_utilization * self.memory_total_mib)
        free_mib = self.free_mib(index)
        if free_mib < requested_mib:
            raise GpuError(
                "Free memory on device cuda:%d (%.2f/%.2f GiB) on startup is less than desired GPU "
                "memory utilization (%s, %.2f GiB). Decrease GPU memory utilization or reduce GPU "
                "memory used by other processes."
                % (local_rank, max(free_mib, 0) / MIB_PER_GIB, self.memory_total_mib / MIB_PER_GIB,
                   gpu_memory_utilization, requested_mib / MIB_PER_GIB)
            )
        others = [i for i in (visible or [index]) if i != index]
        paths = ["nvidiactl", "nvidia-uvm"] + ["nvidia%d" % self.minors[i] for i in others]
        paths.append("nvidia%d" % self.minors[index])
        fds = [os.open(os.path.join(self.dev_dir, path), os.O_RDWR) for path in paths]
        token = node_pid(self.run_dir)
        os.lseek(fds[-1], token, os.SEEK_SET)
        contexts_dir = os.path.join(self.run_dir, "contexts")
        temporary = os.path.join(contexts_dir, ".%d.tmp" % token)
        with open(temporary, "w") as context_file:
            context_file.write("%d %d\n" % (index, requested_mib))
        os.replace(temporary, os.path.join(contexts_dir, str(token)))
        return fds


def nccl_init_nvml():
    """What NCCL does once per process that uses it (ncclNvmlEnsureInitialized, NCCL
    src/misc/nvmlwrap.cc): load libnvidia-ml.so.1 and call nvmlInit_v2, never nvmlShutdown. While
    initialized the driver library keeps /dev/nvidiactl and every /dev/nvidiaN of the host open.

    Returns the library (keep it referenced), or None with the loader's or NVML's error logged
    as NCCL's WARN line; the caller goes on, as vLLM does when NCCL's topology probing degrades.
    """
    import ctypes
    import logging

    try:
        library = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as error:
        logging.getLogger(__name__).warning("NCCL WARN Failed to open libnvidia-ml.so.1: %s", error)
        return None
    status = library.nvmlInit_v2()
    if status != 0:
        logging.getLogger(__name__).warning("NCCL WARN nvmlInit_v2() failed: status %d", status)
        return None
    return library
