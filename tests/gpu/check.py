# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Acceptance check of gpuops.nvidia on a real NVIDIA GPU (tests/gpu/README.md).

    python3 tests/gpu/check.py [--out DIR] [--gpu INDEX] [--backend auto|torch|cuda|sim]
                               [--sizes-gib 1,10,50] [--tree-gib 1] [--pinned-gib 32] [--deadline SECONDS]
                               [--tolerance-mib MIB] [--only SCENARIO,...]
    python3 tests/gpu/check.py --probe                   exit 0 with a driver, else 2 "skipped: no NVIDIA GPU (...)"
    python3 tests/gpu/check.py --missing-packages        pip names of the needed packages this Python lacks
    python3 tests/gpu/check.py --render-md RESULT.json... docs/hardware.md's table for these results

Starts real CUDA workloads (tests/gpu/workload.py), nvidia-smi and a private MPS daemon on one GPU, runs gpu_facts,
gpu_kill, gpu_wait, playbooks/check_gpus.yml and playbooks/reset_gpus.yml through ansible-playbook against
localhost, measures what the driver does, records the device files and mappings of every process it starts, and
writes DIR/result.json (default tests/gpu/out) and DIR/result.md. Only processes this run started are ever
signalled (pinned by PID and start time; gpu_kill gets their PIDs and this run's unique marker).

Exit status: 0 every check passed (differences from the simulator are recorded, not failures);
1 a check failed or a scenario broke; 2 skipped (no NVIDIA GPU, or no way to allocate GPU memory);
3 Python packages missing (run tests/gpu/run.sh, which installs them from tests/gpu/wheels).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import importlib.util
import json
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# tests/gpu (gpucheck) and tests/ (ansible_api, polling: the helpers the other tests use as well).
sys.path[:0] = [HERE, os.path.join(REPO, "tests")]

# pylint: disable=wrong-import-position
from gpucheck import attribution, driver, procs, report  # noqa: E402
from gpucheck.ansible_run import Ansible  # noqa: E402
from gpucheck.scenarios import ATTRIBUTION_TOLERANCE_MIB, CheckError, DriverScenarios, Skip  # noqa: E402
from gpucheck.timing import Deadline, poll_until, time_events  # noqa: E402
from gpucheck.workloads import WorkloadError, Workloads, log_tail  # noqa: E402

EXIT_OK, EXIT_FAILED, EXIT_SKIPPED, EXIT_MISSING = 0, 1, 2, 3
# Python module -> pip requirement, for what the check and the modules need on this host.
REQUIRED = {"ansible": "ansible-core", "ansible_runner": "ansible-runner", "pynvml": "nvidia-ml-py", "psutil": "psutil"}
OPTIONAL = {"setproctitle": "setproctitle"}
MIN_ANSIBLE = (2, 17)
MIB = 1 << 20


def translates(driver_version):
    """Whether the driver gives PIDs in the caller's PID namespace: 535.113.01 and later (docs/attribution.md)."""
    parts = str(driver_version or "").split(".")
    if not all(part.isdigit() for part in parts) or not parts[0]:
        return True
    return tuple(int(part) for part in (parts + ["0", "0"])[:3]) >= (535, 113, 1)


# (scenario, seconds it needs at least): skipped when less time is left. On an H200 (driver 580.159.04) the first
# seven took 96 s together (tests/fixtures/hardware/h200-580.159.04/gpucheck.log); pinned_release allocates 32 GiB of
# pinned host memory (18 s there) and waits 5 s for the exit.
SCENARIOS = (
    ("idle", 10),
    ("attribution", 45),
    ("dead_creator", 50),
    ("reused_pid", 45),
    ("mps", 45),
    ("ipc", 40),
    ("vllm_tree", 40),
    ("inherited", 40),
    ("sigterm_ignored", 30),
    ("nested_pidns", 40),
    ("release_latency", 30),
    ("pinned_release", 70),
)
# What a simulated node cannot do yet (tests/sim/README.md): those scenarios are skipped there with the reason.
# nvmlDeviceGpuRecoveryAction_t in its order (nvidia-ml-py 13.615.71), as gpu_facts names them.
RECOVERY_ACTIONS = (
    "none",
    "gpu_reset",
    "node_reboot",
    "drain_p2p",
    "drain_and_reset",
    "recover_imex_domain",
    "bus_reset",
    "system_reboot",
)
SIM_CANNOT = {
    "mps": "a simulated node has no MPS control daemon (nvidia-cuda-mps-control) to start",
    "ipc": "the simulator models no CUDA IPC (cuIpcGetMemHandle, cuIpcOpenMemHandle)",
    "pinned_release": "the simulator models no pinned host memory",
}


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Acceptance check of gpuops.nvidia on a real NVIDIA GPU")
    parser.add_argument("--out", default=os.path.join(HERE, "out"), help="directory for result.json and result.md")
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to use (default 0)")
    parser.add_argument(
        "--backend",
        choices=("auto", "torch", "cuda", "sim"),
        default="auto",
        help="how workloads allocate: PyTorch, the CUDA driver API via ctypes, or a simulated node",
    )
    parser.add_argument("--sizes-gib", default="1,10,50", help="allocations whose release latency is measured")
    parser.add_argument(
        "--tree-gib", type=int, default=1, help="GiB each allocating process holds in the other scenarios"
    )
    parser.add_argument(
        "--pinned-gib", type=int, default=32, help="GiB of pinned host memory in the pinned_release scenario"
    )
    parser.add_argument("--deadline", type=float, default=420.0, help="overall time budget in seconds")
    parser.add_argument(
        "--tolerance-mib", type=int, default=64, help="MiB above the idle level that counts as released"
    )
    parser.add_argument(
        "--only",
        help="comma-separated scenarios to run (default all: %s)" % ",".join(name for name, _seconds in SCENARIOS),
    )
    parser.add_argument("--probe", action="store_true", help="only say whether an NVIDIA GPU is usable")
    parser.add_argument("--missing-packages", action="store_true", help="only print the pip names of missing packages")
    parser.add_argument("--render-md", nargs="+", metavar="RESULT_JSON", help="print docs/hardware.md's table")
    args = parser.parse_args(argv)
    args.sizes_gib = [int(item) for item in args.sizes_gib.split(",") if item.strip()]
    known = [name for name, _seconds in SCENARIOS]
    args.only = [item.strip() for item in args.only.split(",") if item.strip()] if args.only else known
    unknown = sorted(set(args.only) - set(known))
    if unknown:
        parser.error("unknown scenario(s) %s; known: %s" % (", ".join(unknown), ", ".join(known)))
    return args


def missing_packages():
    """pip requirement names of the modules in REQUIRED and OPTIONAL that this Python cannot import
    (ansible-core also when older than MIN_ANSIBLE)."""
    missing = [
        package for module, package in dict(REQUIRED, **OPTIONAL).items() if importlib.util.find_spec(module) is None
    ]
    if "ansible-core" not in missing:
        from ansible.release import __version__

        if tuple(int(part) for part in re.findall(r"\d+", __version__)[:2]) < MIN_ANSIBLE:
            missing.append("ansible-core")
    return missing


def choose_backend(requested):
    """(backend, None) or (None, why no workload can allocate GPU memory here)."""
    if requested == "sim":
        run_dir = os.environ.get("GPUSIM_RUN", "/run/gpusim")
        if os.path.exists(os.path.join(run_dir, "node.conf")):
            return "sim", None
        return None, "no simulated node here (%s/node.conf is missing)" % run_dir
    if requested in ("auto", "torch") and importlib.util.find_spec("torch") is not None:
        return "torch", None
    if requested == "torch":
        return None, "PyTorch is not installed"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        return None, "no PyTorch and no CUDA driver library (%s)" % error
    return "cuda", None


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def git_commit():
    try:
        return subprocess.run(
            ["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def settings(args):
    """The options of a run, as result.json records them."""
    return {
        "deadline_s": args.deadline,
        "sizes_gib": args.sizes_gib,
        "tree_gib": args.tree_gib,
        "pinned_gib": args.pinned_gib,
        "tolerance_mib": args.tolerance_mib,
        "scenarios": args.only,
    }


def _raise_exit(signum, _frame):
    raise SystemExit(128 + signum)


class CheckRun(DriverScenarios):
    """One run of the check on GPU `args.gpu` with workload backend `backend`; execute() -> exit status."""

    def __init__(self, args, backend, pynvml):
        self.args = args
        self.backend = backend
        self.nvml = pynvml
        self.started = time.monotonic()
        self.deadline = Deadline(args.deadline)
        self.marker = "gpucheck-%d-%s" % (os.getpid(), secrets.token_hex(4))
        self.workdir = tempfile.mkdtemp(prefix="gpuops-gpucheck-")
        os.makedirs(os.path.join(self.workdir, "run"))
        self.gpu = driver.Gpu(pynvml, args.gpu)
        identity = self.gpu.identity()
        self.index = args.gpu
        self.ansible = Ansible(REPO, os.path.join(self.workdir, "ansible"))
        self.workloads = Workloads(
            os.path.join(self.workdir, "run"), self.marker, backend, self.index, identity["uuid"]
        )
        self.idle_used_mib = self.used_mib()  # the level "released" returns to; the idle scenario reads it again
        self.result = {
            "schema": 2,
            "date": utc_now(),
            "status": None,
            "gpu": {
                key: identity[key]
                for key in (
                    "index",
                    "name",
                    "uuid",
                    "minor",
                    "pci_bus_id",
                    "memory_total_mib",
                    "persistence_mode",
                    "compute_mode",
                    "gpu_count",
                )
            },
            "driver": {key: identity[key] for key in ("driver_version", "nvml_version", "cuda_driver_version")},
            "host": {
                "kernel": platform.release(),
                "python": platform.python_version(),
                "ansible_core": self.ansible.version(),
                "backend": backend,
                "backend_details": None,
                "root": os.geteuid() == 0,
                "setproctitle": importlib.util.find_spec("setproctitle") is not None,
                "pidfd": hasattr(os, "pidfd_open"),
                "collection_commit": git_commit(),
                "marker": self.marker,
            },
            "settings": settings(args),
            "scenarios": {},
            "processes": {},
            "workdir": self.workdir,
        }
        self.result["gpu"]["all_minors"] = self.gpu.minors()
        # Each GPU's /dev/nvidiaN as /proc/PID/maps names a mapped file (device, inode): mappings are matched by it.
        self.identities = {minor: procs.file_identity("/dev/nvidia%d" % minor) for minor in self.gpu.minors()}
        self.result["gpu"]["device_file_identities"] = {str(k): v for k, v in self.identities.items()}
        self.result["gpu"]["mig_mode"] = self.gpu.mig_mode()  # read only (issue 13): the check never changes it

    # ---- readings ------------------------------------------------------------------------------

    def log(self, text):
        print("[%6.1f s] %s" % (time.monotonic() - self.started, text), flush=True)

    def used_mib(self):
        return self.gpu.used_bytes() // MIB

    def settle(self, timeout=30.0):
        """Wait until used memory is back at the idle level (plus the tolerance); returns used MiB."""
        limit = self.idle_used_mib + self.args.tolerance_mib
        poll_until(lambda: self.used_mib() <= limit, self.deadline.cap(timeout), interval=0.05)
        return self.used_mib()

    def facts(self, args=None):
        """ansible_facts.nvidia from gpu_facts run through ansible-playbook."""
        run = self.ansible.module("gpuops.nvidia.gpu_facts", args, timeout=self.deadline.cap(120))
        if run["status"] != "SUCCESS":
            raise CheckError("gpu_facts: %s %s" % (run["status"], run["result"].get("msg") or run["output"]))
        return run["result"]["ansible_facts"]["nvidia"]

    def gpu_facts_summary(self, facts):
        gpu = next((g for g in facts["gpus"] if g["index"] == self.index), None)
        if gpu is None:
            raise CheckError("gpu_facts reports no GPU %d: %s" % (self.index, facts["driver"]))
        return {
            key: gpu[key]
            for key in (
                "memory_total_mib",
                "memory_used_mib",
                "memory_reserved_mib",
                "memory_source",
                "explained_mib",
                "unexplained_mib",
                "holder_pids",
            )
        }

    def holder_records(self, infos, facts=None):
        """{name: what the driver, gpu_facts and /proc say about each ready workload}."""
        listed = self.gpu.processes()
        by_pid = {h["pid"]: h for h in facts["holders"]} if facts else {}
        users = {u["pid"]: u for u in facts.get("device_users") or []} if facts else {}
        records = {}
        for name, info in infos.items():
            pid = info["host_pid"]
            entry, holder = listed.get(pid), by_pid.get(pid)
            stat = procs.read_stat(pid) or {}
            record = {
                "pid": pid,
                "ns_pid": info["pid"],
                "role": info["role"],
                "bytes": info["bytes"],
                "comm": stat.get("comm"),
                "cmdline": info["cmdline"],
                "retitled_with": info["retitled_with"],
                "lists": entry["lists"] if entry else [],
                "listed_mib": entry["used_mib"] if entry else None,
                "device_files": procs.device_files(pid),
            }
            if facts is not None:
                user = users.get(pid)
                view = attribution.facts_view(pid, facts)
                record.update(
                    found_by_facts=holder is not None,
                    seen_in=holder["seen_in"] if holder else None,
                    found_by_scan=bool({"fd", "mapping"} & set((holder or user or {}).get("seen_in") or [])),
                    facts_role=view["role"],
                    facts_attribution=view["attribution"],
                    facts_kind=view["kind"],
                    facts_comm=holder["comm"] if holder else None,
                    facts_cmdline=holder["cmdline"] if holder else None,
                    facts_gpus=holder["gpus"] if holder else None,
                    facts_memory_mib=holder["memory_mib"].get(str(self.index)) if holder else None,
                )
            records[name] = record
        if self.result["host"]["backend_details"] is None:
            self.result["host"]["backend_details"] = next(
                (i["backend_details"] for i in infos.values() if i["backend_details"] and i["role"] == "hold"), None
            )
        return records

    # ---- the modules -----------------------------------------------------------------------------

    def gpu_kill(self, names, **options):
        """gpu_kill restricted to our processes `names` (their PIDs, this run's marker, this GPU)."""
        ours = {self.workloads.pid(name): name for name in names}
        args = dict(gpus=[self.index], pids=sorted(ours), match=re.escape(self.marker), **options)
        run = self.ansible.module("gpuops.nvidia.gpu_kill", args, timeout=self.deadline.cap(180))
        result = run["result"]
        if run["status"] is None:
            raise CheckError("gpu_kill gave no result: %s" % run["output"])
        exited = {item["pid"]: item.get("exited_after_s") for item in result.get("exited", [])}
        return {
            "status": run["status"],
            "msg": result.get("msg"),
            "elapsed_s": result.get("elapsed_s"),
            "ansible_s": run["elapsed_s"],
            "signalled": {
                ours.get(item["pid"], "PID %d" % item["pid"]): {
                    "pid": item["pid"],
                    "signals": item["signals"],
                    "exited_after_s": exited.get(item["pid"]),
                }
                for item in result.get("signalled", [])
            },
            "not_holding": [ours.get(pid, pid) for pid in result.get("not_holding", [])],
            "survived": result.get("survived", []),
            "protected": result.get("protected", []),
        }

    def gpu_wait(self, timeout=60.0):
        run = self.ansible.module(
            "gpuops.nvidia.gpu_wait", dict(gpus=[self.index], timeout=timeout), timeout=self.deadline.cap(timeout + 60)
        )
        result = run["result"]
        if run["status"] is None:
            raise CheckError("gpu_wait gave no result: %s" % run["output"])
        return {
            "status": run["status"],
            "released": result.get("released"),
            "elapsed_s": result.get("elapsed_s"),
            "polls": result.get("polls"),
            "ansible_s": run["elapsed_s"],
            "msg": result.get("msg"),
            "gpus": result.get("gpus"),
        }

    @staticmethod
    def check(scenario, name, ok, detail=None):
        scenario["checks"].append({"name": name, "ok": bool(ok), "detail": detail})

    def check_only_ours(self, scenario, kill, names):
        signalled = set(kill["signalled"])
        self.check(
            scenario, "gpu_kill signalled exactly %s" % sorted(names), signalled == set(names), sorted(signalled)
        )

    def end_scenario_processes(self):
        """SIGKILL the pinned processes still alive (e.g. an orphaned EngineCore) and wait until they are gone."""
        alive = [name for name in self.workloads.pinned if self.workloads.alive(name)]
        for name in alive:
            self.workloads.kill(name)
        poll_until(lambda: not any(self.workloads.alive(name) for name in alive), self.deadline.cap(10), interval=0.05)
        self.workloads.forget_gone()
        return alive

    # ---- scenarios -----------------------------------------------------------------------------

    def scenario_idle(self, scenario):
        memory = self.gpu.memory()
        self.idle_used_mib = memory["used_mib"] if memory["used_mib"] is not None else memory["used_v1_mib"]
        facts = self.facts()
        own = os.getpid()
        gpu = self.gpu_facts_summary(facts)
        scenario.update(
            memory=memory,
            driver_processes=sorted(self.gpu.processes()),
            nvml_client_device_files=procs.device_files(own),
            gpu_facts=gpu,
            other_holders=[
                {key: h[key] for key in ("pid", "comm", "cmdline", "seen_in", "memory_mib", "control_only")}
                for h in facts["holders"]
                if h["pid"] != own and (self.index in h["gpus"] or h["control_only"])
            ],
        )
        self.check(
            scenario,
            "gpu_facts reads the GPU's total memory",
            gpu["memory_total_mib"] == memory["total_mib"],
            [gpu["memory_total_mib"], memory["total_mib"]],
        )
        self.check(
            scenario,
            "gpu_facts reads NVML memory info v2",
            gpu["memory_source"] == "nvmlDeviceGetMemoryInfo_v2",
            gpu["memory_source"],
        )
        self.record_recovery(scenario, facts)

    def record_recovery(self, scenario, facts):
        """What the driver advises about the GPU, read only (issue 44): pynvml's own reads, gpu_facts' "recovery", and
        whether the kernel log can be read. Nothing resets the GPU or changes persistence mode here: the check only
        reads (tests/unit/gpu_check/test_gpucheck_recovery.py fails on a reset or -pm in tests/gpu/)."""
        raw = self.gpu.recovery()
        recovery = next((g.get("recovery") for g in facts["gpus"] if g["index"] == self.index), None)
        scenario.update(driver_advice=raw, gpu_facts_recovery=recovery)
        action = raw.get("recovery_action") or {}
        if recovery is not None and action.get("return") == 0:
            self.check(
                scenario,
                "gpu_facts reads the driver's recovery action (field 230)",
                recovery["action"] == RECOVERY_ACTIONS[action["value"]] if action["value"] < 8 else False,
                [recovery["action"], action],
            )
        if recovery is not None and isinstance(raw.get("persistence_mode"), int):
            self.check(
                scenario,
                "gpu_facts reads persistence mode",
                recovery["persistence_mode"] == bool(raw["persistence_mode"]),
                [recovery["persistence_mode"], raw["persistence_mode"]],
            )

    def ready(self, names, launcher, timeout):
        """Workloads.wait_ready (capped by the deadline), then the device files and mappings of each process."""
        infos = self.workloads.wait_ready(names, launcher, self.deadline.cap(timeout))
        for name, info in infos.items():
            self.record_process(name, info["host_pid"], info["role"])
        return infos

    def record_process(self, name, pid, role):
        """Record what process `name` shows of the driver once it is ready (every process the check starts):
        result["processes"][name] = {"pid", "role", "at_s", "fds" ({path: fds}), "maps" (/dev/nvidia* lines)}."""
        self.result["processes"][name] = dict(
            procs.device_record(pid), role=role, at_s=round(time.monotonic() - self.started, 2)
        )

    def shows_context(self, pid, index):
        """Whether `pid` maps GPU `index`'s /dev/nvidiaN read-write and shared (attribution.context_gpus)."""
        lines = procs.device_mappings(pid)
        return index in attribution.context_gpus(lines, self.result["gpu"]["all_minors"], self.identities)

    def reading(self, scenario, phase, pids, cases=attribution.CASES):
        """One reading of a scenario's processes `pids` ({case: PID}): raw records from /proc and the driver's lists
        of every GPU, the rule applied to them, gpu_facts' view (through ansible-playbook), and the checks comparing
        them (gpucheck/attribution.py, `cases`). Stored as scenario["readings"][phase] = {case: {"record", "rule",
        "facts", "meets"}}; returns gpu_facts' facts."""
        lists = self.gpu.all_processes()
        memory = attribution.gpu_memory(
            lists,
            self.gpu.all_used_mib(),
            ATTRIBUTION_TOLERANCE_MIB,
            alive=lambda pid: os.path.exists("/proc/%d" % pid),
            shows_context=self.shows_context,
        )
        minors = self.result["gpu"]["all_minors"]
        records = {
            case: attribution.raw_record(procs.device_record(pid), lists, minors, self.identities)
            for case, pid in pids.items()
        }
        facts = self.facts({"max_used_mib": ATTRIBUTION_TOLERANCE_MIB})
        expected = {name: spec for name, _what, _phase, spec in cases}
        reading = scenario.setdefault("readings", {})[phase] = {}
        translating = translates(self.result["driver"]["driver_version"])
        for case, record in records.items():
            rule = attribution.by_rule(record, memory, translating=translating)
            view = attribution.facts_view(record["pid"], facts)
            for name, ok, detail in attribution.judge(case, phase, record, rule, view, self.index, cases):
                self.check(scenario, name, ok, detail)
            reading[case] = {
                "record": record,
                "rule": rule,
                "facts": view,
                "meets": attribution.meets(view, expected[case], self.index),
            }
        scenario.setdefault("memory", {})[phase] = memory[self.index]
        scenario.setdefault("gpu_facts", {})[phase] = self.gpu_facts_summary(facts)
        return facts

    def scenario_attribution(self, scenario):
        """Four real processes (gpucheck/attribution.py CASES): a CUDA context, an NVML-only client and CUDA
        initialized without a context, read while the driver's lists explain the GPU's memory; then a forked child
        of a CUDA process after the parent's SIGKILL (inherited handles keep memory no list explains), read again."""
        nbytes = self.args.tree_gib << 30
        starts = (
            ("attr.context", "context", {"nbytes": nbytes}),
            ("attr.nvml", "nvml_only", {"role": "nvml"}),
            ("attr.cuinit", "cuda_init", {"role": "cuinit"}),
        )
        launchers = [(name, self.workloads.start(name, **options)) for name, _case, options in starts]
        infos = {}
        for name, launcher in launchers:
            infos.update(self.ready([name], launcher, 120))
        pids = {case: infos[name]["host_pid"] for name, case, _options in starts}
        if self.result["host"]["backend_details"] is None:
            self.result["host"]["backend_details"] = infos["attr.context"]["backend_details"] or None
        scenario["init_details"] = {case: infos[name]["backend_details"] for name, case, _options in starts}
        scenario["pids"] = dict(pids)
        self.reading(scenario, "explained", pids)
        launcher = self.workloads.start("attr.inherit", nbytes=nbytes, fork_child=True)
        forked = self.ready(["attr.inherit", "attr.inherit.child"], launcher, 120)
        parent, child = forked["attr.inherit"]["host_pid"], forked["attr.inherit.child"]["host_pid"]
        self.workloads.kill("attr.inherit")
        gone = poll_until(lambda: not self.workloads.alive("attr.inherit"), self.deadline.cap(10))
        self.check(scenario, "the inherited child's parent is gone after SIGKILL", gone)
        # The driver keeps listing a context under its creator's PID while the child holds its handles
        # (open-gpu-kernel-modules gpu_rmapi.c gpuGetProcWithObject_IMPL): recorded, what the child holds too.
        listed = self.gpu.processes()
        scenario["inherit_parent"] = {
            "pid": parent,
            "listed_after_exit": parent in listed,
            "parent_lists": (listed.get(parent) or {}).get("lists", []),
            "child_lists": (listed.get(child) or {}).get("lists", []),
            "child_device_files": sorted(procs.device_files(child)),
        }
        pids["inherited_child"] = scenario["pids"]["inherited_child"] = child
        self.reading(scenario, "unexplained", pids)
        scenario["table"] = attribution.table_rows(scenario, self.result["gpu"]["all_minors"])

    def scenario_vllm_tree(self, scenario):
        nbytes = self.args.tree_gib << 30
        names = ["vllm", "vllm.engine", "vllm.engine.tp0", "vllm.engine.tp1"]
        workers, engine = names[2:], names[1]
        launcher = self.workloads.start("vllm", role="api", nbytes=nbytes, tp=2)
        infos = self.ready(names, launcher, 180)
        facts = self.facts()
        holders = scenario["holders"] = self.holder_records(infos, facts)
        scenario["gpu_facts"] = self.gpu_facts_summary(facts)
        for rank, name in enumerate(workers):
            holder = holders[name]
            self.check(
                scenario,
                "gpu_facts finds %s on GPU %d" % (name, self.index),
                holder["found_by_facts"] and self.index in holder["facts_gpus"],
                holder["seen_in"],
            )
            self.check(
                scenario,
                "gpu_facts reports %s's comm as the kernel's 15-byte cut" % name,
                holder["facts_comm"] == ("VLLM::Worker_TP%d" % rank)[:15],
                holder["facts_comm"],
            )
            self.check(
                scenario,
                "gpu_facts reports %s's full cmdline" % name,
                holder["facts_cmdline"] == holder["cmdline"],
                holder["facts_cmdline"],
            )
        self.check(
            scenario,
            "API server and EngineCore (no CUDA) are not holders",
            not holders["vllm"]["found_by_facts"] and not holders[engine]["found_by_facts"],
        )
        self.workloads.kill("vllm")
        gone = poll_until(lambda: not self.workloads.alive("vllm"), self.deadline.cap(10))
        orphans = all(self.workloads.alive(name) for name in names[1:])
        self.check(scenario, "EngineCore and workers outlive the API server's SIGKILL", gone and orphans)
        before = self.used_mib()
        kill = scenario["gpu_kill"] = self.gpu_kill(names[1:], grace_period=5)
        self.check_only_ours(scenario, kill, workers)
        self.check(
            scenario,
            "gpu_kill leaves EngineCore (no GPU) as not holding",
            engine in kill["not_holding"],
            kill["not_holding"],
        )
        wait = scenario["gpu_wait"] = self.gpu_wait()
        self.check(scenario, "gpu_wait: released", wait["released"], wait["msg"])
        after = self.used_mib()
        scenario["memory"] = {"before_kill_mib": before, "after_wait_mib": after, "freed_mib": before - after}
        self.check(
            scenario,
            "at least the workers' allocations were freed",
            before - after >= 2 * (nbytes // MIB) - self.args.tolerance_mib,
            before - after,
        )

    def scenario_inherited(self, scenario):
        nbytes = self.args.tree_gib << 30
        baseline = self.used_mib()
        launcher = self.workloads.start("inherit", nbytes=nbytes, fork_child=True)
        infos = self.ready(["inherit", "inherit.child"], launcher, 120)
        holders = scenario["holders"] = self.holder_records(infos, self.facts())
        self.check(
            scenario,
            "gpu_facts finds the listed parent as a holder while both live",
            holders["inherit"]["found_by_facts"],
            holders["inherit"]["seen_in"],
        )
        # The parent's listed memory explains the GPU: the child's inherited handle makes it a device user only.
        self.check(
            scenario,
            "gpu_facts reports the child as a device user, not a holder, while the parent lives",
            holders["inherit.child"]["facts_role"] == "device_user",
            holders["inherit.child"]["facts_role"],
        )
        parent, child = infos["inherit"]["host_pid"], infos["inherit.child"]["host_pid"]
        self.workloads.kill("inherit")
        gone = poll_until(lambda: not self.workloads.alive("inherit"), self.deadline.cap(10))
        self.check(scenario, "the allocating parent is gone after SIGKILL", gone)
        # Watch whether the memory goes without the parent (it must not while the child holds the handles).
        released = poll_until(lambda: self.used_mib() <= baseline + self.args.tolerance_mib, self.deadline.cap(5.0))
        listed = self.gpu.processes()
        facts = self.facts()
        child_view = self.holder_records({"inherit.child": infos["inherit.child"]}, facts)["inherit.child"]
        scenario["after_parent_exit"] = {
            "memory_kept": not released,
            "used_mib": self.used_mib(),
            "baseline_mib": baseline,
            "child_lists": (listed.get(child) or {}).get("lists", []),
            "parent_lists": (listed.get(parent) or {}).get("lists", []),
            "child": child_view,
            "gpu_facts": self.gpu_facts_summary(facts),
        }
        self.check(
            scenario,
            "gpu_facts finds the child that only inherited the handles (memory unexplained)",
            child_view["found_by_facts"] and child_view["facts_attribution"].get(str(self.index)) == "device_file",
            [child_view["seen_in"], child_view["facts_attribution"]],
        )
        before = self.used_mib()
        kill = scenario["gpu_kill"] = self.gpu_kill(["inherit.child"], grace_period=5)
        self.check_only_ours(scenario, kill, ["inherit.child"])
        wait = scenario["gpu_wait"] = self.gpu_wait()
        self.check(scenario, "gpu_wait: released", wait["released"], wait["msg"])
        after = self.used_mib()
        scenario["memory"] = {"before_kill_mib": before, "after_wait_mib": after, "freed_mib": before - after}

    def scenario_sigterm_ignored(self, scenario):
        nbytes = self.args.tree_gib << 30
        launcher = self.workloads.start("stubborn", nbytes=nbytes, ignore_sigterm=True)
        infos = self.ready(["stubborn"], launcher, 120)
        scenario["holders"] = self.holder_records(infos, self.facts())
        before = self.used_mib()
        grace = 2.0
        kill = scenario["gpu_kill"] = self.gpu_kill(["stubborn"], grace_period=grace, kill_wait=10)
        self.check_only_ours(scenario, kill, ["stubborn"])
        sent = kill["signalled"].get("stubborn", {})
        self.check(
            scenario,
            "SIGTERM ignored, then SIGKILL",
            sent.get("signals") == ["SIGTERM", "SIGKILL"],
            sent.get("signals"),
        )
        self.check(
            scenario,
            "exit observed after the grace period",
            (sent.get("exited_after_s") or 0) >= grace,
            sent.get("exited_after_s"),
        )
        wait = scenario["gpu_wait"] = self.gpu_wait()
        self.check(scenario, "gpu_wait: released", wait["released"], wait["msg"])
        after = self.used_mib()
        scenario["memory"] = {"before_kill_mib": before, "after_wait_mib": after, "freed_mib": before - after}

    def scenario_nested_pidns(self, scenario):
        nbytes = self.args.tree_gib << 30
        baseline = self.used_mib()
        launcher = self.workloads.start("nested", nested=True, nbytes=nbytes)
        try:
            infos = self.ready(["nested"], launcher, 120)
        except WorkloadError:
            refusal = log_tail(os.path.join(self.workloads.run_dir, "nested.log")).strip()
            if launcher.poll() is not None and refusal.startswith("unshare:"):
                raise Skip("cannot create a nested PID namespace here: %s" % refusal) from None
            raise
        info = infos["nested"]
        holder = self.holder_records(infos, self.facts())["nested"]
        scenario["holders"] = {"nested": holder}
        listed = self.gpu.processes()
        host = info["host_pid"]
        scenario["nspid"] = procs.nspids(host)
        scenario["driver_pid"] = "host" if host in listed else ("namespace" if info["pid"] in listed else "none")
        self.check(
            scenario,
            "the holder runs in a nested PID namespace",
            len(scenario["nspid"]) >= 2 and info["pid"] != host,
            scenario["nspid"],
        )
        self.check(
            scenario, "gpu_facts finds the holder under its host PID", holder["found_by_facts"], holder["seen_in"]
        )
        # What the driver lists to a caller inside the namespace (535.113.01+: the namespace's numbers, gpu_rmapi.c
        # _gpuConvertPid -> os_find_ns_pid -> pid_vnr; older drivers: the host's).
        inside = scenario["lists_from_namespace"] = self.lists_seen_from(host)
        scenario["driver_pid_in_namespace"] = (
            "error"
            if "error" in inside
            else "namespace"
            if str(info["pid"]) in inside["pids"]
            else "host"
            if str(host) in inside["pids"]
            else "none"
        )
        before = self.used_mib()
        play = scenario["playbook"] = self.reset_gpus([host])
        self.check(
            scenario,
            "playbooks/reset_gpus.yml succeeds and changes something",
            play["rc"] == 0 and play["recap"] is not None and play["recap"]["changed"] >= 1,
            play["recap"],
        )
        self.check(scenario, "the nested holder is gone", not self.workloads.alive("nested"))
        after = self.settle(10)
        scenario["memory"] = {
            "baseline_mib": baseline,
            "before_kill_mib": before,
            "after_mib": after,
            "freed_mib": before - after,
        }
        self.check(
            scenario, "memory back at its level before the holder", after <= baseline + self.args.tolerance_mib, after
        )

    def lists_seen_from(self, host_pid):
        """The compute list of the GPU under test as NVML answers a process in `host_pid`'s PID and mount namespaces:
        {"pids": {"<pid>": MiB}} or {"error": text} (recorded, never a failed check: it is an observation)."""
        code = (
            "import json, pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(%d); "
            "print(json.dumps({str(p.pid): (p.usedGpuMemory or 0) >> 20 for p in n.nvmlDeviceGetComputeRunningProcesses(h)}))"
            % self.index
        )
        try:
            done = subprocess.run(
                ["nsenter", "--target", str(host_pid), "--pid", "--mount", "--", sys.executable, "-c", code],
                capture_output=True,
                text=True,
                timeout=self.deadline.cap(30),
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"error": str(exc)}
        if done.returncode != 0:
            return {"error": (done.stderr or done.stdout).strip()[-500:]}
        try:
            return {"pids": json.loads(done.stdout.strip().splitlines()[-1])}
        except (ValueError, IndexError):
            return {"error": done.stdout[-500:]}

    def scenario_release_latency(self, scenario):
        scenario["sizes"] = {}
        for gib in self.args.sizes_gib:
            entry = scenario["sizes"][str(gib)] = {"gib": gib}
            free = self.gpu.memory()["free_mib"]
            if self.deadline.remaining() < 30:
                entry.update(status="skipped", reason="not enough time left")
                continue
            if free < gib * 1024 + 2048:
                entry.update(status="skipped", reason="does not fit: %d MiB free" % free)
                continue
            entry.update(self.timed_release("latency-%dgib" % gib, nbytes=gib << 30))
            self.check(scenario, "%d GiB released after SIGKILL" % gib, entry["status"] == "ok", entry["seconds"])
            self.settle()

    def timed_release(self, name, timeout=180, **options):
        """Start holder `name` (workload options), SIGKILL it once ready and time its exit, its leaving the driver's
        list and the used memory's return to the level before it (polled every 10 ms): {"status" ("ok", "failed"
        on the timeout), "allocated_mib", "listed_mib", "lists", "ready_s", "seconds", "polls", "timed_out"}."""
        baseline = self.gpu.used_bytes()
        started = time.monotonic()
        launcher = self.workloads.start(name, **options)
        infos = self.ready([name], launcher, timeout)
        ready_s = round(time.monotonic() - started, 2)
        pid = infos[name]["host_pid"]
        loaded = self.gpu.used_bytes()
        listed = self.gpu.processes().get(pid) or {}
        timing = time_events(
            lambda: self.workloads.kill(name),
            {
                "exited": lambda: not self.workloads.alive(name),
                "unlisted": lambda: pid not in self.gpu.processes(),
                "released": lambda: self.gpu.used_bytes() <= baseline + self.args.tolerance_mib * MIB,
            },
            timeout=self.deadline.cap(90),
            interval=0.01,
        )
        return dict(
            status="failed" if timing["timed_out"] else "ok",
            allocated_mib=(loaded - baseline) // MIB,
            listed_mib=listed.get("used_mib"),
            lists=listed.get("lists", []),
            ready_s=ready_s,
            **timing,
        )

    # ---- the run -------------------------------------------------------------------------------

    def run_scenario(self, name, min_seconds):
        scenario = self.result["scenarios"][name] = {"status": None, "checks": []}
        started = time.monotonic()
        try:
            if self.backend == "sim" and name in SIM_CANNOT:
                raise Skip("simulated node: %s" % SIM_CANNOT[name])
            if self.deadline.remaining() < min_seconds:
                raise Skip("not enough time left (%.0f s, needs %d s)" % (self.deadline.remaining(), min_seconds))
            getattr(self, "scenario_" + name)(scenario)
            scenario["status"] = "ok" if all(check["ok"] for check in scenario["checks"]) else "failed"
        except Skip as skip:
            scenario.update(status="skipped", reason=str(skip))
        except (CheckError, WorkloadError, OSError, subprocess.SubprocessError, self.nvml.NVMLError) as error:
            scenario.update(status="error", reason="%s: %s" % (type(error).__name__, error))
        finally:
            scenario["ended_processes"] = self.end_scenario_processes()
            scenario["memory_after_mib"] = self.settle()
            scenario["elapsed_s"] = round(time.monotonic() - started, 2)
        failed = [check["name"] for check in scenario["checks"] if not check["ok"]]
        why = "" if scenario["status"] == "ok" else " (%s)" % (scenario.get("reason") or "; ".join(failed))
        self.log("%s: %s%s" % (name, scenario["status"], why))

    def execute(self):
        """Run every scenario, end every workload, conclude; returns the exit status."""
        result = self.result
        self.log(
            "GPU %d %s, driver %s, backend %s, marker %s"
            % (self.index, result["gpu"]["name"], result["driver"]["driver_version"], self.backend, self.marker)
        )
        previous = {sig: signal.signal(sig, _raise_exit) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            for name, min_seconds in SCENARIOS:
                if name in self.args.only:
                    self.run_scenario(name, min_seconds)
        except (KeyboardInterrupt, SystemExit) as stop:
            result["interrupted"] = "%s %s" % (type(stop).__name__, stop)
        finally:
            result["leaked"] = self.workloads.stop_all()
            self.gpu.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        result["duration_s"] = round(time.monotonic() - self.started, 1)
        result["observations"] = report.observations(result)
        result["comparisons"] = report.compare(result["observations"])
        result["differences"] = [row for row in result["comparisons"] if not row["same"]]
        result["suggested_sim_knobs"] = report.suggested_sim_knobs(result)
        broken = [name for name, s in result["scenarios"].items() if s["status"] not in ("ok", "skipped")]
        result["status"] = "failed" if broken or result["leaked"] or result.get("interrupted") else "ok"
        os.makedirs(self.args.out, exist_ok=True)
        path = os.path.join(self.args.out, "result.json")
        with open(path, "w") as out:
            json.dump(result, out, indent=1, sort_keys=True)
        if result["status"] == "ok":
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            self.log("kept the workloads' logs and Ansible's plays for inspection in %s" % self.workdir)
        markdown = report.render_markdown([result])
        with open(os.path.join(self.args.out, "result.md"), "w") as out:
            out.write(markdown)
        print(markdown)
        self.log(
            "%s: %s (%d difference(s) from the simulator); failed scenarios: %s; leaked: %s"
            % (path, result["status"], len(result["differences"]), broken or "none", result["leaked"] or "none")
        )
        return EXIT_OK if result["status"] == "ok" else EXIT_FAILED


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.render_md:
        results = []
        for path in args.render_md:
            with open(path) as result_file:
                results.append(json.load(result_file))
        sys.stdout.write(report.render_markdown(results))
        return EXIT_OK
    missing = missing_packages()
    if args.missing_packages:
        print(" ".join(missing))
        return EXIT_OK
    usable, reason = driver.probe()
    if not usable:
        print("skipped: no NVIDIA GPU (%s)" % reason)
        return EXIT_SKIPPED
    if args.probe:
        print("ok: %s" % reason)
        return EXIT_OK
    required = [package for package in missing if package in REQUIRED.values()]
    if required:
        print(
            "error: missing Python packages: %s (run tests/gpu/run.sh, which installs them from tests/gpu/wheels)"
            % " ".join(required)
        )
        return EXIT_MISSING
    backend, why_not = choose_backend(args.backend)
    if backend is None:
        print("skipped: cannot allocate GPU memory here: %s" % why_not)
        return EXIT_SKIPPED
    import pynvml

    return CheckRun(args, backend, pynvml).execute()


if __name__ == "__main__":
    sys.exit(main())
