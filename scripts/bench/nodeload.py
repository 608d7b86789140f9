"""Fill a simulated GPU node with processes, open fds and GPU holders (for scan benchmarks and tests).

    load = populate(node, processes=2000, fds=100_000, holders=36, threads=8)
    load["holders"]          # PIDs (in the node) that hold an NVIDIA device file, by design
    populate(node, ..., kinds=("fd", "cuda", "mapping"))  # holder kinds, in turn (default: all four, below)
    load["processes"], load["fds"]   # what the node then has in total (counted from its /proc)
    tree = orphaned_tree(node, tp=8)  # {"engine": PID, "workers": [PID...]}: a light orphaned vLLM tree

Everything is created by one launcher process inside the node (detached, stdio on /dev/null), which
forks the rest without exec, so 2,000 processes take a second or two and little memory:
- idle sleepers (3 fds each: stdio on /dev/null);
- fd helpers, each opening thousands of fds on /dev/null (most of the node's fds);
- GPU holders creating contexts per tests/sim/README.md, each with `threads` idle threads. Each maps what a
  real context maps (tests/sim/simcuda.py map_context: its GPU's file rw-s, nvidiactl, nvidia-uvm), the evidence
  the collection needs (docs/attribution.md). Four kinds, by how the simulator's handle is held: fd (the
  device file's fd), cuda (the fd, and /dev/nvidiactl and /dev/nvidia-uvm kept open, as a CUDA process),
  mapping (the simulator's token by a mapping, the fd closed) and inherited (a child that only inherited
  the parent's handles and mappings; the parent exits). The driver lists a context by its creator's PID, so
  an inherited holder leaves a dead creator listed: the modules' looks then scan all of /proc. Without the
  inherited kind every listed PID is a live holder and the lists explain the memory;
- control-only holders (/dev/nvidiactl and /dev/nvidia-uvm, no GPU), like a monitoring agent.
The processes end with the node (gpunode down).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

# Runs inside the node: python -c LOAD_PROGRAM SPEC_JSON. Writes /run/gpusim/load.json when done.
LOAD_PROGRAM = r"""
import ctypes, json, mmap, os, resource, signal, sys, threading

spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["sim_dir"])
import simcuda
conf = dict(line.strip().split("=", 1) for line in open("/run/gpusim/node.conf") if "=" in line)
minors = [int(x) for x in conf["minors"].split(",")]
ready_r, ready_w = os.pipe()
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]


launcher = os.getpid()


def idle():
    while True:
        signal.pause()


def child(body):
    # Fork a child that runs body(), reports one byte on the ready pipe and idles; returns its PID.
    pid = os.fork()
    if pid:
        return pid
    try:
        if os.getppid() == launcher:
            os.close(ready_r)
        body()
        os.write(ready_w, b"x")
        os.close(ready_w)
        idle()
    finally:
        os._exit(1)


def open_many(count):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 64
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, max(hard, wanted)))
    for _ in range(count):
        os.open("/dev/null", os.O_RDONLY)


def start_threads(count):
    for _ in range(count):
        threading.Thread(target=idle, daemon=True).start()


def create_context(index, mib):
    # Open /dev/nvidia<minor>, map what a context maps, seek to our PID (the token), write the context file;
    # return the fd.
    pid = os.getpid()
    fd = os.open("/dev/nvidia%d" % minors[index], os.O_RDWR)
    ctl, uvm = os.open("/dev/nvidiactl", os.O_RDWR), os.open("/dev/nvidia-uvm", os.O_RDWR)
    simcuda.map_context(fd, ctl, uvm)
    os.close(ctl)
    os.close(uvm)
    os.lseek(fd, pid, os.SEEK_SET)
    temporary = "/run/gpusim/contexts/.%d" % pid
    with open(temporary, "w") as context:
        context.write("%d %d\n" % (index, mib))
    os.rename(temporary, "/run/gpusim/contexts/%d" % pid)
    return fd


def holder(kind, index, mib, threads):
    def body():
        if kind == "cuda":
            os.open("/dev/nvidiactl", os.O_RDWR)
            os.open("/dev/nvidia-uvm", os.O_RDWR)
        fd = create_context(index, mib)
        if kind == "mapping":
            # Python's mmap refuses to map past the end of the (empty) file: map it with libc.
            if libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, os.getpid() * 4096) in (None, 2 ** 64 - 1):
                raise OSError(ctypes.get_errno(), "mmap of the device file failed")
            os.close(fd)
        if kind == "inherited":
            grandchild = child(lambda: start_threads(threads))
            os.write(ready_w, ("%d " % grandchild).encode())
            os._exit(0)
        start_threads(threads)
    return body


