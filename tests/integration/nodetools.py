"""What tests look at inside a simulated node: processes, GPU memory, vLLM trees, holders they start."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request

from polling import wait_for  # noqa: F401  (tests import it from here)
from ports import free_ports

# Prints {"pid": [ppid, state, comm, cmdline]} for every process of the node (read from its /proc).
_PS = r"""
import json, os
out = {}
for name in os.listdir("/proc"):
    if not name.isdigit():
        continue
    try:
        stat = open("/proc/%s/stat" % name, "rb").read()
        cmd = open("/proc/%s/cmdline" % name, "rb").read().replace(b"\0", b" ").decode().strip()
    except OSError:
        continue
    close = stat.rindex(b")")
    fields = stat[close + 2:].split()
    out[name] = [int(fields[1]), fields[0].decode(), stat[stat.index(b"(") + 1:close].decode(), cmd]
print(json.dumps(out))
"""

_MEMORY = r"""
import json, pynvml as n
n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    m = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    out.append([m.used >> 20, [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]])
print(json.dumps(out))
"""

# The end of every simulated process started here, after it opened its files (`spec`, node_pid() and the
# modules os, signal and time defined): report "<node PID> <PID here>" to spec["ready"], then hold; spec["mode"]
# inherit: a forked child keeps the handles and reports, the parent exits; ignore-term: SIGTERM is ignored.
PROCESS_TAIL = r"""
def ready(pid):
    tmp = spec["ready"] + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d %d\n" % (pid, os.getpid()))
    os.rename(tmp, spec["ready"])

if spec["mode"] == "inherit":
    parent = os.getpid()
    if os.fork() == 0:
        while os.getppid() == parent:
            time.sleep(0.01)
        ready(node_pid())
        time.sleep(3600)
        os._exit(0)
    os._exit(0)
if spec["mode"] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
ready(node_pid())
time.sleep(3600)
"""

# A simulated CUDA process (contract: tests/sim/README.md, "Creating a CUDA context"; what real
# processes open and map: "Device files per process kind" there, done by tests/sim/simcuda.py). argv[1] is JSON:
#   gpus     indices where it computes (a context of `mib` MiB on each, plus node.conf's context_overhead_mib but
#            for an MPS server; none: CUDA initialized, no context);
#   visible  indices of CUDA_VISIBLE_DEVICES (null: every GPU of the node): CUDA opens the device file of each;
#   kind     simcuda's kind of process (CONTEXT, CUDA_INIT, MPS_CLIENT, MPS_SERVER, MPS_CONTROL; null: CONTEXT
#            with gpus, else CUDA_INIT); MPS_CLIENT keeps the token on nvidiactl and writes context lines of type mps;
#   nvml     also initialize NVML through the driver library and never shut it down (NCCL);
#   pinned   MiB of host memory pinned through the context (context word pinned=, a slower release);
#   ipc      [exporter's node PID, MiB]: memory imported from that context over CUDA IPC (context word ipc=);
#   mode     hold | inherit (a forked child keeps the handles, the parent exits) | ignore-term;
#   sim_dir  tests/sim (for simcuda); ready: file to write "<node PID> <PID here>" into once everything is open.
# Standard library only (it may run under /usr/bin/python3 as another user); setproctitle is
# imported only for a title.
CUDA_PROCESS = (
    r"""
import ctypes, json, os, signal, sys, time
spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["sim_dir"])
import simcuda
if spec.get("title"):
    import setproctitle
    setproctitle.setproctitle(spec["title"])
conf = dict(line.strip().split("=", 1) for line in open("/run/gpusim/node.conf") if "=" in line)
count = int(conf.get("gpus", 8))
minors = [int(x) for x in conf["minors"].split(",")] if conf.get("minors") else list(range(count))

