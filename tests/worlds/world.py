"""Generated worlds: random simulated GPU hosts, a random selection, the collection's modules run on them, and every
decision judged against the oracle (oracle.py). Used by tests/worlds/test_worlds.py and `make worlds`.

A world is plain data (JSON): the GPUs, the processes to plant (plant.py's kinds) and the selection. Nodes are kept
and reused between worlds with the same GPUs (`Pool`); inside.py ends the previous world's processes first.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402
from simnode import REPO, VENV_PYTHON, up  # noqa: E402

WORLDS = Path(__file__).resolve().parent
SIM_DIR = str(REPO / "tests" / "sim")
MIG_LAYOUT = "2g.20gb,2g.20gb"  # GPU instance ids 3 and 4 (tests/sim/README.md, "MIG")
MIG_GIS = (3, 4)
OLD_DRIVER = "535.104.05"  # before 535.113.01: the driver reports node-root PIDs to every caller
TITLES = ("python3 train.py", "python3 serve.py", "python3 -m jax_job")
MATCHES = ("train", "serve", "pt_data_worker", "^python3", "jax")
EXCLUDES = ("pt_data_worker", "nvidia-persistenced", "nvidia_gpu_exporter", "cron", "dcgm-exporter")
# Executables the planted daemons run (copies of the node's Python under these names, root's: tests/sim/README.md).
DAEMONS = ("nvidia-persistenced", "dcgm-exporter", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-smi")
KINDS = ("holder", "holder", "trainer", "trainer", "nvml", "cuinit", "sleeper", "daemon", "vllm", "mps", "ipc", "smi")
OPTIONS = {"grace_period": 0.5, "kill_wait": 3.0, "wait": True, "wait_timeout": 3.0, "driver_timeout": 10.0}


@st.composite
def gpu_setup(draw):
    count = draw(st.integers(1, 3))
    mig = draw(st.booleans()) if count > 1 else False
    # A GB10 (DGX Spark) is one GPU: on a zero-framebuffer GPU the evidence of a context names no one GPU of several
    # (docs/attribution.md, rule 6).
    gb10 = count == 1 and draw(st.booleans())
    return {
        "gpus": count,
        "mig": mig,  # GPU count-1 in MIG mode with two 2g.20gb instances
        "gb10": gb10,
        # A GB10 (DGX Spark) came with R580 drivers: never one before 535.113.01.
        "old_driver": (not gb10) and draw(st.booleans()),
    }


def _gpus_of(draw, setup):
    indices = draw(st.lists(st.integers(0, setup["gpus"] - 1), min_size=1, max_size=2, unique=True))
    mig_index = setup["gpus"] - 1 if setup["mig"] else None
    gi = {str(mig_index): draw(st.sampled_from(MIG_GIS))} if mig_index in indices else {}
    return sorted(indices), gi


@st.composite
def process(draw, setup, number):
    kind = draw(st.sampled_from(KINDS))
    spec = {"id": "p%d" % number, "kind": kind}
    if kind in ("holder", "trainer", "daemon"):
        spec["gpus"], spec["gi"] = _gpus_of(draw, setup)
        spec["mib"] = draw(st.sampled_from((512, 4096, 20000)))
    if kind == "holder":
        spec["title"] = draw(st.sampled_from(TITLES))
        spec["ignore_term"] = draw(st.booleans())
        spec["user"] = draw(st.sampled_from(("root", "nobody")))
        spec["lifetime"] = draw(st.sampled_from((None, None, None, 0.5, 1.5)))
    elif kind in ("vllm", "mps", "ipc"):
        # Whole GPUs (not the MIG one): TP ranks, an MPS server's GPUs, or the GPU of an IPC pair.
        whole = list(range(setup["gpus"] - 1 if setup["mig"] else setup["gpus"]))
        most = 1 if kind == "ipc" else 2
        spec["gpus"] = draw(st.lists(st.sampled_from(whole), min_size=1, max_size=most, unique=True)) if whole else []
        spec["gi"], spec["mib"] = {}, draw(st.sampled_from((512, 4096)))
        if not spec["gpus"]:
            return {"id": spec["id"], "kind": "sleeper"}
    if kind == "vllm":
        spec["api"] = draw(st.sampled_from(("alive", "killed")))
        spec["ignore_term"] = draw(st.booleans())
    elif kind == "mps":
        spec["clients"] = draw(st.integers(1, 2))
        spec["title"] = draw(st.sampled_from(TITLES))
    elif kind == "ipc":
        spec["title"] = draw(st.sampled_from(TITLES))
    elif kind == "trainer":
        spec["title"] = draw(st.sampled_from(TITLES))
        spec["workers"] = draw(st.integers(1, 3))
        spec["creator_end"] = draw(st.sampled_from(("reaped", "zombie")))
        spec["reuse"] = draw(st.sampled_from((None, "nvml", "holder"))) if spec["creator_end"] == "reaped" else None
        if spec["reuse"] == "holder":
            spec["reuse_gpus"] = [draw(st.integers(0, setup["gpus"] - 1))]
            spec["gi"] = dict(spec["gi"])
    elif kind == "daemon":
        spec["name"] = draw(st.sampled_from(("nvidia-persistenced", "dcgm-exporter")))
        spec["real"] = draw(st.booleans())
    return spec


def refs(procs):
    """(process id, role) of every process a `pids` selection may name."""
    out = []
    for spec in procs:
        if spec["kind"] == "trainer":
            out += [(spec["id"], "worker%d" % k) for k in range(spec["workers"])]
            out += [(spec["id"], "creator"), (spec["id"], "launcher")]
            if spec.get("reuse"):
                out.append((spec["id"], "reuser"))
        elif spec["kind"] == "vllm":
            out += [(spec["id"], "api"), (spec["id"], "engine")]
            out += [(spec["id"], "worker%d" % k) for k in range(len(spec["gpus"]) if len(spec["gpus"]) > 1 else 0)]
        elif spec["kind"] == "ipc":
            out += [(spec["id"], "exporter"), (spec["id"], "importer")]
        elif spec["kind"] == "mps":
            out += [(spec["id"], "mps-control"), (spec["id"], "mps-server")]
            out += [(spec["id"], "mps-client%d" % k) for k in range(spec["clients"])]
        else:
            out.append((spec["id"], spec["kind"]))
    return out


@st.composite
def selection(draw, setup, procs):
    gpus = None
    if draw(st.booleans()):
        choices = [("index", i) for i in range(setup["gpus"])] + [("uuid", i) for i in range(setup["gpus"])]
        if setup["mig"]:
            choices += [("mig", setup["gpus"] - 1, gi) for gi in MIG_GIS]
        gpus = draw(st.lists(st.sampled_from(choices), min_size=1, max_size=2, unique=True))
    pids = None
    if draw(st.booleans()):
        pids = draw(st.lists(st.sampled_from(refs(procs)), min_size=1, max_size=4, unique=True))
    options = dict(OPTIONS)
    if draw(st.integers(0, 3)) == 0:
        options["match"] = draw(st.sampled_from(MATCHES))
    if draw(st.integers(0, 3)) == 0:
        options["users"] = [draw(st.sampled_from(("root", "nobody")))]
    if draw(st.booleans()):
        options["exclude"] = draw(st.lists(st.sampled_from(EXCLUDES), min_size=1, max_size=2, unique=True))
    return {"gpus": gpus, "pids": pids, "options": options}


@st.composite
def worlds(draw):
    setup = draw(gpu_setup())
    count = draw(st.integers(1, 6))
    procs = [draw(process(setup, k)) for k in range(count)]
    # About one world in ten goes through ansible-playbook (reset_gpus.yml, check_gpus.yml); shrinking prefers modules.
    through = draw(st.sampled_from(("modules",) * 9 + ("playbook",)))
    return {"setup": setup, "procs": procs, "selection": draw(selection(setup, procs)), "through": through}


def decide(pool: "Pool", world: dict, directory: Path) -> tuple:
    """(decisions checked, violations, seconds) of `world`, through the modules or the playbooks as it says."""
    if world.get("through") == "playbook":
        out = run_playbook_world(pool, world, directory)
        return judge_playbook(world, out) + (out["seconds"],)
    out = run_world(pool, world)
    return judge(world, out) + (out["seconds"],)


class Pool:
    """Simulated nodes kept between worlds, one per GPU layout."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.nodes: dict = {}

    def node(self, setup: dict):
        key = (setup["gpus"], setup["mig"])
        if key not in self.nodes:
            knobs = {"gpus": setup["gpus"], "release_latency": 0.05}
            if setup["mig"]:
                knobs["mig"] = "%d:%s" % (setup["gpus"] - 1, MIG_LAYOUT)
            node = up("%s-%d-%d" % (self.prefix, setup["gpus"], int(setup["mig"])), **knobs)
            self.nodes[key] = (node, self._describe(node))
        return self.nodes[key]

    @staticmethod
    def _describe(node):
        text = node.py(
            "import json, pynvml as n\n"
            "n.nvmlInit(); out = {'uuids': [], 'mig': {}}\n"
            "for i in range(n.nvmlDeviceGetCount()):\n"
            "    h = n.nvmlDeviceGetHandleByIndex(i); out['uuids'].append(n.nvmlDeviceGetUUID(h))\n"
            "    try: count = n.nvmlDeviceGetMaxMigDeviceCount(h)\n"
            "    except n.NVMLError: count = 0\n"
            "    for k in range(count):\n"
            "        try: m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, k)\n"
            "        except n.NVMLError: continue\n"
            "        out['mig'].setdefault(str(i), {})[str(n.nvmlDeviceGetGpuInstanceId(m))] = n.nvmlDeviceGetUUID(m)\n"
            "print(json.dumps(out))"
        )
        described = json.loads(text)
        described["minors"] = [gpu["minor"] for gpu in node.info["gpus"]]
        # The MIG capability files (/dev/nvidia-caps/nvidia-capN) a context on each GPU instance holds: {index: {gi: [N]}}.
        described["caps"] = {
            index: {str(i["gi"]): i["caps"] for i in instances} for index, instances in node.info.get("mig", {}).items()
        }
        directory = node.run_dir / "daemons"
        directory.mkdir(exist_ok=True)
        for name in DAEMONS:
            path = directory / name
            if not path.exists():
                import shutil

                shutil.copy(os.path.realpath(VENV_PYTHON), path)
                path.chmod(0o755)
        return described

    def close(self):
        for node, _described in self.nodes.values():
            node.down()
        self.nodes.clear()


