"""Benchmark gpuops.nvidia on simulated GPU nodes; print medians, write the raw results and a plot.

    .venv/bin/python scripts/bench/run.py            # full run (about 10 minutes on 2 cores)
    .venv/bin/python scripts/bench/run.py --quick    # fewer runs, smaller loads (about 3 minutes)
    .venv/bin/python scripts/bench/run.py --sections scan,release --runs 3
    .venv/bin/python scripts/bench/run.py --sections fleet --nodes 16 --runs 5   # the fleet alone (docs/scale.md)
    .venv/bin/python scripts/bench/run.py --sections modules --runs 5   # the node's side of the fleet, split

Sections (method and targets: docs/performance.md):
  scan     inside two nodes of about 2,000 processes and 100,000 open fds each, a few dozen of them GPU holders
           (SCAN_NODES). "mixed": holders of every kind, the inherited ones leaving dead creators listed; the
           collection's holder scan vs `fuser -v /dev/nvidia*` vs `lsof /dev/nvidia*` (the holder sets must agree),
           and the modules' looks, which all scan /proc there. "live": every creator alive, the driver's lists
           explain the memory; fuser vs a full look vs the listed look, which reads the listed PIDs only. The path
           of each look is asserted inside the node and printed beside its figure
  release  how long after the simulated driver frees the memory gpu_wait returns, per release latency
  node     playbooks/reset_gpus.yml on one node with an orphaned vLLM TP=8 tree vs a play of one ping task
  fleet    over real SSH on --nodes nodes (default 16, 8 GPUs each; forks = nodes, pipelining and ControlPersist as in
           ansible.cfg): a play of one ping task (strategy free), check_gpus.yml, reset_gpus.yml on clean nodes and
           on nodes with an orphaned vLLM TP=8 tree, in rotating order; controller CPU per host (ansible-playbook with
           everything it reaped, plus the ControlPersist masters), node CPU per host (the nodes' sshd and everything
           below it) and wall time, each also as a ratio to the same round's ping play (docs/scale.md)
  modules  the node's side of the fleet, split, on one SSH node: the module run each fleet play sends (ping, gpu_kill
           of reset_gpus.yml, gpu_wait of check_gpus.yml), run as Ansible runs it, in alternating rounds: its CPU, the
           part that compiles module_utils from source, and its CPU where each is compiled once (scripts/bench/modules.py)
  redeploy playbooks/redeploy_vllm.yml on one node: a simulated vLLM TP=2 with a DFlash drafter redeployed with a new
           configuration, idle and under load (drain hook + clients); the play's wall time split by task (junit
           callback) into drain, stop, memory release, start, model load (the server's "Loading weights took"),
           health and acceptance gates, and the rest (the collection's own part), which is judged against a
           one-ping play run between the round's two redeploys: at most REDEPLOY_RATIO times it. Alone it writes
           performance-redeploy.json instead of performance.json (the fleet alone: performance-fleet.json; the
           modules alone: performance-modules.json).
Every comparison is measured side by side in one run (alternating), so load from other work on the machine
hits both sides. Needs root (nodes, sshd); installs psmisc, lsof and openssh-server with apt-get if missing.
Not a test: it asserts nothing about speed, it reports. It asserts the path each measured look takes, so that
a change that stops taking it fails here instead of giving a figure of another path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration"), str(Path(__file__).resolve().parent)]

import modules  # noqa: E402
import nodeload  # noqa: E402
import plot  # noqa: E402
from nodetools import alive, start_holder, start_vllm, wait_for  # noqa: E402
from simnode import gpunode, inventory_file, up  # noqa: E402

VENV_BIN = REPO / ".venv" / "bin"
PLAYBOOK = REPO / "playbooks" / "reset_gpus.yml"
ENSURE_TOOLS = Path(__file__).resolve().parent / "ensure_tools.sh"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# Runs inside a scan node: rounds of the named tools in rotating order. argv: rounds, tools (comma-separated), the
# path the listed look must take there ("listed" or "full"). Prints {"times": {tool: [{"wall_s", "cpu_s"}]},
# "sets": {tool: [PID...]}, "paths": {tool: path}}.
SCAN_PROGRAM = r"""
import glob, json, os, subprocess, sys, time
sys.path.insert(0, %(collections)r)
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus, _procscan

rounds, names, listed_path = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
files = sorted(glob.glob("/dev/nvidia*"))


def fuser():
    result = subprocess.run(["fuser", "-v"] + files, capture_output=True, text=True)
    return {int(word) for word in result.stdout.split()}  # PIDs on stdout, the table on stderr


def lsof():
    result = subprocess.run(["lsof"] + files, capture_output=True, text=True)
    return {int(line.split()[1]) for line in result.stdout.splitlines()[1:]}


inspector = _gpus.Inspector()
inspector.snapshot(scope="listed")  # NVML initialized once, as in a module's first look
own = inspector.own_pids()
paths = {"scan": "full", "scan_serial": "full", "snapshot_full": "full", "snapshot_listed": listed_path}


def snapshot(scope):
    # One look of the modules, without owners (a wait's polls): scope "full" as gpu_facts; "listed" as gpu_kill and
    # gpu_wait, which scan only the listed PIDs' fds where the driver's lists explain the memory, else all of /proc.
    # The path taken is asserted: a figure of another path than the node was built for would be a wrong figure.
    view = inspector.snapshot(scope=scope, owners=False)
    wanted = paths["snapshot_" + scope]
    assert view["scan"] == wanted, "scope %%s took the %%s path, not %%s" %% (scope, view["scan"], wanted)
    return {h["pid"] for h in view["holders"]}


