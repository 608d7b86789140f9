"""Plant a generated world's processes inside a simulated node (run there: `python plant.py WORLD_JSON`).

Standard library, tests/sim/simcuda.py and, for titles, setproctitle. Every planted process:
- records every catchable signal it gets (SIGCHLD aside: the kernel sends it when a child ends) in
  /run/gpusim/worlds/sig/<PID>, one number per line, then acts as the signal's default would (SIGTERM ends it,
  unless it ignores SIGTERM);
- is listed in /run/gpusim/worlds/manifest.json: {"pid", "id" (the world's process id), "role"}.

Kinds (world["procs"][k]["kind"]): holder (a CUDA context on its GPUs; `ignore_term`), trainer (a launcher that stays,
a creator with a context that forks `workers` workers holding its handles, then exits: reaped by the launcher, or a
zombie when the launcher never reaps; `reuse`: a process then takes the creator's number, an NVML client or a holder
with its own context), nvml (an NVML-only client), cuinit (CUDA initialized, no context), sleeper (no GPU file),
daemon (a process titled `name` with a context; `real`: it runs an executable of that name, as the real daemon),
mps (the MPS control daemon and server, real executables, and `clients` MPS clients), vllm (API server, EngineCore
and one worker per TP rank; `api` "killed": the API server is SIGKILLed, its engine and workers go on), ipc (a CUDA
IPC exporter and its importer), smi (`nvidia-smi`, its real executable: NVML only). A holder with
`lifetime` exits by itself that many seconds after it is planted: during the modules' runs.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time

RUN = "/run/gpusim"
WORLD = RUN + "/worlds"
# Signals that end a process by default; the others (SIGCONT, SIGURG, SIGWINCH) are only recorded.
ENDING = {
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGABRT,
    signal.SIGPIPE,
    signal.SIGTSTP,
}
UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}


def record_signals(ignore_term):
    def handler(number, _frame):
        fd = os.open("%s/sig/%d" % (WORLD, os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, b"%d\n" % number)
        os.close(fd)
        if number == signal.SIGTERM and ignore_term:
            return
        if number in ENDING:
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)

    for number in range(1, signal.NSIG):
        if number in UNCATCHABLE or number >= 32:
            continue
        try:
            signal.signal(number, handler)
        except (OSError, ValueError):
            pass


def conf():
    return dict(line.strip().split("=", 1) for line in open(RUN + "/node.conf") if "=" in line)


def minors():
    values = conf()
    count = int(values.get("gpus", 8))
    return [int(x) for x in values["minors"].split(",")] if values.get("minors") else list(range(count))


def title(name):
    if name:
        try:
            import setproctitle
        except ImportError:
            return
        setproctitle.setproctitle(name)


def context(spec, kind="CONTEXT", words=""):
    """Open, map and register a context on spec["gpus"] (simcuda); return the fds (keep them). `kind`: simcuda's
    CONTEXT, MPS_CLIENT (the token on nvidiactl, context lines of type mps) or MPS_SERVER (its own small context)."""
    sys.path.insert(0, spec["sim_dir"])
    import simcuda

    gpus = spec["gpus"]
    table = minors()
    token = simcuda.context_token(RUN, os.getpid())
    mps_client = kind == "MPS_CLIENT"
    fds = simcuda.cuda_process(
        "/dev", table, [table[i] for i in gpus], getattr(simcuda, kind), token, token_on_ctl=mps_client
    )
    mib = spec["mib"] + (int(conf().get("context_overhead_mib") or 0) if kind != "MPS_SERVER" else 0)
    mig = spec.get("gi") or {}
    lines = []
    for index in gpus:
        gi = mig.get(str(index))
        lines.append(
            "%d %d %s%s%s"
            % (index, mib, "mps" if mps_client else "compute", " gi=%d ci=0" % gi if gi is not None else "", words)
        )
        if gi is not None:
            # A context on a MIG instance holds the capability files of its GPU and compute instance (docs/mig.md).
            caps = spec["caps"][str(index)][str(gi)]
            fds += [os.open("/dev/nvidia-caps/nvidia-cap%d" % cap, os.O_RDONLY) for cap in caps]
    simcuda.write_context(RUN, token, lines)
    return fds


def cuda_init(spec):
    sys.path.insert(0, spec["sim_dir"])
    import simcuda

    return simcuda.cuda_process("/dev", minors(), (), simcuda.CUDA_INIT)


def nvml_client():
    library = ctypes.CDLL("libnvidia-ml.so.1")
    assert library.nvmlInit_v2() == 0, "nvmlInit_v2 failed"
    return library


def note(entry):
    """Append one manifest line (the planter collects them)."""
    fd = os.open(WORLD + "/manifest.lines", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, (json.dumps(entry) + "\n").encode())
    os.close(fd)


def hold(keep, lifetime=None):
    """Keep `keep` (fds) open; with `lifetime`, exit after that many seconds (a process that ends during the run)."""
    if lifetime:
        time.sleep(lifetime)
        os._exit(0)
    while True:
        time.sleep(3600)
    return keep


def child(spec, role, body):
    """Fork a process that records signals, runs body(), notes itself and holds; return its PID."""
    pid = os.fork()
    if pid:
        return pid
    try:
        record_signals(spec.get("ignore_term", False))
        keep = body()
        note({"pid": os.getpid(), "id": spec["id"], "role": role, "lifetime": spec.get("lifetime")})
        if spec.get("user") == "nobody":
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
        hold(keep, spec.get("lifetime"))
    finally:
        os._exit(0)


def wait_listed(count):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if len(open(WORLD + "/manifest.lines").read().splitlines()) >= count:
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise SystemExit("planted processes did not report within 60 s")


def set_last_pid(pid):
    with open("/proc/sys/kernel/ns_last_pid", "w") as handle:
        handle.write(str(pid - 1))


def trainer(spec):
    """Launcher → creator (context) → workers; the creator exits once its workers hold the handles."""
    launcher = os.fork()
    if launcher:
        return launcher
    record_signals(False)
    note({"pid": os.getpid(), "id": spec["id"], "role": "launcher"})
    title("torchrun --nproc-per-node %d train.py" % spec["workers"])
    ready_r, ready_w = os.pipe()
    creator = os.fork()
    if creator == 0:
        record_signals(False)
        title(spec.get("title"))
        fds = context(spec)
        for number in range(spec["workers"]):
            if os.fork() == 0:
                record_signals(False)
                title("pt_data_worker")
                note({"pid": os.getpid(), "id": spec["id"], "role": "worker%d" % number})
                hold(fds)
        os.write(ready_w, b"x")
        os._exit(0)
    os.read(ready_r, 1)
    if spec["creator_end"] == "reaped":
        os.waitpid(creator, 0)
        if spec.get("reuse"):
            reuser(spec, creator)
    else:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # Noted only once it is a zombie: a creator still closing its files would be a holder to the oracle's reading.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (
            open("/proc/%d/stat" % creator).read().rsplit(")", 1)[1].split()[0] != "Z"
        ):
            time.sleep(0.005)
    note({"pid": creator, "id": spec["id"], "role": "creator"})
    hold(None)


def reuser(spec, number):
    """A process that gets the dead creator's number: an NVML client, or a holder with a context of its own."""
    set_last_pid(number)
    pid = os.fork()
    if pid == 0:
        record_signals(False)
        if spec["reuse"] == "holder":
            title("python3 serve.py")
            keep = context(dict(spec, gpus=spec["reuse_gpus"]))
        else:
            title("nvidia_gpu_exporter")
            keep = nvml_client()
        note({"pid": os.getpid(), "id": spec["id"], "role": "reuser"})
        hold(keep)
    if pid != number:
        note({"pid": pid, "id": spec["id"], "role": "reuser-missed"})