def control_only():
    os.open("/dev/nvidiactl", os.O_RDWR)
    os.open("/dev/nvidia-uvm", os.O_RDWR)


pids = {"sleepers": [], "fd_helpers": [], "holders": [], "control_only": [], "inherited_parents": []}
for count in spec["fd_helper_fds"]:
    pids["fd_helpers"].append(child(lambda count=count: open_many(count)))
kinds = spec["kinds"]
for number in range(spec["holders"]):
    kind = kinds[number % len(kinds)]
    pid = child(holder(kind, number % len(minors), spec["holder_mib"], spec["threads"]))
    (pids["inherited_parents"] if kind == "inherited" else pids["holders"]).append(pid)
for _ in range(spec["control_only"]):
    pids["control_only"].append(child(control_only))
for _ in range(spec["sleepers"]):
    pids["sleepers"].append(child(lambda: None))
os.close(ready_w)
# Every child writes "x" once ready; an inherited holder's parent writes its child's PID and exits,
# and that child writes the "x".
expected = sum(len(pids[kind]) for kind in ("fd_helpers", "holders", "control_only", "sleepers", "inherited_parents"))
report = b""
while report.count(b"x") < expected or len(report.replace(b"x", b"").split()) < len(pids["inherited_parents"]):
    chunk = os.read(ready_r, 65536)
    if not chunk:
        break
    report += chunk
pids["holders"] += [int(text) for text in report.replace(b"x", b"").split()]
for parent in pids["inherited_parents"]:
    os.waitpid(parent, 0)
pids["launcher"] = os.getpid()
with open("/run/gpusim/.load.json", "w") as out:
    json.dump(pids, out)
os.rename("/run/gpusim/.load.json", "/run/gpusim/load.json")
idle()
"""

# Counts the node's processes and open fds (threads sharing a table counted once), inside the node.
_COUNT_PROGRAM = r"""
import json, os
processes = fds = 0
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            fds += os.stat("/proc/%s/fd" % name).st_size or len(os.listdir("/proc/%s/fd" % name))
        except OSError:
            continue
        processes += 1
print(json.dumps({"processes": processes, "fds": fds}))
"""

# Runs inside the node: python -c TREE_PROGRAM TP. The shape of an orphaned vLLM TP tree, made by forks
# only: the "API server" forks VLLM::EngineCore, which forks VLLM::Worker_TP<i> holding GPU i (one
# context of 1024 MiB each, per tests/sim/README.md); once every worker holds its GPU the API server
# writes /run/gpusim/tree.json and exits, orphaning the rest. The engine exits when its workers are gone.
TREE_PROGRAM = r"""
import json, os, signal, sys
import setproctitle

tp = int(sys.argv[1])
sys.path.insert(0, sys.argv[2])
import simcuda
conf = dict(line.strip().split("=", 1) for line in open("/run/gpusim/node.conf") if "=" in line)
minors = [int(x) for x in conf["minors"].split(",")]
ready_r, ready_w = os.pipe()
engine = os.fork()
if engine == 0:
    os.close(ready_r)
    setproctitle.setproctitle("VLLM::EngineCore")
    workers = []
    for rank in range(tp):
        worker = os.fork()
        if worker == 0:
            setproctitle.setproctitle("VLLM::Worker_TP%d" % rank)
            pid = os.getpid()
            # A context: its GPU's device file mapped rw-s (the evidence of a context, docs/attribution.md),
            # nvidiactl and nvidia-uvm besides (simcuda.cuda_process, as tests/sim/README.md says).
            simcuda.cuda_process("/dev", [minors[rank]], [minors[rank]], simcuda.CONTEXT, token=pid)
            with open("/run/gpusim/contexts/.%d" % pid, "w") as context:
                context.write("%d 1024\n" % rank)
            os.rename("/run/gpusim/contexts/.%d" % pid, "/run/gpusim/contexts/%d" % pid)
            os.write(ready_w, b"%d " % pid)
            os.close(ready_w)
            while True:
                signal.pause()
        workers.append(worker)
    os.close(ready_w)
    for _ in workers:
        os.wait()
    os._exit(0)
