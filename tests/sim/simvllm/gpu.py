"""The node's GPUs as a CUDA program sees them, and CUDA contexts per the simulator contract.

Reads `<run dir>/node.conf` (run dir: env GPUSIM_RUN, default /run/gpusim), `key=value` lines:
`gpus`, `memory_total_mib`, `minors` (comma list, index order), `reserved_mib`, `idle_used_mib`,
`stray_mib` (`index:MiB,...`) and `dev_dir` (where the nvidia device files are, default /dev).
A context of M MiB on GPU index i (tests/sim/README.md, "Creating a CUDA context"): open and map the
device files as a real context does (simcuda.cuda_process: nvidiactl, nvidia-uvm, every visible GPU's
/dev/nvidia<minor>, `rw-s` mappings of GPU i's), seek GPU i's first fd to the token (our PID in the node's root
PID namespace; simcuda.context_token), write `<run dir>/contexts/<PID>` (or `<PID>.<G>`) = `<i> <M>` atomically.
`nccl_init_nvml` initializes NVML and never shuts it down, as NCCL does.

MIG (node.conf `mig`; tests/sim/README.md "MIG"): CUDA_VISIBLE_DEVICES may name a MIG device (`MIG-<UUID>`, or
`MIG-GPU-<UUID>/<GI>/<CI>` of drivers before R470); CUDA then enumerates that one device and no other (MIG user
guide, "CUDA Device Enumeration"). A context on it: the parent's /dev/nvidia<minor> seeked to the token, the GPU and
compute instance's /dev/nvidia-caps/nvidia-cap<N> files open, context line `<i> <M> compute gi=<G> ci=<C>`.
"""

import os
from dataclasses import dataclass, field
from functools import cached_property

import simcuda  # tests/sim, on sys.path wherever simvllm is

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
class MigDevice:
    """One MIG device (a compute instance of a GPU instance) as the driver describes it. Memory in MiB."""

    index: int
    uuid: str
    gi: int
    ci: int
    memory_total_mib: int
    parent_uuid: str


def _instance_ids(fields):
    """(gi, ci) of a context line's fields after `<index> <MiB>` (`gi=<G> ci=<C>`, ci 0 when left out), or
    (None, None) for a context on a whole GPU."""
    ids = dict(field.split("=", 1) for field in fields if field.startswith(("gi=", "ci=")))
    if "gi" not in ids:
        return None, None
    return int(ids["gi"]), int(ids.get("ci", 0))


def _mig_gpu_indices(text):
    """GPU indices with MIG enabled in node.conf's `mig` value ("INDEX[:PROFILE,...];...")."""
    return [int(part.partition(":")[0]) for part in text.split(";") if part.strip()]


