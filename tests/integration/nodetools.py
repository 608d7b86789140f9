"""What tests look at inside a simulated node: processes, GPU memory, vLLM trees, holders they start."""

from __future__ import annotations

import json
import time

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

# A process creating a context of MIB MiB on each GPU index given (contract: tests/sim/README.md),
# then optionally forking a child that only inherits the handles (the parent then exits).
HOLDER = r"""
import os, sys, time
gpus = [int(x) for x in sys.argv[1].split(",")]
mib = int(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else "hold"
conf = dict(line.strip().split("=", 1) for line in open("/run/gpusim/node.conf") if "=" in line)
minors = [int(x) for x in conf["minors"].split(",")]
pid = os.getpid()
fds = []
for index in gpus:
    fd = os.open("/dev/nvidia%d" % minors[index], os.O_RDWR)
    os.lseek(fd, pid, os.SEEK_SET)
    fds.append(fd)
tmp = "/run/gpusim/contexts/.%d" % pid
with open(tmp, "w") as f:
    f.write("".join("%d %d\n" % (index, mib) for index in gpus))
os.rename(tmp, "/run/gpusim/contexts/%d" % pid)
if mode == "inherit":
    if os.fork() == 0:
        time.sleep(3600)
        os._exit(0)
    os._exit(0)
if mode == "ignore-term":
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(3600)
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


def wait_for(predicate, timeout=30.0, interval=0.1, what="condition"):
    """Poll `predicate()` until truthy; return its value, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(interval)


def start_holder(node, gpus, mib=1024, mode="hold", title=None):
    """Start a holder process in the node (see HOLDER); return its PID (for mode inherit: the child's)."""
    code = HOLDER
    if title:
        code = "import setproctitle; setproctitle.setproctitle(%r)\n" % title + code
    argv = ",".join(str(g) for g in gpus), str(mib), mode
    node.exec("sh", "-c", "setsid -f \"$0\" -c \"$1\" \"$2\" \"$3\" \"$4\" >/dev/null 2>&1",
              node_python(), code, *argv)
    marker = ",".join(str(g) for g in gpus)

    def find():
        for pid, (ppid, state, comm, cmd) in processes(node).items():
            if state == "Z":
                continue
            if cmd == title if title else cmd.endswith(" %s %d %s" % (marker, mib, mode)):
                if mode != "inherit" or (ppid == 1 and str(pid) not in _context_files(node)):
                    return pid
        return None
    return wait_for(find, 15, what="holder %s" % (argv,))


def _context_files(node):
    return set(node.exec("ls", "/run/gpusim/contexts").stdout.split())


def node_python():
    from simnode import VENV_PYTHON
    return str(VENV_PYTHON)


def start_vllm(node, *args, env=None):
    """Start `vllm serve ...` detached in the node; return its API server PID once every rank holds its GPU."""
    prefix = " ".join("%s=%s" % kv for kv in (env or {}).items())
    node.exec("sh", "-c", "%s setsid -f vllm serve %s >/dev/null 2>&1" % (prefix, " ".join(args)))
    tp = 1
    for flag in ("--tensor-parallel-size", "-tp"):
        if flag in args:
            tp = int(args[args.index(flag) + 1])

    def ready():
        procs = processes(node)
        api = [pid for pid, v in procs.items() if "bin/vllm serve" in v[3] and v[1] != "Z"]
        ranks = [pid for pid, v in procs.items() if v[3].startswith("VLLM::Worker_TP" if tp > 1 else "VLLM::EngineCore")]
        holding = sum(len(p) for _used, p in gpu_memory(node))
        return api[0] if api and len(ranks) == tp and holding >= tp else None
    return wait_for(ready, 60, 0.2, "vllm serve to hold its GPUs")


def vllm_tree(node):
    """PIDs of the node's EngineCore processes and TP workers: (enginecores, workers)."""
    procs = processes(node)
    engines = sorted(pid for pid, v in procs.items() if v[3].startswith("VLLM::EngineCore") and v[1] != "Z")
    workers = sorted(pid for pid, v in procs.items() if v[3].startswith("VLLM::Worker_TP") and v[1] != "Z")
    return engines, workers
