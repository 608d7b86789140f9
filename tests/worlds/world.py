"""Generated worlds: random simulated GPU hosts, a random selection, the collection's modules run on them, and every
decision judged against the oracle (oracle.py). Used by tests/worlds/test_worlds.py and `make worlds`.

A world is plain data (JSON): the GPUs, the processes to plant (plant.py's kinds) and the selection. Nodes are kept
and reused between worlds with the same GPUs (`Pool`); inside.py ends the previous world's processes first.
"""

from __future__ import annotations

import json
import os
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
OPTIONS = {"grace_period": 1.0, "kill_wait": 3.0, "wait": True, "wait_timeout": 3.0, "driver_timeout": 10.0}


@st.composite
def gpu_setup(draw):
    count = draw(st.integers(1, 3))
    mig = draw(st.booleans()) if count > 1 else False
    return {
        "gpus": count,
        "mig": mig,  # GPU count-1 in MIG mode with two 2g.20gb instances
        "gb10": (not mig) and draw(st.booleans()),
        "old_driver": draw(st.booleans()),
    }


def _gpus_of(draw, setup):
    indices = draw(st.lists(st.integers(0, setup["gpus"] - 1), min_size=1, max_size=2, unique=True))
    mig_index = setup["gpus"] - 1 if setup["mig"] else None
    gi = {str(mig_index): draw(st.sampled_from(MIG_GIS))} if mig_index in indices else {}
    return sorted(indices), gi


@st.composite
def process(draw, setup, number):
    kind = draw(st.sampled_from(("holder", "holder", "trainer", "trainer", "nvml", "cuinit", "sleeper", "daemon")))
    spec = {"id": "p%d" % number, "kind": kind}
    if kind in ("holder", "trainer", "daemon"):
        spec["gpus"], spec["gi"] = _gpus_of(draw, setup)
        spec["mib"] = draw(st.sampled_from((512, 4096, 20000)))
    if kind == "holder":
        spec["title"] = draw(st.sampled_from(TITLES))
        spec["ignore_term"] = draw(st.booleans())
        spec["user"] = draw(st.sampled_from(("root", "nobody")))
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
    return {"setup": setup, "procs": procs, "selection": draw(selection(setup, procs))}


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
        for name in ("nvidia-persistenced", "dcgm-exporter"):
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


def run_world(pool: Pool, world: dict) -> dict:
    """Plant `world` on a pooled node, run the modules inside it; return inside.py's output."""
    node, described = pool.node(world["setup"])
    setup = world["setup"]
    node.set(
        memory_info="unsupported" if setup["gb10"] else None,
        driver_version=OLD_DRIVER if setup["old_driver"] else "580.95.05",
    )
    spec = {
        "world": dict(world, sim_dir=SIM_DIR, caps=described["caps"]),
        "selection": world["selection"],
        "node": described,
    }
    path = node.run_dir / "world.json"
    path.write_text(json.dumps(spec))
    started = time.monotonic()
    text = node.exec(str(VENV_PYTHON), str(WORLDS / "inside.py"), "/run/gpusim/world.json", timeout=120).stdout
    out = json.loads(text)
    out["seconds"] = time.monotonic() - started
    out["minors"] = described["minors"]
    return out


ENDED = ("Z", "X")


def _alive(truth, pid):
    process = truth["processes"].get(str(pid))
    return process is not None and process["state"] not in ENDED


def judge(world: dict, out: dict) -> tuple:
    """(decisions checked, violations) of one world."""
    violations: list = []
    decisions = 0
    minors = out["minors"]
    manifest = {e["pid"]: e for e in out["manifest"] if e["role"] not in ("creator", "reuser-missed")}
    daemons = {s["id"] for s in world["procs"] if s["kind"] == "daemon" and s["real"] and s["name"] in oracle.PROTECTED}
    protected = {pid for pid, e in manifest.items() if e["role"] == "daemon" and e["id"] in daemons}
    before = out["before"]
    verdict = oracle.decide(before, minors, world["selection"], out["args"], protected)
    selected = {pid for pid, reason in verdict.items() if reason == "selected"}
    truth_holders = oracle.holders(before, minors)

    code, facts = out["facts"]
    for gpu in facts.get("ansible_facts", {}).get("nvidia", {}).get("gpus", []):
        decisions += 1
        expected = sorted(pid for pid, gpus in truth_holders.items() if gpu["index"] in gpus)
        if sorted(gpu.get("holder_pids") or []) != expected:
            violations.append(
                "gpu_facts GPU %d: holder_pids %s, the oracle's holders %s"
                % (gpu["index"], gpu.get("holder_pids"), expected)
            )

    code, check = out["check"]
    would = {p["pid"] for p in check.get("would_signal", [])}
    decisions += len(verdict)
    if check.get("failed"):
        violations.append("check mode failed: %s" % check.get("msg"))
    for pid in sorted(would ^ selected):
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
    after = out["after"]
    # Documented (gpu_kill, include_protected): with wait, a protected daemon's memory on a selected GPU counts, so the
    # wait fails, unless exclude names it.
    excluded = set(world["selection"]["options"].get("exclude", []))
    kept = any(
        pid in protected
        and oracle._on_selection(gpus, world["selection"].get("gpus"))
        and not {before["processes"][str(pid)]["comm"], oracle.argv0(before["processes"][str(pid)]["cmdline"])}
        & excluded
        for pid, gpus in truth_holders.items()
    )
    # A driver before 535.113.01 seen from the node (a nested PID namespace) lists the initial namespace's numbers: the
    # memory a holder left alone keeps is listed under a number that names nothing here, so nothing can say it is
    # that holder's, and the wait says "not released" (docs/attribution.md, rule 3).
    kept = kept or (
        world["setup"]["old_driver"]
        and any(
            pid not in selected and oracle._on_selection(gpus, world["selection"].get("gpus"))
            for pid, gpus in truth_holders.items()
        )
    )
    if kill.get("failed") and not kept:
        violations.append("gpu_kill failed: %s" % kill.get("msg"))
    survived = {p["pid"]: p.get("reason") for p in kill.get("survived", [])}
    for pid in sorted(selected):
        decisions += 1
        if _alive(after, pid) and after["processes"][str(pid)]["start"] == before["processes"][str(pid)]["start"]:
            if not survived.get(pid):
                violations.append("selected holder PID %d still alive and not reported" % pid)
    last = out["last"]
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
        if was is None or was["state"] in ENDED:
            continue
        if now is None or now["state"] in ENDED or now["start"] != was["start"]:
            violations.append("PID %d (%s %s) not selected but ended" % (pid, entry["id"], entry["role"]))

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


def replay(world: dict) -> list:
    """The violations of one world (a shrunk one, tests/worlds/regressions/), on a node of its own."""
    pool = Pool("t-%d-w" % os.getpid())
    try:
        return judge(world, run_world(pool, world))[1]
    finally:
        pool.close()