os.close(ready_w)
report = b""
while len(report.split()) < tp:
    chunk = os.read(ready_r, 4096)
    if not chunk:
        sys.exit("a worker died before holding its GPU")
    report += chunk
with open("/run/gpusim/.tree.json", "w") as out:
    json.dump({"engine": engine, "workers": [int(pid) for pid in report.split()]}, out)
os.rename("/run/gpusim/.tree.json", "/run/gpusim/tree.json")
"""

SIM_DIR = Path(__file__).resolve().parents[2] / "tests" / "sim"
SLEEPER_FDS = 3
FD_HELPER_MAX_FDS = 10_000


KINDS = ("fd", "cuda", "mapping", "inherited")


def plan(
    processes: int,
    fds: int,
    holders: int,
    threads: int,
    control_only: int = 2,
    holder_mib: int = 100,
    kinds: tuple[str, ...] = KINDS,
) -> dict:
    """The launcher's spec for a node of about `processes` processes and `fds` open fds in total.

    Holders (of `kinds` in turn), control-only holders and fd helpers count toward `processes`; the fds left after
    every process's stdio go to fd helpers of at most FD_HELPER_MAX_FDS each. Raises ValueError
    when `processes` is too small for the holders.
    """
    spread = max(0, fds - processes * SLEEPER_FDS)
    helper_count = max(1, -(-spread // FD_HELPER_MAX_FDS))
    fd_helper_fds = [spread // helper_count + (1 if i < spread % helper_count else 0) for i in range(helper_count)]
    # The launcher itself is one more process; an inherited holder's parent exits.
    sleepers = processes - 1 - helper_count - holders - control_only
    if sleepers < 0:
        raise ValueError("%d processes cannot hold %d holders and %d fd helpers" % (processes, holders, helper_count))
    return {
        "sleepers": sleepers,
        "fd_helper_fds": fd_helper_fds,
        "holders": holders,
        "threads": threads,
        "control_only": control_only,
        "holder_mib": holder_mib,
        "kinds": list(kinds),
    }


def count(node) -> dict:
    """{"processes", "fds"} of the node now (fds of a thread group counted once)."""
    return json.loads(node.py(_COUNT_PROGRAM))


def populate(
    node,
    processes: int,
    fds: int,
    holders: int,
    threads: int = 8,
    control_only: int = 2,
    timeout: float = 120.0,
    kinds: tuple[str, ...] = KINDS,
) -> dict:
    """Create the load described in this module's docstring in `node`; return what was made.

    Returns {"holders": [PID...] (every process holding a GPU's device file), "control_only": [PID...],
    "sleepers", "fd_helpers", "launcher", "processes" and "fds" (counted afterwards)}. PIDs are the
    node's. Raises TimeoutError when the launcher has not reported after `timeout` seconds.
    """
    spec = dict(plan(processes, fds, holders, threads, control_only, kinds=kinds), sim_dir=str(SIM_DIR))
    node.exec(
        "sh",
        "-c",
        'setsid -f "$0" -c "$1" "$2" </dev/null >/dev/null 2>&1',
        str(node_python()),
        LOAD_PROGRAM,
        json.dumps(spec),
    )
    made = json.loads(
        _wait_for_file(Path(node.run_dir) / "load.json", timeout, "the load launcher in node %s" % node.name)
    )
    made.update(count(node))
    return made


def orphaned_tree(node, tp: int = 8, timeout: float = 60.0) -> dict:
    """Start TREE_PROGRAM's orphaned TP tree in `node`; return {"engine": PID, "workers": [PID...]} (node PIDs).

    Raises TimeoutError when it has not reported after `timeout` seconds.
    """
    report = Path(node.run_dir) / "tree.json"
    report.unlink(missing_ok=True)
    node.exec(
        "sh",
        "-c",
        'setsid -f "$0" -c "$1" "$2" "$3" </dev/null >/dev/null 2>&1',
        str(node_python()),
        TREE_PROGRAM,
        str(tp),
        str(SIM_DIR),
    )
    return json.loads(_wait_for_file(report, timeout, "the TP tree in node %s" % node.name))


def _wait_for_file(path: Path, timeout: float, what: str) -> str:
    """Text of `path` once it exists (written by rename, so complete); TimeoutError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return path.read_text()
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise TimeoutError("%s did not report within %.0f s" % (what, timeout)) from None
            time.sleep(0.02)


def node_python() -> Path:
    """The venv Python the nodes run."""
    return Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"