def _prepare(pool: Pool, world: dict):
    """The pooled node of `world`, set to its driver, with the world's spec written for inside.py."""
    node, described = pool.node(world["setup"])
    setup = world["setup"]
    knobs = {
        "memory_info": "unsupported" if setup["gb10"] else None,
        "driver_version": OLD_DRIVER if setup["old_driver"] else "580.95.05",
    }
    if described.get("knobs") != knobs:  # `gpunode set` is a process start: only when the driver changes
        node.set(**knobs)
        described["knobs"] = knobs
    spec = {
        "world": dict(world, sim_dir=SIM_DIR, caps=described["caps"]),
        "selection": world["selection"],
        "node": described,
    }
    (node.run_dir / "world.json").write_text(json.dumps(spec))
    return node, described


def _inside(node, *mode) -> dict:
    text = node.exec(str(VENV_PYTHON), str(WORLDS / "inside.py"), "/run/gpusim/world.json", *mode, timeout=120).stdout
    return json.loads(text)


def run_world(pool: Pool, world: dict) -> dict:
    """Plant `world` on a pooled node, run the modules inside it; return inside.py's output."""
    node, described = _prepare(pool, world)
    started = time.monotonic()
    out = _inside(node)
    out["seconds"] = time.monotonic() - started
    out["minors"] = described["minors"]
    return out