tools = {"scan": lambda: set(_procscan.scan_holders()), "scan_serial": lambda: set(_procscan.scan_holders(workers=1)),
         "fuser": fuser, "lsof": lsof, "snapshot_full": lambda: snapshot("full"),
         "snapshot_listed": lambda: snapshot("listed")}
times = {name: [] for name in names}
sets = {}
for number in range(rounds):
    for name in names[number %% len(names):] + names[:number %% len(names)]:
        cpu_before, wall_before = sum(os.times()[:4]), time.perf_counter()
        found = tools[name]() - own  # the inspector's NVML worker holds every device file while NVML is initialized
        wall, cpu = time.perf_counter() - wall_before, sum(os.times()[:4]) - cpu_before
        times[name].append({"wall_s": wall, "cpu_s": cpu})
        sets[name] = sorted(found)
inspector.close()
print(json.dumps({"times": times, "sets": sets, "paths": {name: paths.get(name, "-") for name in names}}))
"""

# The scan section's nodes: (name, holder kinds, tools, the path the listed look takes there). "mixed" has every
# kind of holder; its inherited holders leave dead creators listed, so every look of the modules scans all of /proc
# (the scan against fuser and lsof, and what gpu_kill/gpu_wait pay there). "live" has no inherited holder: the
# driver's lists explain the memory and the listed look reads only the listed PIDs (gpu_kill/gpu_wait's usual look).
SCAN_NODES = (
    ("mixed", nodeload.KINDS, ("scan", "scan_serial", "fuser", "lsof", "snapshot_full", "snapshot_listed"), "full"),
    ("live", ("fd", "cuda", "mapping"), ("fuser", "snapshot_full", "snapshot_listed"), "listed"),
)

NOOP_PLAY = """- name: One task that reaches the host
  hosts: all
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""


def ansible_env() -> dict[str, str]:
    """The environment of every ansible-playbook the benchmark runs: this checkout's venv and ansible.cfg, no colour,
    the stdout callback that ansible.cfg names (plain ansible-playbook, no wrapper: its CPU is what is measured)."""
    env = dict(
        os.environ,
        PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
    )
    env.pop("ANSIBLE_STDOUT_CALLBACK", None)
    return env


def log(message: str) -> None:
    print("[%s] %s" % (time.strftime("%H:%M:%S"), message), file=sys.stderr, flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def timed(argv: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> dict:
    """Run argv to the end; {"wall_s", "cpu_s" (user + system of it and every descendant it reaped),
    "max_rss_mib" (the largest of those processes), "rc", "output"}."""
    with tempfile.TemporaryFile() as output:
        started = time.monotonic()
        process = subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT
        )
        timer = threading.Timer(timeout, process.kill)
        timer.start()
        try:
            _pid, status, usage = os.wait4(process.pid, 0)
        finally:
            timer.cancel()
        wall = time.monotonic() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        output.seek(0)
        text = output.read().decode(errors="replace")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "max_rss_mib": usage.ru_maxrss / 1024,
        "rc": process.returncode,
        "output": text,
    }


def ensure_tools(*tools: str) -> None:
    result = subprocess.run([str(ENSURE_TOOLS), *tools], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit("bench: %s" % result.stderr.strip())


def node_name(section: str, number: int = 0) -> str:
    return "bench-%d-%s-%d" % (os.getpid(), section, number)


def write_inventory(directory: Path, nodes: list) -> Path:
    """INI inventory of `nodes` (gpunode inventory) in a directory of its own under `directory`."""
    own = directory / ("inventory-%d" % len(nodes))
    own.mkdir(exist_ok=True)
    return inventory_file(own, *nodes)


def playbook(inventory: Path, play: Path, forks: int = 5, extra: list[str] | None = None) -> dict:
    result = timed(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "-f", str(forks), str(play), *(extra or [])],
        ansible_env(),
    )
    if result["rc"] != 0:
        raise RuntimeError(
            "ansible-playbook %s failed (rc %d):\n%s" % (play.name, result["rc"], result["output"][-3000:])
        )
    return result


# ---------------------------------------------------------------------------------------------
# sections


def scan_node(args, name: str, kinds: tuple[str, ...], tools: tuple[str, ...], listed_path: str) -> dict:
    """`tools` in rotating rounds inside one loaded node whose holders are of `kinds`; the listed look must take
    `listed_path` there (asserted inside the node)."""
    node = up(node_name("scan-" + name), gpus=8)
    try:
        log("scan: filling node %s with %d processes and %d fds" % (node.name, args.processes, args.fds))
        made = nodeload.populate(node, processes=args.processes, fds=args.fds, holders=args.holders, kinds=kinds)
        log(
            "scan, %s node: %d processes, %d fds, %d GPU holders (%s) + %d control-only; %d rounds of %s"
            % (
                name,
                made["processes"],
                made["fds"],
                len(made["holders"]),
                ", ".join(kinds),
                len(made["control_only"]),
                args.scan_rounds,
                ", ".join(tools),
            )
        )
        code = SCAN_PROGRAM % {"collections": str(REPO / ".collections")}
        measured = json.loads(node.py(code, str(args.scan_rounds), ",".join(tools), listed_path, timeout=1800))
    finally:
        node.down()
    expected = sorted(made["holders"] + made["control_only"])
    holders = sorted(made["holders"])  # the looks leave out the control-only holders (device users, no GPU)
    times = measured["times"]
    return {
        "kinds": list(kinds),
        "processes": made["processes"],
        "fds": made["fds"],
        "holders": len(made["holders"]),
        "control_only": len(made["control_only"]),
        "expected": expected,
        "paths": measured["paths"],
        "runs": times,
        "sets_agree": {
            tool: found == (expected if tool in PROC_TOOLS else holders) for tool, found in measured["sets"].items()
        },
        "median_wall_s": {tool: median([run["wall_s"] for run in runs]) for tool, runs in times.items()},
        "median_cpu_s": {tool: median([run["cpu_s"] for run in runs]) for tool, runs in times.items()},
    }