def node_pid():
    try:
        for line in open("/run/gpusim/proc/self/status"):
            if line.startswith("NSpid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return os.getpid()

gpus = spec["gpus"]
# The node PID, or, while a dead creator's context of this number is still held, the next token of it.
token = simcuda.context_token("/run/gpusim", node_pid()) if gpus else node_pid()
kind = spec.get("kind") or ("CONTEXT" if gpus else "CUDA_INIT")
visible = spec["visible"] if spec.get("visible") is not None else list(range(count))
fds = simcuda.cuda_process("/dev", [minors[i] for i in visible], [minors[i] for i in gpus], getattr(simcuda, kind),
                           token, token_on_ctl=kind == "MPS_CLIENT")
if spec.get("nvml"):
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert nvml.nvmlInit_v2() == 0, "nvmlInit_v2 failed"
if gpus:
    # What CUDA itself takes on the device beyond the allocations (518 MiB on an H200); the MPS server's context
    # is its own small size (66 MiB on an H200).
    mib = spec["mib"] + (int(conf.get("context_overhead_mib") or 0) if kind != "MPS_SERVER" else 0)
    words = (" mps" if kind == "MPS_CLIENT" else "") + (" pinned=%d" % spec["pinned"] if spec.get("pinned") else "")
    words += " ipc=%d:%d" % tuple(spec["ipc"]) if spec.get("ipc") else ""
    simcuda.write_context("/run/gpusim", token, ["%d %d%s" % (index, mib, words) for index in gpus])
"""
    + PROCESS_TAIL
)

# HOLDER is kept for tests that read it; start_holder now runs CUDA_PROCESS.
HOLDER = CUDA_PROCESS

# An NVML-only client (exporter, nvtop...): pynvml.nvmlInit() through the node's driver library,
# one query, then it stays initialized: the fake library holds /dev/nvidiactl, every /dev/nvidiaN,
# /dev/nvidia-uvm twice and the caps files, maps nothing; no context. argv[1]: title, argv[2]: ready file.
NVML_MONITOR = r"""
import os, sys, time
import setproctitle
setproctitle.setproctitle(sys.argv[1])
import pynvml
pynvml.nvmlInit()
for i in range(pynvml.nvmlDeviceGetCount()):
    pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write("%d %d\n" % (os.getpid(), os.getpid()))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
time.sleep(3600)
"""

# `nvidia-smi -l 1`: NVML initialized and queried once a second, plus what simcuda.nvidia_smi adds (each GPU's file
# three more times, one r--s mapping of nvidiactl). argv[1]: tests/sim, argv[2]: ready file.
NVIDIA_SMI = r"""
import os, sys, time
import setproctitle
setproctitle.setproctitle("nvidia-smi -l 1")
setproctitle.setthreadtitle("nvidia-smi")
sys.path.insert(0, sys.argv[1])
import simcuda, pynvml
pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
fds = simcuda.nvidia_smi("/dev", [pynvml.nvmlDeviceGetMinorNumber(h) for h in handles])
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write("%d %d\n" % (os.getpid(), os.getpid()))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
while True:
    for h in handles:
        pynvml.nvmlDeviceGetMemoryInfo(h)
    time.sleep(1)
"""

# The MPS control daemon: titled nvidia-cuda-mps-control, CUDA initialized on the server's GPUs (argv[4]: their
# minors; simcuda.MPS_CONTROL); it starts the MPS server (argv[1]: the server's CUDA_PROCESS spec) as its child, as
# the real daemon does, then waits.
MPS_CONTROL = r"""
import json, os, subprocess, sys, time
import setproctitle
setproctitle.setproctitle("nvidia-cuda-mps-control")
spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["sim_dir"])
import simcuda
fds = simcuda.cuda_process("/dev", json.loads(sys.argv[4]), (), simcuda.MPS_CONTROL)
server = subprocess.Popen([spec.get("executable") or sys.executable, "-c", sys.argv[2], sys.argv[1]],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with open(sys.argv[3] + ".tmp", "w") as f:
    f.write("%d %d\n" % (os.getpid(), os.getpid()))
os.rename(sys.argv[3] + ".tmp", sys.argv[3])
server.wait()
time.sleep(3600)
"""

# PID 1 of a nested PID namespace (a container): reaps its orphans; writes its node PID to argv[1].
CONTAINER_INIT = r"""
import os, sys, time
for line in open("/run/gpusim/proc/self/status"):
    if line.startswith("NSpid:"):
        node_pid = int(line.split()[1])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write("%d %d\n" % (node_pid, os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        time.sleep(0.1)
"""

# Run inside a container: make the next PID of this namespace argv[1] (ns_last_pid), then start
# argv[2:] detached (own session, stdio on /dev/null); print the child's PID here.
_LAUNCH_AT_PID = r"""
import subprocess, sys
want = int(sys.argv[1])
if want > 0:
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(want - 1))
child = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
print(child.pid)
"""

# A launcher (a shell script, torchrun): runs argv[1:] as its child in its own session and process group and stays.
# The child leads neither, so its PID is free again once it exits and is reaped, even while children it forked live
# on (the number of a session or group leader stays taken while the members live).
_UNDER_LAUNCHER = r"""
import subprocess, sys, time
subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(3600)
"""

_ready_numbers = iter(range(1, 1 << 30))


def _ready_file(node, what):
    """A fresh ready-file path: (path inside the node, path here)."""
    directory = node.run_dir / "nodetools"
    if not directory.exists():
        directory.mkdir(exist_ok=True)
        directory.chmod(0o1777)
    name = "%s-%d-%d" % (what, os.getpid(), next(_ready_numbers))
    return "/run/gpusim/nodetools/" + name, directory / name


def _await_ready(path, what, timeout=20):
    """(node PID, PID in its own namespace) that the process wrote into `path`."""

    def read():
        try:
            return tuple(int(x) for x in path.read_text().split())
        except (OSError, ValueError):
            return None

    return wait_for(read, timeout, 0.05, what)


def _launch(node, argv, user=None, prefix=()):
    """Start argv detached inside the node (setsid, stdio on /dev/null), as `user` if given."""
    as_user = []
    if user is not None:
        import pwd

        entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
        as_user = ["setpriv", "--reuid=%d" % entry.pw_uid, "--regid=%d" % entry.pw_gid, "--clear-groups"]
    node.exec("sh", "-c", 'exec "$@" </dev/null >/dev/null 2>&1', "sh", *prefix, "setsid", "-f", *as_user, *argv)


SIM_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sim")


def cuda_spec(
    gpus, mib=1024, visible=None, mode="hold", title=None, nvml=False, mps=False, kind=None, pinned=0, ipc=None
):
    """The CUDA_PROCESS spec (see there) of a process with a context of `mib` MiB on each of `gpus`."""
    return {
        "gpus": list(gpus),
        "mib": mib,
        "visible": None if visible is None else list(visible),
        "mode": mode,
        "title": title,
        "nvml": nvml,
        "kind": "MPS_CLIENT" if mps else kind,
        "pinned": pinned,
        "ipc": ipc,
        "sim_dir": SIM_DIR,
    }


def start_cuda_process(
    node,
    gpus,
    mib=1024,
    visible=None,
    mode="hold",
    title=None,
    nvml=False,
    mps=False,
    user=None,
    container=None,
    pid=0,
    pinned_gib=0,
    ipc=None,
    executable=None,
    launcher=False,
):
    """Start a simulated CUDA process in `node`; return its PID in the node (for mode inherit: the
    forked child's; with `container`: its PID in the container's namespace).

    It has a context of `mib` MiB on each GPU index in `gpus` (none: CUDA initialized, no context; the
    driver lists `mib` plus node.conf's context_overhead_mib, what CUDA itself takes on the device) and
    was started with CUDA_VISIBLE_DEVICES = `visible` (indices; None: unset, every GPU visible): it
    opens and maps what a real one does (tests/sim/README.md, "Device files per process kind"): the
    device file of every visible GPU, `rw-s` mappings only of the GPUs where it computes. `nvml`: it
    also keeps NVML initialized, as NCCL does (every /dev/nvidiaN of the node). `mps`: an MPS client
    instead (tests/sim/README.md, "MPS"). `pinned_gib`: GiB of host memory pinned through the
    context (its release after the last handle is slower). `ipc`: (exporter's PID, MiB) imported from
    that context over CUDA IPC. `mode`: hold, inherit (a forked child keeps the handles, the parent
    exits), ignore-term (ignores SIGTERM). `user`: run as that user (uid or name; /usr/bin/python3,
    so no `title`). `container`: a Container to start it in; `pid`: the PID it should get there, or
    in the node without `container` (0: any; not with `user`). `executable`: the Python it runs
    under (daemon_executable: a GPU daemon by what it runs; no `title` then). `launcher`: start it as the child of a
    launcher that stays (a torchrun): it leads no session or process group, so with mode inherit its number is free
    for another process once it has exited (not with `container`, `pid` or `user`).
    """
    spec = cuda_spec(gpus, mib, visible, mode, title, nvml, mps, pinned=int(pinned_gib * 1024), ipc=ipc)
    if launcher:
        return _start_cuda(node, spec, visible, executable=executable, prefix=[node_python(), "-c", _UNDER_LAUNCHER])
    return _start_cuda(node, spec, visible, user=user, container=container, pid=pid, executable=executable)


def daemon_executable(node, name):
    """The path in `node` of an executable named `name` that only root could have put there, as a GPU daemon's binary
    is (/usr/bin/nvidia-persistenced, root:root 0755): a copy of the node's Python (its standard library only; no
    setproctitle), so its processes run what that daemon runs (/proc/PID/exe), whatever their title."""
    directory = node.run_dir / "daemons"
    directory.mkdir(exist_ok=True)
    path = directory / name
    if not path.exists():
        shutil.copy(os.path.realpath(node_python()), path)
        path.chmod(0o755)
    return "/run/gpusim/daemons/" + name


def _start_cuda(node, spec, visible, user=None, container=None, pid=0, executable=None, prefix=()):
    path, host_path = _ready_file(node, "cuda")
    spec = dict(spec, ready=path)
    python = "/usr/bin/python3" if user is not None else executable or node_python()
    if user is not None and spec["title"]:
        raise ValueError("a title needs setproctitle, which only the venv's Python has")
    environment = ["env", "CUDA_VISIBLE_DEVICES=" + ",".join(str(i) for i in visible)] if visible is not None else []
    argv = list(prefix) + environment + [python, "-c", CUDA_PROCESS, json.dumps(spec)]
    if container is not None:
        container.launch(argv, pid=pid)
        return _await_ready(host_path, "CUDA process %s in a container" % (spec,))[1]
    if pid:
        node.exec(node_python(), "-c", _LAUNCH_AT_PID, str(pid), *argv)
        return _await_ready(host_path, "CUDA process %s" % (spec,))[0]
    _launch(node, argv, user=user)
    return _await_ready(host_path, "CUDA process %s" % (spec,))[0]


def start_cuda_init(node, visible=None, title=None, user=None):
    """Start a process that only initialized CUDA (cuInit; torch.cuda.is_available()): no context; return its PID.
    It holds nvidiactl, nvidia-uvm twice and each visible GPU's file four times, maps each visible GPU's file `-w-s`
    (64 KiB, twice) and nvidiactl `r--s` (4 KiB)."""
    return start_cuda_process(node, [], 0, visible=visible, title=title, user=user)


def start_nvml_monitor(node, title="nvidia_gpu_exporter"):
    """Start an NVML-only client (an exporter, nvtop...) titled `title`; return its PID. It called
    pynvml.nvmlInit() through the node's driver library and stays initialized: it holds
    /dev/nvidiactl, every /dev/nvidiaN, /dev/nvidia-uvm twice and the caps files, maps nothing and has
    no context."""
    path, host_path = _ready_file(node, "nvml")
    _launch(node, [node_python(), "-c", NVML_MONITOR, title, path])
    return _await_ready(host_path, "NVML monitor %s" % title)[0]


def start_nvidia_smi(node):
    """Start an `nvidia-smi -l 1`-like process (comm nvidia-smi): an NVML client that also holds each GPU's file
    three more times and maps nvidiactl `r--s` (4 KiB); return its PID."""
    path, host_path = _ready_file(node, "nvidia-smi")
    _launch(node, [node_python(), "-c", NVIDIA_SMI, SIM_DIR, path])
    return _await_ready(host_path, "nvidia-smi -l 1")[0]


def start_mps(node, gpus, server_mib=32):
    """Start an MPS control daemon (nvidia-cuda-mps-control: CUDA initialized on `gpus`, no context) and its MPS
    server (nvidia-cuda-mps-server, its child: a context of `server_mib` MiB on each of `gpus`, listed as a
    compute process). Return (control PID, server PID)."""
    server_path, server_host_path = _ready_file(node, "mps-server")
    control_path, control_host_path = _ready_file(node, "mps-control")
    # The server runs nvidia-cuda-mps-server (its executable, as the real one: protected by what it is, not a title).
    spec = cuda_spec(gpus, server_mib, visible=gpus, kind="MPS_SERVER")
    spec["executable"] = daemon_executable(node, "nvidia-cuda-mps-server")
    minors = [node.info["gpus"][index]["minor"] for index in gpus]
    argv = [node_python(), "-c", MPS_CONTROL, json.dumps(dict(spec, ready=server_path)), CUDA_PROCESS, control_path]
    _launch(node, argv + [json.dumps(minors)])
    control = _await_ready(control_host_path, "MPS control daemon")[0]
    return control, _await_ready(server_host_path, "MPS server")[0]


def start_mps_client(node, gpus, mib=1024, title=None):
    """Start an MPS client with `mib` MiB on each of `gpus` (a context's files and mappings; the driver lists it in
    the compute list and the MPS list with the same memory); return its PID."""
    return start_cuda_process(node, gpus, mib, mps=True, title=title)


def start_ipc_pair(node, gpu, mib=1024, importer_mib=0):
    """Start a CUDA IPC exporter (a context with `mib` MiB on GPU index `gpu`) and an importer (its own context
    of `importer_mib` MiB, the exporter's `mib` imported: charged to the exporter while the exporter's context
    lives, to the importer once it is gone); return (exporter PID, importer PID)."""
    exporter = start_cuda_process(node, [gpu], mib, visible=[gpu])
    return exporter, start_cuda_process(node, [gpu], importer_mib, visible=[gpu], ipc=(exporter, mib))


class Container:
    """A nested PID namespace inside a node (`unshare --pid --fork --mount-proc`), as a container
    without the host PID namespace: its processes have their own PIDs, the driver lists node PIDs.

    `init`: its PID 1's PID in the node. `python`: an interpreter wrapper (ansible_python_interpreter)
    that runs the venv's Python inside the container; `inventory(tmp_path)` writes an inventory of it.
    """

    def __init__(self, node, tmp_path):
        self.node = node
        path, host_path = _ready_file(node, "container")
        user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        _launch(
            node,
            [
                "unshare",
                *user,
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                node_python(),
                "-c",
                CONTAINER_INIT,
                path,
            ],
        )
        self.init = _await_ready(host_path, "container init")[0]
        import shlex
        from simnode import gpunode

        enter_node = gpunode.nsenter_argv(node.info, ".")
        enter_node = ['--wd="$PWD"' if arg.startswith("--wd=") else shlex.quote(arg) for arg in enter_node]
        self.python = tmp_path / ("container-%d-python" % self.init)
        self.python.write_text(
            "#!/bin/sh\nexec %s %s \"$@\"\n"
            % (" ".join(enter_node), " ".join(shlex.quote(arg) for arg in self.enter_argv() + [node_python()]))
        )
        self.python.chmod(0o755)

    def enter_argv(self):
        """Command prefix (run inside the node) that runs the rest inside the container."""
        return ["nsenter", "--target", str(self.init), "--pid", "--mount", "--wd=/", "--"]

    def launch(self, argv, pid=0):
        """Start argv detached in the container, with container PID `pid` if > 0; return its PID there."""
        out = self.node.exec(*self.enter_argv(), node_python(), "-c", _LAUNCH_AT_PID, str(pid), *argv).stdout
        return int(out.split()[-1])

    def processes(self):
        """{pid: (ppid, state, comm, cmdline)} as seen inside the container."""
        out = self.node.exec(*self.enter_argv(), node_python(), "-c", _PS).stdout
        return {int(p): tuple(v) for p, v in json.loads(out).items()}

    def inventory(self, tmp_path, name="container"):
        path = tmp_path / ("%s.ini" % name)
        # gpuops_nvidia_venv empty (no venv): the modules run through the wrapper, inside the container (tests/sim/gpunode.py).
        path.write_text(
            "[gpunodes]\n%s ansible_connection=local ansible_python_interpreter=%s gpuops_nvidia_venv=''\n"
            % (name, self.python)
        )
        return path


# Prints [[path, file position], ...] of the /dev/nvidia* fds of process argv[1] (all threads).
_DEVICE_FDS = r"""
import json, os, sys
pid = sys.argv[1]
out = set()
for tid in os.listdir("/proc/%s/task" % pid):
    base = "/proc/%s/task/%s" % (pid, tid)
    for fd in os.listdir(base + "/fd"):
        try:
            target = os.readlink("%s/fd/%s" % (base, fd))
            pos = int(open("%s/fdinfo/%s" % (base, fd)).readline().split()[1])
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            out.add((fd, target, pos))
print(json.dumps(sorted([t, p] for _fd, t, p in out)))
"""


def device_fds(node, pid):
    """Sorted [(device path, file position)] of the NVIDIA device fds process `pid` holds (one entry
    per open fd; threads sharing a table counted once)."""
    return [tuple(x) for x in json.loads(node.py(_DEVICE_FDS, str(pid)))]


# Prints [[path, perms, KiB, offset, start address], ...] of the /dev/nvidia* lines of /proc/argv[1]/maps.
_DEVICE_MAPS = r"""
import json, sys
out = []
for line in open("/proc/%s/maps" % sys.argv[1]):
    fields = line.split()
    if len(fields) >= 6 and fields[5].startswith("/dev/nvidia"):
        start, end = (int(x, 16) for x in fields[0].split("-"))
        out.append([fields[5], fields[1], (end - start) // 1024, int(fields[2], 16), start])
print(json.dumps(sorted(out)))
"""


def device_maps(node, pid):
    """Sorted [(device path, permissions, KiB, file offset, start address)] of process `pid`'s mappings of NVIDIA
    device files (/proc/PID/maps), one entry per mapping."""
    return [tuple(x) for x in json.loads(node.py(_DEVICE_MAPS, str(pid)))]


def driver_lists(node):
    """Per GPU index: {"used": MiB, "compute": {pid: MiB}, "mps": {pid: MiB}} from the node's driver."""
    return [
        {"used": used, "compute": {int(k): v for k, v in compute.items()}, "mps": {int(k): v for k, v in mps.items()}}
        for used, compute, mps in json.loads(node.py(_LISTS))
    ]


_LISTS = r"""
import json, pynvml as n
n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    out.append([n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used >> 20,
                {p.pid: p.usedGpuMemory >> 20 for p in n.nvmlDeviceGetComputeRunningProcesses(h)},
                {p.pid: p.usedGpuMemory >> 20 for p in n.nvmlDeviceGetMPSComputeRunningProcesses(h)}])
print(json.dumps(out))
"""


def processes(node):
    """{pid: (ppid, state, comm, cmdline)} of every process in the node."""
    return {int(pid): tuple(v) for pid, v in json.loads(node.py(_PS)).items()}


def alive(node, pid):
    """True when `pid` exists in the node and is not a zombie."""
    entry = processes(node).get(pid)
    return entry is not None and entry[1] != "Z"


def gpu_memory(node):
    """[(used MiB, [compute PIDs])] per GPU index, as the node's driver reports them."""
    return [tuple(x) for x in json.loads(node.py(_MEMORY))]


def start_holder(node, gpus, mib=1024, mode="hold", title=None):
    """Start a CUDA process with a context of `mib` MiB on each of `gpus`, started with
    CUDA_VISIBLE_DEVICES = those GPUs (see start_cuda_process); return its PID (for mode inherit:
    the forked child's, which holds the handles after its parent's exit)."""
    return start_cuda_process(node, gpus, mib, visible=gpus, mode=mode, title=title)


def _context_files(node):
    return set(node.exec("ls", "/run/gpusim/contexts").stdout.split())


def node_python():
    from simnode import VENV_PYTHON

    return str(VENV_PYTHON)


def start_vllm(node, *args, env=None):
    """Start `vllm serve ...` detached in the node; return its API server PID once every rank of this
    instance holds its GPU (other instances on the node are left out of the count).

    Without --port in `args` the server gets a free port of its own (tests/ports.py), on loopback unless `args` name
    --host: nodes share this machine's network, and vLLM's default 0.0.0.0:8000 would be raced for by parallel tests
    and the bench's nodes (the loser's listen() fails once its engines are ready, and the API server exits)."""
    given = {arg.split("=", 1)[0] for arg in args}
    if "--port" not in given:
        args = (*args, "--port", str(free_ports(1)[0])) + (() if "--host" in given else ("--host", "127.0.0.1"))
    before = set(processes(node))
    prefix = " ".join("%s=%s" % kv for kv in (env or {}).items())
    node.exec("sh", "-c", "%s setsid -f vllm serve %s >/dev/null 2>&1" % (prefix, " ".join(args)))
    world = 1
    for flags in (("--tensor-parallel-size", "-tp"), ("--pipeline-parallel-size", "-pp")):
        for flag in flags:
            if flag in args:
                world *= int(args[args.index(flag) + 1])

    def ready():
        procs = processes(node)
        api = [pid for pid, v in procs.items() if "bin/vllm serve" in v[3] and v[1] != "Z" and pid not in before]
        if not api:
            return None
        tree, grown = {api[0]}, True
        while grown:
            children = {pid for pid, v in procs.items() if v[0] in tree} - tree
            tree |= children
            grown = bool(children)
        title = "VLLM::Worker" if world > 1 else "VLLM::EngineCore"
        ranks = {pid for pid in tree if procs[pid][3].startswith(title) and procs[pid][1] != "Z"}
        listed = {pid for _used, pids in gpu_memory(node) for pid in pids}
        return api[0] if len(ranks) == world and ranks <= listed else None

    return wait_for(ready, 60, 0.2, "vllm serve to hold its GPUs")


def vllm_instance(node, api_server):
    """(EngineCore PIDs, GPU rank PIDs) of the vLLM instance whose API server is `api_server`
    (also after the API server is gone: EngineCore and workers keep their titles)."""
    procs = processes(node)
    tree, grown = {api_server}, True
    while grown:
        children = {pid for pid, v in procs.items() if v[0] in tree} - tree
        tree |= children
        grown = bool(children)
    engines = sorted(
        p for p in tree if procs.get(p, ("", "Z"))[1] != "Z" and procs[p][3].startswith("VLLM::EngineCore")
    )
    workers = sorted(p for p in tree if procs.get(p, ("", "Z"))[1] != "Z" and procs[p][3].startswith("VLLM::Worker"))
    return engines, workers


def vllm_tree(node):
    """PIDs of the node's EngineCore processes and TP workers: (enginecores, workers)."""
    procs = processes(node)
    engines = sorted(pid for pid, v in procs.items() if v[3].startswith("VLLM::EngineCore") and v[1] != "Z")
    workers = sorted(pid for pid, v in procs.items() if v[3].startswith("VLLM::Worker_TP") and v[1] != "Z")
    return engines, workers


# The simulated vLLM started by `python -c`, not by `vllm serve` (a container's entrypoint of its own).
CONTAINED_SERVER = "import sys; sys.path.insert(0, %r); from simvllm.cli import main; sys.exit(main(%r))"


def health(port):
    """The status of GET /health (None when nothing answers)."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=3) as answer:  # noqa: S310
            return answer.status
    except OSError as error:  # an HTTP error status (HTTPError) has its code
        return getattr(error, "code", None)


def start_contained_server(node, gpu):
    """A vLLM server on GPU `gpu` whose API server is the init of its own PID namespace (`unshare --pid --fork
    --mount-proc`, as a container without the host's PID namespace). Returns (API server, EngineCore: node PIDs,
    port, its log here) once /health answers 200; the log records each signal the server or its engine handles."""
    (port,) = free_ports(1)
    code = CONTAINED_SERVER % (SIM_DIR, ["serve", "/models/m", "--port", str(port), "--host", "127.0.0.1"])
    launch = 'CUDA_VISIBLE_DEVICES=%d setsid -f unshare --pid --fork --mount-proc "$0" -c "$1" >"$2" 2>&1' % gpu
    node.exec("sh", "-c", launch, node_python(), code, "/run/gpusim/contained-%d.log" % port)
    log = node.run_dir / ("contained-%d.log" % port)
    wait_for(lambda: health(port) == 200, 60, 0.2, "the contained server's /health", log=log.read_text)
    procs = processes(node)
    (api,) = [p for p, v in procs.items() if "simvllm.cli" in v[3] and procs.get(v[0], ("",) * 3)[2] == "unshare"]
    (engine,) = [p for p, v in procs.items() if v[0] == api and v[3] == "VLLM::EngineCore"]
    return api, engine, port, log


# A GPU daemon's stand-in (stdlib only: it runs a root-owned copy of the node's Python named as the daemon, so
# /proc/PID/exe names it). It holds what the daemon holds: nvidia-persistenced keeps nvidiactl and every GPU's file
# open (the persistence daemon "prevents the driver from releasing device state when the device is not in use",
# nvidia-persistenced(1)); nv-hostengine and dcgm-exporter are NVML clients (nvidiactl, every GPU's file, nvidia-uvm
# twice; tests/sim/README.md, "Device files per process kind"). argv[1]: "persistenced" or "nvml".
GPU_DAEMON = r"""
import os, sys, time
files = ["/dev/nvidiactl"] + sorted("/dev/" + name for name in os.listdir("/dev")
                                    if name.startswith("nvidia") and name[6:].isdigit())
if sys.argv[1] == "nvml":
    files += ["/dev/nvidia-uvm", "/dev/nvidia-uvm"]
fds = [os.open(path, os.O_RDWR) for path in files]
time.sleep(3600)
"""


def add_units(node, units):
    """Merge `units` ({name: settings}) into the node's unit table (Node.set_units replaces it)."""
    path = node.run_dir / "units.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    table.update(units)
    node.set_units(table)


def start_gpu_daemon_unit(node, unit, executable, kind="nvml", timeout=10.0):
    """Start a GPU daemon's stand-in (`executable`: nvidia-persistenced, nv-hostengine, ...; `kind` as GPU_DAEMON)
    as systemd unit `unit` through the node's systemctl, as the host's system manager starts it; return its PID.
    The unit keeps its ExecStart, so `systemctl start` brings it back after a stop."""
    path = daemon_executable(node, executable)
    add_units(node, {unit: {"ExecStart": [path, "-c", GPU_DAEMON, kind], "TimeoutStopSec": 5}})
    node.exec("systemctl", "start", unit)
    return int(wait_for(lambda: unit_main_pid(node, unit), timeout, 0.02, "%s started" % unit))


def unit_main_pid(node, unit):
    """The PID of `unit`'s process as the node's systemctl shows it (0 when the unit is not active)."""
    return int(node.exec("systemctl", "show", "-p", "MainPID", "--value", unit).stdout.strip() or 0)


def log_kernel(node, message, priority=3):
    """Append one record to the node's kernel log (/dev/kmsg, an empty regular file at up) in /dev/kmsg's format,
    PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;MESSAGE (Linux Documentation/ABI/testing/dev-kmsg), stamped with the
    host's time since boot, as the kernel stamps its records."""
    with open("/proc/uptime") as uptime:
        microseconds = int(float(uptime.read().split()[0]) * 1_000_000)
    node.py(
        "import sys\n"
        "with open('/dev/kmsg', 'r+') as f:\n"
        "    sequence = sum(1 for _line in f if not _line.startswith(' '))\n"
        "    f.write('%s,%d,%s,-;%s\\n' % (sys.argv[1], sequence, sys.argv[2], sys.argv[3]))\n",
        str(priority),
        str(microseconds),
        message,
    )


def log_xid(node, index, xid, text):
    """Log Xid `xid` for GPU `index` of `node` as the driver does: NVRM: Xid (PCI:DDDD:BB:DD): N, TEXT
    (open-gpu-kernel-modules, the Xid lines of issue 1151 and discussion 1327)."""
    domain, bus, device_function = node.info["gpus"][index]["pci_bus_id"].split(":")
    pci = "%04x:%s:%s" % (int(domain, 16), bus.lower(), device_function.split(".")[0].lower())
    log_kernel(node, "NVRM: Xid (PCI:%s): %d, %s" % (pci, xid, text))