def daemon(spec):
    """A process titled as a GPU daemon, with a context; real: it runs an executable of that name (exec)."""
    pid = os.fork()
    if pid:
        return pid
    if spec["real"]:
        executable = "%s/daemons/%s" % (RUN, spec["name"])
        os.execv(executable, [spec["name"], os.path.abspath(__file__), "body", json.dumps(spec)])
    body(spec)


def body(spec):
    """The daemon's process after exec (stdlib only: the executable is a copy of the node's Python). `cuda`: simcuda's
    kind (CONTEXT by default; CUDA_INIT: no context); `server`: the spec of a daemon it starts (the MPS server)."""
    record_signals(False)
    title(spec["name"])
    kind = spec.get("cuda", "CONTEXT")
    if kind == "NVML":
        keep = nvml_client()
    else:
        keep = cuda_init(spec) if kind == "CUDA_INIT" else context(spec, kind)
    if spec.get("server"):
        daemon(spec["server"])
    note({"pid": os.getpid(), "id": spec["id"], "role": spec.get("role", "daemon"), "protected": spec["real"]})
    hold(keep)


def mps(spec):
    """An MPS control daemon (CUDA initialized, no context) that starts the MPS server (a context of 32 MiB on the
    GPUs), both running their real executables, and `clients` MPS clients (tests/sim/README.md, MPS)."""
    server = dict(spec, name="nvidia-cuda-mps-server", role="mps-server", real=True, mib=32, cuda="MPS_SERVER")
    daemon(dict(spec, name="nvidia-cuda-mps-control", role="mps-control", real=True, cuda="CUDA_INIT", server=server))
    for number in range(spec["clients"]):
        client = dict(spec, title=spec["title"])
        child(client, "mps-client%d" % number, lambda c=client: (title(c["title"]), context(c, "MPS_CLIENT")))