PROC_TOOLS = ("scan", "scan_serial", "fuser", "lsof")  # the /proc tools: they find the control-only holders too


def bench_scan(args, workdir: Path) -> dict:
    """Scan vs fuser vs lsof, and the modules' looks, inside loaded nodes (SCAN_NODES)."""
    ensure_tools("fuser", "lsof")
    return {name: scan_node(args, name, kinds, tools, path) for name, kinds, tools, path in SCAN_NODES}


def _descendants(host_pid: int) -> list[int]:
    """Host PIDs of the processes below `host_pid` (from the host's /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path("/proc/%s/stat" % entry).read_bytes()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(b")") + 2 :].split()[1]), []).append(int(entry))
    found, todo = [], [host_pid]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            found.append(child)
            todo.append(child)
    return found


def release_once(node, latency: float, workdir: Path) -> dict:
    """One measurement: gpu_wait polling, the holder SIGKILLed; gpu_wait's exit vs the driver's release instant."""
    holder = start_holder(node, [0], mib=1000)
    arguments = workdir / ("gpu_wait-%s.json" % node.name)
    arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"gpus": [0], "timeout": latency + 30}}))
    argv, env = gpunode.enter_command(
        node.info,
        [str(VENV_BIN / "python"), "-m", "ansible_collections.gpuops.nvidia.plugins.modules.gpu_wait", str(arguments)],
    )
    env["PYTHONPATH"] = str(REPO / ".collections")
    wait_process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    # Below nsenter: nsenter's child in the node (which becomes the module's Python) and, once gpu_wait
    # polls, its NVML worker. Then end the holder.
    wait_for(lambda: len(_descendants(wait_process.pid)) >= 2, 30, 0.01, "gpu_wait to start polling")
    node.exec("kill", "-9", str(holder))
    marker = Path(node.run_dir) / "released" / ("%d.0" % holder)
    release_began = float(
        wait_for(lambda: marker.exists() and marker.read_text().split()[1], 30, 0.002, "the driver to start releasing")
    )
    output = wait_process.communicate(timeout=latency + 60)[0]
    returned = time.monotonic()
    reply = json.loads(output)
    if not reply.get("released"):
        raise RuntimeError("gpu_wait did not report a release: %s" % output[-2000:])
    return {
        "latency_s": latency,
        "delay_s": returned - (release_began + latency),
        "polls": reply["polls"],
        "module_elapsed_s": reply["elapsed_s"],
    }


def bench_release(args, workdir: Path) -> dict:
    """gpu_wait's return after the simulated release, for each latency."""
    node = up(node_name("release"), gpus=2)
    results = {}
    try:
        for latency in args.latencies:
            node.set(release_latency=latency)
            runs = []
            for number in range(args.release_runs):
                runs.append(release_once(node, latency, workdir))
                log(
                    "release: latency %.1f s, run %d: gpu_wait returned %.3f s after the release"
                    % (latency, number + 1, runs[-1]["delay_s"])
                )
            results["%g" % latency] = {
                "runs": runs,
                "median_delay_s": median([run["delay_s"] for run in runs]),
                "max_delay_s": max(run["delay_s"] for run in runs),
            }
    finally:
        node.down()
    return results


def bench_node(args, workdir: Path) -> dict:
    """reset_gpus.yml on one node with an orphaned vLLM TP=8 tree vs a one-ping play, alternating."""
    latency = 0.5
    node = up(node_name("node"), gpus=8, release_latency=latency)
    inventory = write_inventory(workdir, [node])
    noop = workdir / "noop.yml"
    noop.write_text(NOOP_PLAY)
    runs = {"reset": [], "noop": []}
    try:
        playbook(inventory, noop)  # warm-up: the controller's caches, AnsiballZ payloads
        for number in range(args.runs):
            api = start_vllm(node, "/models/m", "--tensor-parallel-size", "8")
            node.exec("kill", "-9", str(api))
            wait_for(lambda: not alive(node, api), 10, what="API server gone")
            order = ("reset", "noop") if number % 2 == 0 else ("noop", "reset")
            for kind in order:
                result = playbook(inventory, PLAYBOOK if kind == "reset" else noop)
                runs[kind].append(
                    {"wall_s": result["wall_s"], "cpu_s": result["cpu_s"], "max_rss_mib": result["max_rss_mib"]}
                )
            log(
                "node: run %d: reset %.2f s, noop %.2f s"
                % (number + 1, runs["reset"][-1]["wall_s"], runs["noop"][-1]["wall_s"])
            )
    finally:
        node.down()
    reset, noop_wall = median([r["wall_s"] for r in runs["reset"]]), median([r["wall_s"] for r in runs["noop"]])
    return {
        "release_latency_s": latency,
        "runs": runs,
        "median_reset_s": reset,
        "median_noop_s": noop_wall,
        "median_extra_s": median([r["wall_s"] - n["wall_s"] for r, n in zip(runs["reset"], runs["noop"])]),
    }