def _cap_minor(gpu_minor, gi, ci=None):
    """Minor of /dev/nvidia-caps/nvidia-cap<N> for a GPU instance (ci None) or a compute instance, from
    /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access ("DeviceFileMinor: N"), the file CUDA
    reads (through nvidia-modprobe -f) before it opens the capability (open-gpu-kernel-modules nv-caps.c)."""
    path = "/proc/driver/nvidia/capabilities/gpu%d/mig/gi%d%s/access" % (
        gpu_minor,
        gi,
        "" if ci is None else "/ci%d" % ci,
    )
    with open(path) as access:
        for line in access:
            if line.startswith("DeviceFileMinor:"):
                return int(line.split(":", 1)[1])
    raise OSError("no DeviceFileMinor in %s" % path)


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
    mig: str = ""

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
            mig=conf.get("mig", ""),
        )

    @cached_property
    def mig_devices(self):
        """{GPU index: [MigDevice, ...] in NVML's MIG index order} of the GPUs in MIG mode; {} without MIG.

        Read from the node's driver library (NVML): it is what gives MIG devices their UUIDs, as the driver does
        for CUDA. NVML is shut down again (its device files closed) before returning.
        """
        indices = _mig_gpu_indices(self.mig)
        if not indices:
            return {}
        import pynvml

        try:
            return self._read_mig_devices(pynvml, indices)
        except pynvml.NVMLError as error:
            raise GpuError("CUDA error: cannot enumerate the MIG devices: %s" % error) from None

    @staticmethod
    def _read_mig_devices(pynvml, indices):
        pynvml.nvmlInit()
        try:
            devices = {}
            for index in indices:
                parent = pynvml.nvmlDeviceGetHandleByIndex(index)
                parent_uuid = pynvml.nvmlDeviceGetUUID(parent)
                devices[index] = []
                for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
                    try:
                        handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, k)
                    except pynvml.NVMLError_NotFound:
                        continue
                    devices[index].append(
                        MigDevice(
                            index=index,
                            uuid=pynvml.nvmlDeviceGetUUID(handle),
                            gi=pynvml.nvmlDeviceGetGpuInstanceId(handle),
                            ci=pynvml.nvmlDeviceGetComputeInstanceId(handle),
                            memory_total_mib=pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024),
                            parent_uuid=parent_uuid,
                        )
                    )
            return devices
        finally:
            pynvml.nvmlShutdown()

    def _mig_device_named(self, item):
        """The MigDevice that a CUDA_VISIBLE_DEVICES entry `MIG-<UUID>` (R470+) or `MIG-GPU-<UUID>/<GI>/<CI>`
        (R450/R460) names, else None."""
        for devices in self.mig_devices.values():
            for device in devices:
                if item == device.uuid or item == "MIG-%s/%d/%d" % (device.parent_uuid, device.gi, device.ci):
                    return device
        return None

    def enumerate(self, cuda_visible_devices):
        """(GPU indices, MigDevice or None) that a CUDA program sees, in CUDA order.

        `cuda_visible_devices`: the CUDA_VISIBLE_DEVICES value or None (all GPUs). As in CUDA, the list ends at the
        first entry that is not a valid index or MIG UUID. With MIG (MIG user guide, "CUDA Device Enumeration"): CUDA
        enumerates a single MIG device, the first one visible (a MIG UUID, or the first instance of a listed GPU in
        MIG mode), and then no GPU that is not in MIG mode; the indices are then [its parent's index].
        """
        items = (
            [str(index) for index in range(self.count)]
            if cuda_visible_devices is None
            else cuda_visible_devices.split(",")
        )
        indices, migs = [], []
        for item in (item.strip() for item in items):
            if item.startswith("MIG-") and self.mig:
                device = self._mig_device_named(item)
                if device is None:
                    break
                migs.append(device)
                continue
            if not item.isdigit() or int(item) >= self.count or int(item) in indices:
                break
            indices.append(int(item))
            migs.extend(self.mig_devices.get(int(item), []))
        if migs:
            return [migs[0].index], migs[0]
        return [index for index in indices if index not in self.mig_devices], None

    def visible_indices(self, cuda_visible_devices):
        """GPU indices a CUDA program sees, in CUDA order.

        `cuda_visible_devices`: the CUDA_VISIBLE_DEVICES value or None (all GPUs). As in CUDA, the
        list ends at the first entry that is not a valid index.
        """
        return self.enumerate(cuda_visible_devices)[0]

    def context_mib(self, index, mig=None):
        """MiB held by the context files on GPU `index` (live contexts and ones not yet released); with `mig`
        (a MigDevice) only those on that MIG device (lines with its gi= and ci=)."""
        contexts_dir = os.path.join(self.run_dir, "contexts")
        total = 0
        try:
            names = os.listdir(contexts_dir)
        except FileNotFoundError:
            return 0
        for name in names:
            if not simcuda.is_context_file_name(name):
                continue
            try:
                with open(os.path.join(contexts_dir, name)) as context_file:
                    lines = context_file.read().splitlines()
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if (
                    len(fields) >= 2
                    and fields[0] == str(index)
                    and (mig is None or _instance_ids(fields[2:]) == (mig.gi, mig.ci))
                ):
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

    def create_context(self, index, local_rank, gpu_memory_utilization, visible=None, mig=None):
        """Create this process's CUDA context on GPU `index`, sized like vLLM's memory pool.

        Size: int(gpu_memory_utilization * memory_total_mib) MiB, the context's own cost included (vLLM sizes its
        KV cache so that the whole process fits the fraction: node.conf's context_overhead_mib changes nothing
        here). Raises GpuError with vLLM's message when the GPU has less free memory. Opens and maps the device
        files as a real context does (simcuda.cuda_process: every GPU in `visible`, indices, default [index];
        `rw-s` mappings of GPU `index`'s only); GPU `index`'s first fd carries the context (seeked to the token).
        Returns the open fds; the context lives as long as they stay open.

        With `mig` (a MigDevice of GPU `index`): sized and checked against that MIG device's memory (a MIG device
        has no reserved memory of its own in the fake driver); the parent's device file carries the context, the
        GPU instance's and compute instance's capability files are opened too, and the context line has gi=/ci=.
        """
        total_mib = mig.memory_total_mib if mig else self.memory_total_mib
        requested_mib = int(gpu_memory_utilization * total_mib)
        free_mib = total_mib - self.context_mib(index, mig) if mig else self.free_mib(index)
        if free_mib < requested_mib:
            raise GpuError(
                "Free memory on device cuda:%d (%.2f/%.2f GiB) on startup is less than desired GPU "
                "memory utilization (%s, %.2f GiB). Decrease GPU memory utilization or reduce GPU "
                "memory used by other processes."
                % (
                    local_rank,
                    max(free_mib, 0) / MIB_PER_GIB,
                    total_mib / MIB_PER_GIB,
                    gpu_memory_utilization,
                    requested_mib / MIB_PER_GIB,
                )
            )
        token = simcuda.context_token(self.run_dir, node_pid(self.run_dir))
        fds = simcuda.cuda_process(
            self.dev_dir, [self.minors[i] for i in visible or [index]], [self.minors[index]], token=token
        )
        line = "%d %d" % (index, requested_mib)
        if mig is not None:
            minor = self.minors[index]
            fds += [
                os.open(os.path.join(self.dev_dir, "nvidia-caps", "nvidia-cap%d" % cap), os.O_RDONLY)
                for cap in (_cap_minor(minor, mig.gi), _cap_minor(minor, mig.gi, mig.ci))
            ]
            line += " compute gi=%d ci=%d" % (mig.gi, mig.ci)
        simcuda.write_context(self.run_dir, token, [line])
        return fds


def nccl_init_nvml():
    """What NCCL does once per process that uses it (ncclNvmlEnsureInitialized, NCCL
    src/misc/nvmlwrap.cc): load libnvidia-ml.so.1 and call nvmlInit_v2, never nvmlShutdown. While
    initialized the driver library keeps /dev/nvidiactl, every /dev/nvidiaN of the host, /dev/nvidia-uvm
    (twice) and /dev/nvidia-caps/nvidia-cap1 and -cap2 open, and maps none of them.

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