# The role's and the check's variables for a world's selection (gpu_kill's options as the playbooks name them).
ROLE_VARIABLES = {
    "gpus": "reset_gpus_gpus",
    "pids": "reset_gpus_pids",
    "match": "reset_gpus_match",
    "users": "reset_gpus_users",
    "exclude": "reset_gpus_exclude",
    "grace_period": "reset_gpus_grace_period",
    "kill_wait": "reset_gpus_kill_wait",
    "wait_timeout": "reset_gpus_timeout",
    "driver_timeout": "reset_gpus_driver_timeout",
}


def playbook_variables(args: dict) -> dict:
    variables = {ROLE_VARIABLES[key]: value for key, value in args.items() if key in ROLE_VARIABLES}
    variables.update(check_gpus_wait=2, check_gpus_exclude=args.get("exclude", []))
    if "gpus" in args:
        variables["check_gpus_gpus"] = args["gpus"]
    return variables


def run_playbook_world(pool: Pool, world: dict, directory: Path) -> dict:
    """Plant `world`, then run reset_gpus.yml and check_gpus.yml on its node in one ansible-playbook (tests/worlds/
    playbook.yml); return the plant's output with the truth after, the exit status and the output."""
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from ansible_run import playbook
    from simnode import inventory_file

    node, described = _prepare(pool, world)
    started = time.monotonic()
    out = _inside(node, "plant")
    directory.mkdir(parents=True, exist_ok=True)
    rc, output, recap = playbook(
        inventory_file(directory, node), WORLDS / "playbook.yml", "-e", json.dumps(playbook_variables(out["args"]))
    )
    out["after"] = out["last"] = _inside(node, "truth")
    out["playbook"] = {"rc": rc, "output": output, "recap": recap}
    out["seconds"] = time.monotonic() - started
    out["minors"] = described["minors"]
    return out