def _stat_fields(pid: int) -> list[bytes] | None:
    try:
        stat = Path("/proc/%d/stat" % pid).read_bytes()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()  # fields from the state on: [0] state, [1] ppid, [11:15] times


def _cpu_ticks(pid: int, with_children: bool) -> int:
    """utime + stime of `pid`, with the cutime + cstime of the children it reaped when `with_children`."""
    fields = _stat_fields(pid)
    return sum(int(value) for value in fields[11 : 15 if with_children else 13]) if fields else 0


def _ssh_masters(nodes: list) -> list[int]:
    """Host PIDs of the ControlPersist masters ("ssh: ... [mux]") connected to `nodes`' sshd: the controller's CPU.

    A master daemonizes (ansible-playbook never reaps it), so its CPU is read from /proc; masters of other
    SSH connections on this machine are left out by their peer address."""
    import psutil  # a dependency of the modules, in the venv

    peers = {(node.info["ssh"]["host"], int(node.info["ssh"]["port"])) for node in nodes}
    masters = []
    for connection in psutil.net_connections("tcp"):
        if connection.pid and connection.raddr and (connection.raddr.ip, connection.raddr.port) in peers:
            try:
                command = Path("/proc/%d/cmdline" % connection.pid).read_bytes()
            except OSError:
                continue
            if command.startswith(b"ssh: ") and b"[mux]" in command:
                masters.append(connection.pid)
    return sorted(set(masters))


def _node_side_ticks(nodes: list) -> int:
    """CPU ticks of the nodes' sshd listeners and every process below them, with what each reaped.

    Everything an SSH session runs (sshd's connection process, the shell, the module, its NVML worker) is
    below a listener and reaped inside that tree: a live process counts its own time, a reaped one is in
    its parent's cutime/cstime, so each tick is counted once, however far a run got. What the modules
    end (the vLLM tree) was started outside sshd and does not count; its exit and the driver's release
    cost the node only the modules' polling.
    """
    configs = [node.info["ssh"]["config"].encode() for node in nodes]
    children: dict[int, list[int]] = {}
    listeners = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is None:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        try:
            command = Path("/proc/%s/cmdline" % entry).read_bytes()
        except OSError:
            continue
        # sshd retitles itself: "sshd: /usr/sbin/sshd -D -e -f CONFIG [listener] ..."
        if command.startswith(b"sshd: ") and b"[listener]" in command and any(config in command for config in configs):
            listeners.append(int(entry))
    ticks, todo = 0, list(listeners)
    while todo:
        pid = todo.pop()
        ticks += _cpu_ticks(pid, True)
        todo.extend(children.get(pid, []))
    return ticks