def ipc(spec):
    """A CUDA IPC exporter (a context of `mib` MiB on its GPU) and an importer (its own context, the exporter's `mib`
    imported: tests/sim/README.md, "CUDA IPC"), the importer started once the exporter's context is registered."""
    ready_r, ready_w = os.pipe()

    def exporter():
        title(spec["title"])
        fds = context(spec)
        os.write(ready_w, b"%d" % fds_token(fds))
        return fds

    child(spec, "exporter", exporter)
    token = int(os.read(ready_r, 32))
    importer = dict(spec, mib=0, title="python3 ipc_consumer.py")
    words = " ipc=%d:%d" % (token, spec["mib"])
    child(importer, "importer", lambda: (title(importer["title"]), context(importer, words=words)))


def fds_token(fds):
    """The token of a context (the position of its GPU device file's fd: tests/sim/README.md)."""
    for fd in fds:
        if os.readlink("/proc/self/fd/%d" % fd).startswith("/dev/nvidia") and os.lseek(fd, 0, os.SEEK_CUR):
            return os.lseek(fd, 0, os.SEEK_CUR)
    raise SystemExit("no context token")


def vllm(spec):
    """vLLM's tree: the API server starts EngineCore, which starts one worker per TP rank, each through
    multiprocessing (the starter keeps the read end of a pipe its child holds the write end of:
    Process.sentinel). TP 1: EngineCore holds the context; TP 2: each worker holds a context on its GPU."""
    api = os.fork()
    if api:
        return api
    record_signals(False)
    title("python3 -m vllm.entrypoints.openai.api_server --model m --tensor-parallel-size %d" % len(spec["gpus"]))
    note({"pid": os.getpid(), "id": spec["id"], "role": "api"})
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        record_signals(spec.get("ignore_term", False))
        title("VLLM::EngineCore")
        keep = [write]
        if len(spec["gpus"]) == 1:
            keep.append(context(spec))
        for rank, index in enumerate(spec["gpus"] if len(spec["gpus"]) > 1 else ()):
            sentinel, end = os.pipe()
            if os.fork() == 0:
                os.close(sentinel)
                record_signals(spec.get("ignore_term", False))
                title("VLLM::Worker_TP%d" % rank)
                fds = context(dict(spec, gpus=[index]))
                note({"pid": os.getpid(), "id": spec["id"], "role": "worker%d" % rank})
                hold([end, fds])
            os.close(end)
            keep.append(sentinel)
        note({"pid": os.getpid(), "id": spec["id"], "role": "engine"})
        hold(keep)
    os.close(write)
    hold(read)


def plant(world):
    os.makedirs(WORLD + "/sig", exist_ok=True)
    os.chmod(WORLD + "/sig", 0o1777)
    expected = 0
    killed = []
    for spec in world["procs"]:
        spec = dict(spec, sim_dir=world["sim_dir"], caps=world.get("caps", {}))
        kind = spec["kind"]
        if kind == "trainer":
            trainer(spec)
            expected += 2 + spec["workers"] + (1 if spec.get("reuse") and spec["creator_end"] == "reaped" else 0)
        elif kind == "daemon":
            daemon(spec)
            expected += 1
        elif kind == "mps":
            mps(spec)
            expected += 2 + spec["clients"]
        elif kind == "ipc":
            ipc(spec)
            expected += 2
        elif kind == "smi":
            daemon(dict(spec, name="nvidia-smi", real=True, cuda="NVML", role="smi"))
            expected += 1
        elif kind == "vllm":
            api = vllm(spec)
            expected += 2 + (len(spec["gpus"]) if len(spec["gpus"]) > 1 else 0)
            if spec["api"] == "killed":
                killed.append(api)
        else:
            bodies = {
                "holder": lambda spec=spec: (title(spec.get("title")), context(spec)),
                "nvml": lambda spec=spec: (title(spec.get("title") or "nvidia_gpu_exporter"), nvml_client()),
                "cuinit": lambda spec=spec: (title(spec.get("title")), cuda_init(spec)),
                "sleeper": lambda spec=spec: title(spec.get("title") or "cron"),
            }
            child(spec, kind, bodies[kind])
            expected += 1
        # A trainer's creator must be gone (and reused) before the next process takes numbers.
        if kind == "trainer":
            wait_listed(expected)
    wait_listed(expected)
    # API servers SIGKILLed once every process is planted (no number of theirs is taken again during the planting):
    # their EngineCore and workers go on, orphans of the node's init.
    for api in killed:
        os.kill(api, signal.SIGKILL)
        os.waitpid(api, 0)
    lines = open(WORLD + "/manifest.lines").read().splitlines()
    with open(WORLD + "/manifest.json", "w") as handle:
        json.dump([json.loads(line) for line in lines], handle)


if __name__ == "__main__":
    if sys.argv[1] == "body":
        body(json.loads(sys.argv[2]))
    else:
        plant(json.loads(open(sys.argv[1]).read()))