ENDED = ("Z", "X")


def _alive(truth, pid):
    process = truth["processes"].get(str(pid))
    return process is not None and process["state"] not in ENDED


def judge(world: dict, out: dict) -> tuple:
    """(decisions checked, violations) of one world the modules decided (run_world)."""
    violations: list = []
    decisions = 0
    before = out["before"]
    manifest, protected, verdict, selected, truth_holders = _verdict(world, out)

    code, facts = out["facts"]
    ephemeral = {pid for pid, e in manifest.items() if e.get("lifetime")}  # may be gone before a module looks
    for gpu in facts.get("ansible_facts", {}).get("nvidia", {}).get("gpus", []):
        decisions += 1
        expected = sorted(pid for pid, gpus in truth_holders.items() if gpu["index"] in gpus and pid not in ephemeral)
        if sorted(set(gpu.get("holder_pids") or []) - ephemeral) != expected:
            violations.append(
                "gpu_facts GPU %d: holder_pids %s, the oracle's holders %s"
                % (gpu["index"], gpu.get("holder_pids"), expected)
            )

    code, check = out["check"]
    would = {p["pid"] for p in check.get("would_signal", [])}
    decisions += len(verdict)
    if check.get("failed"):
        violations.append("check mode failed: %s" % check.get("msg"))
    for pid in sorted((would ^ selected) - ephemeral):
        violations.append(
            "check mode: PID %d (%s) %s, the oracle says %s"
            % (
                pid,
                before["processes"].get(str(pid), {}).get("comm"),
                "would be signalled" if pid in would else "would not be",
                verdict.get(pid, "holds nothing"),
            )
        )
    if out["after_check"]["signals"] != before["signals"]:
        violations.append("check mode sent signals: %s" % out["after_check"]["signals"])

    code, kill = out["kill"]
    kept = _may_fail(world, before, truth_holders, selected, protected)
    if kill.get("failed") and not kept:
        violations.append("gpu_kill failed: %s" % kill.get("msg"))
    survived = {p["pid"]: p.get("reason") for p in kill.get("survived", [])}
    decisions += _check_ends(out, manifest, verdict, selected, survived, violations)

    code, again = out["again"]
    decisions += 1
    if again.get("changed") or again.get("signalled"):
        violations.append(
            "second run: changed=%s, signalled %s"
            % (again.get("changed"), [p["pid"] for p in again.get("signalled", [])])
        )
    if again.get("failed") and not kept:
        violations.append("second run failed: %s" % again.get("msg"))
    return decisions, violations


def _verdict(world: dict, out: dict) -> tuple:
    """(manifest, protected PIDs, the oracle's {pid: reason}, the selected PIDs, the holders before the runs)."""
    manifest = _manifest(out)
    protected = _protected(out, manifest)
    verdict = oracle.decide(out["before"], out["minors"], world["selection"], out["args"], protected)
    selected = {pid for pid, reason in verdict.items() if reason == "selected"}
    return manifest, protected, verdict, selected, oracle.holders(out["before"], out["minors"])


def _manifest(out: dict) -> dict:
    """{pid: manifest entry} of the planted processes (a trainer's creator is gone; a missed reuser never got it)."""
    return {e["pid"]: e for e in out["manifest"] if e["role"] not in ("creator", "reuser-missed")}


def _protected(out: dict, manifest: dict) -> set:
    """What runs a protected daemon's executable (root's copy under the daemon's name): the planter says so."""
    return {
        pid
        for pid, e in manifest.items()
        if e.get("protected")
        and os.path.basename(out["before"]["processes"].get(str(pid), {}).get("exe") or "") in oracle.PROTECTED
    }


def _names(truth: dict, pid: int) -> set:
    process = truth["processes"][str(pid)]
    return {process["comm"], oracle.argv0(process["cmdline"])}