FLEET_PING_PLAY = """- name: One task that reaches the host
  hosts: all
  gather_facts: false
  strategy: free
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""

# (kind, playbook, nodes with an orphaned vLLM TP=8 tree): the plays of the fleet section, each as shipped
# (reset_gpus.yml: strategy free; check_gpus.yml: linear, which its run_once summary needs).
FLEET_KINDS = ("ping", "check", "reset", "reset_orphaned")
FLEET_TITLES = {
    "ping": "play of one ping task",
    "check": "check_gpus.yml",
    "reset": "reset_gpus.yml, clean nodes",
    "reset_orphaned": "reset_gpus.yml, orphaned vLLM TP=8 trees",
}


def _orphan_vllm(node) -> None:
    """As tests/integration/test_reset_gpus.py orphaned_tp8: vllm serve TP=8, its API server SIGKILLed."""
    api = start_vllm(node, "/models/m", "--tensor-parallel-size", "8")
    node.exec("kill", "-9", str(api))
    wait_for(lambda: not alive(node, api), 10, what="API server gone")


def _in_parallel(function, nodes: list, at_once: int = 4) -> None:
    """function(node) for every node, `at_once` at a time (16 simulated vLLM starts at once starve 2 cores past
    start_vllm's timeout); raises RuntimeError naming every node that failed."""
    errors = []
    slots = threading.Semaphore(at_once)

    def call(node):
        try:
            with slots:
                function(node)
        except Exception as error:  # noqa: BLE001 - reported below, with the node
            errors.append("%s: %s" % (node.name, error))

    threads = [threading.Thread(target=call, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError("; ".join(errors))


def _recap(output: str) -> dict:
    """{host: {"ok": n, "changed": n, ...}} from the PLAY RECAP of the default callback."""
    recap = {}
    for host, counts in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output, re.MULTILINE):
        recap[host] = {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", counts)}
    return recap


def fleet_run(nodes: list, inventory: Path, play: Path, changed: int) -> dict:
    """`play` over SSH on `nodes` with forks = len(nodes): wall time, controller and node CPU, per host too.

    Fails unless every host ends ok with `changed` changed tasks (0 on clean nodes, 1 for a reset that ended a tree).
    """
    node_before = _node_side_ticks(nodes)
    masters_before = {pid: _cpu_ticks(pid, False) for pid in _ssh_masters(nodes)}
    result = playbook(inventory, play, forks=len(nodes))
    masters_after = {pid: _cpu_ticks(pid, False) for pid in _ssh_masters(nodes)}
    node_cpu = (_node_side_ticks(nodes) - node_before) / CLOCK_TICKS
    masters_cpu = sum(ticks - masters_before.get(pid, 0) for pid, ticks in masters_after.items()) / CLOCK_TICKS
    recap = _recap(result["output"])
    wrong = {
        node.name: recap.get(node.name)
        for node in nodes
        if (recap.get(node.name) or {}).get("changed") != changed or (recap.get(node.name) or {}).get("failed", 1)
    }
    if wrong:
        raise RuntimeError(
            "%s: expected changed=%d on every host, got %s:\n%s" % (play.name, changed, wrong, result["output"][-3000:])
        )
    controller_cpu = result["cpu_s"] + masters_cpu
    hosts = len(nodes)
    return {
        "hosts": hosts,
        "wall_s": result["wall_s"],
        "controller_cpu_s": controller_cpu,
        "node_cpu_s": node_cpu,
        "playbook_cpu_s": result["cpu_s"],
        "masters_cpu_s": masters_cpu,
        "new_masters": len(set(masters_after) - set(masters_before)),
        "controller_max_rss_mib": result["max_rss_mib"],
        "controller_cpu_per_host_s": controller_cpu / hosts,
        "node_cpu_per_host_s": node_cpu / hosts,
    }


FLEET_FIGURES = ("controller_cpu_per_host_s", "node_cpu_per_host_s", "wall_s")
# The goals on clean nodes, as ratios to the ping play (benchmark figures, not timed tests): issue 26 set both plays
# to 2x the controller CPU and 1.5x the node CPU per host (docs/scale.md).
FLEET_GOALS = {
    ("reset", "controller_cpu_per_host_s"): 2.0,
    ("reset", "node_cpu_per_host_s"): 1.5,
    ("check", "controller_cpu_per_host_s"): 2.0,
    ("check", "node_cpu_per_host_s"): 1.5,
}


def bench_fleet(args, workdir: Path) -> dict:
    """A one-ping play, check_gpus.yml and reset_gpus.yml (clean, orphaned TP=8 trees) over SSH on args.nodes nodes.

    One run: a warm-up of each play (opens the ControlPersist connections, fills the controller's caches), then
    args.fleet_runs rounds of the four plays in rotating order; each figure also as a ratio to the same round's
    ping play.
    """
    ensure_tools("sshd")
    log("fleet: starting %d SSH nodes (8 GPUs each)" % args.nodes)
    nodes = []
    plays = {
        "ping": workdir / "fleet-ping.yml",
        "check": REPO / "playbooks" / "check_gpus.yml",
        "reset": PLAYBOOK,
        "reset_orphaned": PLAYBOOK,
    }
    plays["ping"].write_text(FLEET_PING_PLAY)
    try:
        started = time.monotonic()
        for number in range(args.nodes):
            nodes.append(up(node_name("fleet", number), gpus=8, release_latency=0.5, ssh=True))
        inventory = write_inventory(workdir, nodes)
        results = {
            "nodes": args.nodes,
            "forks": args.nodes,
            "cpus": len(os.sched_getaffinity(0)),
            "release_latency_s": 0.5,
            "up_s": time.monotonic() - started,
            "plays": {
                kind: str(plays[kind].relative_to(REPO)) if kind != "ping" else "one ping task, strategy free"
                for kind in FLEET_KINDS
            },
        }
        results["cold"] = {kind: fleet_run(nodes, inventory, plays[kind], 0) for kind in ("ping", "check", "reset")}
        runs = {kind: [] for kind in FLEET_KINDS}
        for number in range(args.fleet_runs):
            shift = number % len(FLEET_KINDS)
            for kind in FLEET_KINDS[shift:] + FLEET_KINDS[:shift]:
                if kind == "reset_orphaned":
                    prepared = time.monotonic()
                    _in_parallel(_orphan_vllm, nodes)
                    log("fleet: %d orphaned vLLM TP=8 trees in %.1f s" % (len(nodes), time.monotonic() - prepared))
                runs[kind].append(fleet_run(nodes, inventory, plays[kind], 1 if kind == "reset_orphaned" else 0))
            ping = runs["ping"][-1]
            for kind in FLEET_KINDS:
                runs[kind][-1]["ratio"] = {figure: runs[kind][-1][figure] / ping[figure] for figure in FLEET_FIGURES}
            log(
                "fleet: round %d: %s"
                % (
                    number + 1,
                    ", ".join(
                        "%s %.2f s wall, %.3f + %.3f s CPU/host"
                        % (
                            kind,
                            runs[kind][-1]["wall_s"],
                            runs[kind][-1]["controller_cpu_per_host_s"],
                            runs[kind][-1]["node_cpu_per_host_s"],
                        )
                        for kind in FLEET_KINDS
                    ),
                )
            )
    finally:
        for node in nodes:
            node.down()
    results["runs"] = runs
    results["median"] = {
        kind: {figure: median([run[figure] for run in runs[kind]]) for figure in FLEET_FIGURES} for kind in FLEET_KINDS
    }
    results["median_ratio"] = {
        kind: {figure: median([run["ratio"][figure] for run in runs[kind]]) for figure in FLEET_FIGURES}
        for kind in FLEET_KINDS
    }
    # What ending the trees and waiting for the release added, per host, paired by round.
    results["orphaned_minus_clean"] = {
        figure: median([o[figure] - c[figure] for o, c in zip(runs["reset_orphaned"], runs["reset"])])
        for figure in FLEET_FIGURES
    }
    return results


# ---------------------------------------------------------------------------------------------
# report


REDEPLOY_PHASES = (  # (phase, task name fragments), first match wins
    ("drain", ("Take the instance out of routing", "Wait until no request runs or waits")),
    (
        "stop",
        ("Stop the detached server", "Stop the systemd unit", "End every process left", "Wait until nothing listens"),
    ),
    ("memory release", ("Wait until the instance's GPUs are released",)),
    ("start", ("Start the detached server", "Start the systemd unit")),
    ("health", ("Wait until the server is healthy",)),
    ("acceptance gate", ("Acceptance gate",)),
    ("restore", ("Put the instance back into routing",)),  # the operator's hook, as the drain hook
)


def _junit_tasks(directory: Path) -> list[tuple[str, float]]:
    """(task name, seconds) of every test case in the junit callback's XML files under `directory`."""
    from xml.etree import ElementTree

    tasks = []
    for path in sorted(directory.glob("*.xml")):
        for case in ElementTree.parse(path).getroot().iter("testcase"):
            tasks.append((case.get("name", ""), float(case.get("time") or 0)))
    return tasks


def redeploy_once(inventory: Path, override: dict, log_file: Path, workdir: Path, number: int) -> dict:
    """One redeploy play, timed by task; returns {"wall_s", phases..., "model load", "rest"}."""
    junit = workdir / ("junit-%d" % number)
    junit.mkdir()
    env = dict(
        ansible_env(), ANSIBLE_CALLBACKS_ENABLED="junit", JUNIT_OUTPUT_DIR=str(junit), JUNIT_HIDE_TASK_ARGUMENTS="true"
    )
    argv = [
        str(VENV_BIN / "ansible-playbook"),
        "-i",
        str(inventory),
        str(REPO / "playbooks" / "redeploy_vllm.yml"),
        "-e",
        json.dumps(override),
    ]
    result = timed(argv, env)
    if result["rc"] != 0:
        raise RuntimeError("redeploy failed (rc %d):\n%s" % (result["rc"], result["output"][-3000:]))
    phases = {name: 0.0 for name, _fragments in REDEPLOY_PHASES}
    tasks = _junit_tasks(junit)
    for name, seconds in tasks:
        for phase, fragments in REDEPLOY_PHASES:
            if any(fragment in name for fragment in fragments):
                phases[phase] += seconds
                break
    loads = [float(x) for x in re.findall(r"Loading weights took ([\d.]+) seconds", log_file.read_text())]
    phases["model load"] = loads[-1] if loads else 0.0
    phases["health"] = max(0.0, phases["health"] - phases["model load"])
    drained = re.search(r"(not )?drained in ([\d.]+) s: (\d+) request\(s\) running", result["output"])
    phases["rest"] = result["wall_s"] - sum(phases.values())
    return dict(
        phases,
        wall_s=result["wall_s"],
        cpu_s=result["cpu_s"],
        running_at_stop=int(drained.group(3)) if drained else None,
        task_results=len(tasks),
        task_s=sum(seconds for _name, seconds in tasks),
        slowest_tasks=sorted(tasks, key=lambda task: -task[1])[:15],
        rest_tasks=[
            (name, seconds)
            for name, seconds in tasks
            if not any(fragment in name for _phase, fragments in REDEPLOY_PHASES for fragment in fragments)
        ],
    )


# Issue 34: the redeploy's own part ("rest": the play's wall time less drain, stop, release, start, model load, gates
# and hooks) is judged against the same round's one-ping play, at most this many times it.
REDEPLOY_RATIO = 3.0


def bench_redeploy(args, workdir: Path) -> dict:
    """Redeploy one TP=2 DFlash instance with a new configuration, idle and under load, alternating."""
    from test_vllm_drain import Load
    from test_vllm_server import CORRECTED, free_ports, instance, write_host_vars

    node = up(node_name("redeploy"), gpus=2, release_latency=0.5)
    port = free_ports(1)[0]
    inventory = write_inventory(workdir, [node])
    routed = workdir / "routed"
    env = {"SIMVLLM_LOAD_SECONDS": "2.0", "SIMVLLM_TOKEN_SECONDS": "0.02"}  # model load 2 s; a 40-token request 0.8 s
    root = write_host_vars(
        inventory.parent,
        node,
        [instance("a", port, [0, 1], CORRECTED, environment=env)],
        vllm_server_drain_poll_interval=0.2,
        vllm_server_ready_poll_interval=0.2,
        vllm_server_drain_command="rm -f %s" % routed,
        vllm_server_restore_command="touch %s" % routed,
    )
    log_file = root / "log" / "a.log"
    runs = {"idle": [], "load": []}
    ping = []
    noop = workdir / "noop.yml"
    noop.write_text(NOOP_PLAY)
    try:
        redeploy_once(inventory, {}, log_file, workdir, 0)  # first deployment, also warms the controller's caches
        playbook(inventory, noop)  # warm-up of the ping play's module
        number = 0
        for run in range(args.runs):
            # The round's one-ping play runs between its two redeploys: the yardstick of both (REDEPLOY_RATIO).
            for kind in ("idle", "ping", "load") if run % 2 == 0 else ("load", "ping", "idle"):
                if kind == "ping":
                    ping.append(playbook(inventory, noop)["wall_s"])
                    continue
                number += 1
                override = {"test_override": {"gpu_memory_utilization": 0.85 if number % 2 else 0.9}}
                load = None
                if kind == "load":
                    routed.touch()
                    load = Load(port, "qwen-a", routed)
                    time.sleep(1.0)
                try:
                    figures = redeploy_once(inventory, override, log_file, workdir, number)
                finally:
                    # The load ends and routing is restored even when the redeploy raised.
                    results = load.finish() if load is not None else None
                    routed.unlink(missing_ok=True)
                if results is not None:
                    figures["requests"] = len(results)
                    figures["failed_requests"] = len([r for r in results if r[1] != 200 or r[2] != "length"])
                runs[kind].append(figures)
            for kind in runs:
                runs[kind][-1]["ping_s"] = ping[-1]
                runs[kind][-1]["rest_per_ping"] = runs[kind][-1]["rest"] / ping[-1]
            log(
                "redeploy: round %d: ping play %.2f s; %s"
                % (
                    run + 1,
                    ping[-1],
                    ", ".join(
                        "%s %.2f s wall, rest %.2f s (%.2fx the ping play)"
                        % (kind, runs[kind][-1]["wall_s"], runs[kind][-1]["rest"], runs[kind][-1]["rest_per_ping"])
                        for kind in runs
                    ),
                )
            )
    finally:
        node.down()
    phases = [name for name, _fragments in REDEPLOY_PHASES] + ["model load", "rest", "wall_s", "rest_per_ping"]
    return {
        "runs": runs,
        "ping_runs_s": ping,
        "noop_play_s": median(ping),
        "median": {kind: {phase: median([r[phase] for r in runs[kind]]) for phase in phases} for kind in runs},
    }


SCAN_TITLES = {
    "scan": "`scan_holders()`",
    "scan_serial": "`scan_holders(workers=1)`",
    "fuser": "`fuser -v`",
    "lsof": "`lsof`",
    "snapshot_full": "a look of scope full (gpu_facts)",
    "snapshot_listed": "a look of scope listed (gpu_kill, gpu_wait)",
}
PATH_WORDS = {"full": ", path taken: all of /proc", "listed": ", path taken: the listed PIDs only", "-": ""}


def scan_rows(scan: dict) -> list[str]:
    """Table rows of the scan section: each tool on each node with the path it took, and ratios of one node's rounds."""
    rows = []
    for name, node in scan.items():
        wall, cpu = node["median_wall_s"], node["median_cpu_s"]
        rows.append(
            "| **%s node**: %d processes, %d fds, %d GPU holders (%s), %d control-only | | | |"
            % (name, node["processes"], node["fds"], node["holders"], ", ".join(node["kinds"]), node["control_only"])
        )
        for tool in wall:
            rows.append(
                "| %s: %s%s | %.0f ms wall, %.0f ms CPU | | |"
                % (name, SCAN_TITLES[tool], PATH_WORDS[node["paths"][tool]], wall[tool] * 1000, cpu[tool] * 1000)
            )
        if "scan" in wall:
            ratio = wall["scan"] / wall["fuser"]
            rows.append(
                "| %s: scan / fuser (wall) | %.2f | <= 0.50 | %s |" % (name, ratio, "yes" if ratio <= 0.5 else "no")
            )
            rows.append("| %s: serial scan / fuser (wall) | %.2f | | |" % (name, wall["scan_serial"] / wall["fuser"]))
        for tool in ("snapshot_full", "snapshot_listed"):
            rows.append(
                "| %s: %s / fuser (wall; CPU) | %.2f; %.2f | | |"
                % (name, SCAN_TITLES[tool], wall[tool] / wall["fuser"], cpu[tool] / cpu["fuser"])
            )
        agree = all(node["sets_agree"].values())
        rows.append(
            "| %s: holders found by %s = the %d made (+ %d control-only for the /proc tools) | %s | same set | %s |"
            % (
                name,
                ", ".join(node["sets_agree"]),
                node["holders"],
                node["control_only"],
                "all agree" if agree else node["sets_agree"],
                "yes" if agree else "no",
            )
        )
    return rows


def table(results: dict) -> str:
    """Markdown table of the medians in `results`."""
    rows = ["| measurement | median | target | met |", "|---|---|---|---|"]
    scan = results.get("scan")
    if scan:
        rows += scan_rows(scan)
    for latency, release in results.get("release", {}).items():
        rows.append(
            "| gpu_wait return after the release, latency %s s (max %.3f) | %.3f s | <= 0.1 s | %s |"
            % (
                latency,
                release["max_delay_s"],
                release["median_delay_s"],
                "yes" if release["max_delay_s"] <= 0.1 else "no",
            )
        )
    node = results.get("node")
    if node:
        budget = 1.0 + node["release_latency_s"]
        rows.append("| one node: reset_gpus.yml, orphaned TP=8 tree | %.2f s | | |" % node["median_reset_s"])
        rows.append("| one node: play of one ping task | %.2f s | | |" % node["median_noop_s"])
        rows.append(
            "| one node: reset - ping play (release latency %.1f s) | %.2f s | <= %.1f s | %s |"
            % (
                node["release_latency_s"],
                node["median_extra_s"],
                budget,
                "yes" if node["median_extra_s"] <= budget else "no",
            )
        )
        rows.append(
            "| one node: CPU of the reset, controller and node together (local connection) | %.2f s | | |"
            % median([run["cpu_s"] for run in node["runs"]["reset"]])
        )
    if results.get("modules"):
        rows += modules.rows(results["modules"])
    fleet = results.get("fleet")
    if fleet:
        label = "fleet, %d nodes over SSH, forks %d, %d CPUs" % (fleet["nodes"], fleet["forks"], fleet["cpus"])
        ping = fleet["median"]["ping"]
        rows.append(
            "| %s: play of one ping task (wall; controller + node CPU per host) | %.2f s; %.3f + %.3f s | | |"
            % (label, ping["wall_s"], ping["controller_cpu_per_host_s"], ping["node_cpu_per_host_s"])
        )
        for kind in FLEET_KINDS[1:]:
            absolute, ratio = fleet["median"][kind], fleet["median_ratio"][kind]
            for figure, words in (
                ("controller_cpu_per_host_s", "controller CPU per host"),
                ("node_cpu_per_host_s", "node CPU per host"),
                ("wall_s", "wall"),
            ):
                goal = FLEET_GOALS.get((kind, figure))
                rows.append(
                    "| fleet: %s / ping play, %s | %.2f (%.3f s) | %s | %s |"
                    % (
                        FLEET_TITLES[kind],
                        words,
                        ratio[figure],
                        absolute[figure],
                        "<= %.1f" % goal if goal else "",
                        ("yes" if ratio[figure] <= goal else "no") if goal else "",
                    )
                )
        extra = fleet["orphaned_minus_clean"]
        rows.append(
            "| fleet: reset with orphaned trees - clean reset (ending + release %.1f s), per host | "
            "%.3f s controller CPU, %.3f s node CPU, %.2f s wall | | |"
            % (
                fleet["release_latency_s"],
                extra["controller_cpu_per_host_s"],
                extra["node_cpu_per_host_s"],
                extra["wall_s"],
            )
        )
    redeploy = results.get("redeploy")
    if redeploy:
        for kind, figures in redeploy["median"].items():
            split = ", ".join(
                "%s %.2f" % (phase, figures[phase])
                for phase in figures
                if phase not in ("wall_s", "rest", "rest_per_ping")
            )
            rows.append(
                "| redeploy TP=2 DFlash, %s: play wall time | %.2f s (%s) | | |" % (kind, figures["wall_s"], split)
            )
            ratio = figures["rest_per_ping"]
            rows.append(
                "| redeploy TP=2 DFlash, %s: the rest (the collection's own part) / the same round's ping play | "
                "%.2f (%.2f s) | <= %g | %s |"
                % (kind, ratio, figures["rest"], REDEPLOY_RATIO, "yes" if ratio <= REDEPLOY_RATIO else "no")
            )
        rows.append("| one node: play of one ping task, between the redeploys | %.2f s | | |" % redeploy["noop_play_s"])
        failed = sum(r.get("failed_requests", 0) for r in redeploy["runs"]["load"])
        rows.append(
            "| redeploy under load: failed requests | %d of %d | 0 | %s |"
            % (failed, sum(r.get("requests", 0) for r in redeploy["runs"]["load"]), "yes" if failed == 0 else "no")
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs and smaller loads")
    parser.add_argument("--sections", default="scan,release,node,fleet")
    parser.add_argument("--runs", type=int, help="runs per comparison (default 5, quick 2)")
    parser.add_argument("--nodes", type=int, default=16, help="nodes of the SSH fleet (8 GPUs each)")
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="where performance.json and performance.svg go")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench: needs root (simulated nodes, sshd)")
    args.runs = args.runs or (2 if args.quick else 5)
    args.processes, args.fds, args.holders = (1000, 50_000, 36) if args.quick else (2000, 100_000, 36)
    args.scan_rounds = max(3, args.runs + 2)
    args.latencies = [0.5, 2.0] if args.quick else [0.5, 2.0, 10.0]
    args.release_runs = args.runs if args.quick else 3
    args.fleet_runs = args.runs
    sections = list(dict.fromkeys(args.sections.split(",")))  # each once, in the order given
    unknown = set(sections) - {"scan", "release", "node", "fleet", "modules", "redeploy"}
    if unknown:
        parser.error("unknown sections: %s" % ", ".join(repr(name) for name in sorted(unknown)))

    results = {
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "load_before": os.getloadavg(),
        },
        "quick": args.quick,
        "runs": args.runs,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuops-bench-") as workdir:
        for section, function in (
            ("scan", bench_scan),
            ("release", bench_release),
            ("node", bench_node),
            ("fleet", bench_fleet),
            ("modules", lambda args, workdir: modules.bench_modules(args, workdir, sys.modules[__name__])),
            ("redeploy", bench_redeploy),
        ):
            if section in sections:
                log("section %s" % section)
                results[section] = function(args, Path(workdir))
    results["machine"]["load_after"] = os.getloadavg()
    results["duration_s"] = time.monotonic() - started
    args.out.mkdir(parents=True, exist_ok=True)
    alone = (
        sections[0] if sections in (["redeploy"], ["fleet"], ["modules"]) else None
    )  # alone: keep the other sections' figures
    if alone:
        (args.out / ("performance-%s.json" % alone)).write_text(json.dumps(results, indent=1) + "\n")
    else:
        (args.out / "performance.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / "performance.svg").write_text(plot.svg(results))
    print(table(results))
    print(
        "\n%d CPUs, load %s before and %s after; %.0f s; raw results: %s"
        % (
            results["machine"]["cpus"],
            "/".join("%.1f" % x for x in results["machine"]["load_before"]),
            "/".join("%.1f" % x for x in results["machine"]["load_after"]),
            results["duration_s"],
            args.out / ("performance-%s.json" % alone if alone else "performance.json"),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