def _may_fail(world: dict, before: dict, truth_holders: dict, selected: set, protected: set) -> bool:
    """Whether the wait may rightly say "not released" on this world."""
    wanted = world["selection"].get("gpus")
    excluded = set(world["selection"]["options"].get("exclude", []))
    # Documented (gpu_kill, include_protected): with wait, a protected daemon's memory on a selected GPU counts, so the
    # wait fails, unless exclude names it.
    kept = any(
        pid in protected and oracle._on_selection(gpus, wanted) and not _names(before, pid) & excluded
        for pid, gpus in truth_holders.items()
    )
    # A driver before 535.113.01 seen from the node (a nested PID namespace) lists the initial namespace's numbers: the
    # memory a holder left alone keeps is listed under a number that names nothing here, so nothing can say it is
    # that holder's, and the wait says "not released" (docs/attribution.md, rule 3).
    return kept or (
        world["setup"]["old_driver"]
        and any(pid not in selected and oracle._on_selection(gpus, wanted) for pid, gpus in truth_holders.items())
    )


def _check_ends(out: dict, manifest: dict, verdict: dict, selected: set, survived: dict, violations: list) -> int:
    """Every selected holder ended or reported (`survived`: {pid: reason}); nothing else signalled or ended. Returns the
    decisions checked."""
    decisions = 0
    before, after, last = out["before"], out["after"], out["last"]
    for pid in sorted(selected):
        decisions += 1
        if _alive(after, pid) and after["processes"][str(pid)]["start"] == before["processes"][str(pid)]["start"]:
            if not survived.get(pid):
                violations.append("selected holder PID %d still alive and not reported" % pid)
    for pid, entry in sorted(manifest.items()):
        if pid in selected:
            continue
        decisions += 1
        got = last["signals"].get(str(pid))
        if got:
            violations.append(
                "PID %d (%s %s, %s) not selected but got signals %s"
                % (pid, entry["id"], entry["role"], verdict.get(pid, "holds nothing"), got)
            )
        was = before["processes"].get(str(pid))
        now = last["processes"].get(str(pid))
        if was is None or was["state"] in ENDED or entry.get("lifetime"):
            continue  # gone before the runs, or a process that ends by itself during them
        if now is None or now["state"] in ENDED or now["start"] != was["start"]:
            violations.append("PID %d (%s %s) not selected but ended" % (pid, entry["id"], entry["role"]))
    return decisions


def judge_playbook(world: dict, out: dict) -> tuple:
    """(decisions checked, violations) of a world that reset_gpus.yml and check_gpus.yml decided (run_playbook_world)."""
    violations: list = []
    minors, before = out["minors"], out["before"]
    manifest, protected, verdict, selected, truth_holders = _verdict(world, out)
    decisions = _check_ends(out, manifest, verdict, selected, {}, violations) + 1
    run = out["playbook"]
    checked = re.search(r"check_gpus (?!summary)\S+: ([^\"]*)", run["output"])
    if checked is None:
        if not _may_fail(world, before, truth_holders, selected, protected):
            violations.append("reset_gpus.yml failed (rc %s): %s" % (run["rc"], _failure(run["output"])))
        return decisions, violations
    # check_gpus says "free" only where no holder is left on the checked GPUs but those it leaves out (exclude,
    # protected daemons).
    excluded = set(world["selection"]["options"].get("exclude", []))
    after = out["after"]
    left = sorted(
        pid
        for pid, gpus in oracle.holders(after, minors).items()
        if oracle._on_selection(gpus, world["selection"].get("gpus"))
        and pid not in protected
        and not _names(after, pid) & excluded
    )
    if checked.group(1).startswith("GPUs free") and left:
        violations.append("check_gpus said free while PIDs %s hold the checked GPUs" % left)
    return decisions, violations


def _failure(output: str) -> str:
    lines = [line for line in output.splitlines() if "fatal:" in line or "FAILED!" in line]
    return (lines[-1] if lines else output[-300:]).strip()[:300]


def replay(world: dict) -> list:
    """The violations of one world (a shrunk one, tests/worlds/regressions/), on a node of its own."""
    import tempfile

    pool = Pool("t-%d-w" % os.getpid())
    try:
        with tempfile.TemporaryDirectory() as directory:
            return decide(pool, world, Path(directory))[1]
    finally:
        pool.close()
