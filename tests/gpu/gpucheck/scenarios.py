# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The check's scenarios of what a real driver shows beside the process that holds a GPU (tests/gpu/README.md):
a dead creator among bystanders, its PID reused, MPS, CUDA IPC, a release with pinned host memory.

DriverScenarios is a part of check.py's CheckRun: its methods use the run's readings (`reading`, `facts`, `ready`,
`record_process`, `check`, `used_mib`, `settle`, `timed_release`), its GPU (`gpu`, `index`), its workloads, its
Ansible and its deadline. What a result says is decided by pure functions (gpucheck/attribution.py, outcomes.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

from gpucheck import attribution, outcomes, procs
from gpucheck.timing import poll_until
from gpucheck.workloads import PidUnavailable, log_tail

MIB = 1 << 20
# gpu_facts' max_used_mib in the attribution readings: its default, the tolerance of docs/attribution.md rule 4.
ATTRIBUTION_TOLERANCE_MIB = 256
# GPU memory of the holder in pinned_release, as in the probe that measured it (tests/fixtures/hardware/README.md).
PINNED_GPU_GIB = 8
# Host memory left free beside the pinned allocation.
PINNED_HEADROOM_GIB = 8
# Where NVIDIA's programs are when PATH does not name them (the H200 host had them in /usr/local/nvidia/bin).
PROGRAM_DIRS = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin")
KILL_MODULE, WAIT_MODULE = "gpuops.nvidia.gpu_kill", "gpuops.nvidia.gpu_wait"


class CheckError(RuntimeError):
    """A step of a scenario could not run (an Ansible run without result, a workload that did not start)."""


class Skip(Exception):
    """The scenario cannot run on this host (the reason is recorded)."""


def find_program(name, path=None, dirs=PROGRAM_DIRS):
    """The executable `name` on PATH, else in `dirs`; None where there is none."""
    found = shutil.which(name, path=path)
    if found:
        return found
    return next((os.path.join(d, name) for d in dirs if os.access(os.path.join(d, name), os.X_OK)), None)


def check_gpus_line(output):
    """The line check_gpus prints for localhost ("check_gpus localhost: ..."), or None."""
    match = re.search(r"check_gpus localhost: [^\"\n]*", output)
    return match.group(0) if match else None


class DriverScenarios:
    """dead_creator, reused_pid, mps, ipc and pinned_release (methods scenario_NAME), and what they share."""

    # ---- the playbooks, restricted to this run's processes ----------------------------------------------------------

    def check_gpus(self):
        """playbooks/check_gpus.yml on the GPU under test: {"rc", "line", "named" (outcomes.named_by_check),
        "elapsed_s"}."""
        play = self.ansible.playbook(
            os.path.join(self.ansible.repo, "playbooks", "check_gpus.yml"),
            {"check_gpus_hosts": "localhost", "check_gpus_gpus": [self.index], "check_gpus_wait": 2},
            timeout=self.deadline.cap(120),
        )
        if WAIT_MODULE not in play["results"]:
            raise CheckError("check_gpus ran no gpu_wait: %s" % play["output"][-1500:])
        return {
            "rc": play["rc"],
            "line": check_gpus_line(play["output"]),
            "named": outcomes.named_by_check(play["results"][WAIT_MODULE], self.index),
            "elapsed_s": play["elapsed_s"],
        }

    def reset_gpus(self, pids, check=False):
        """playbooks/reset_gpus.yml (--check with `check`) on the GPU under test, selecting `pids` and this run's
        marker: {"rc", "recap", "signalled" (PIDs: would_signal in check mode), "left_alone", "elapsed_s"}."""
        play = self.ansible.playbook(
            os.path.join(self.ansible.repo, "playbooks", "reset_gpus.yml"),
            {
                "reset_gpus_hosts": "localhost",
                "reset_gpus_gpus": [self.index],
                "reset_gpus_pids": sorted(pids),
                "reset_gpus_match": re.escape(self.marker),
                "reset_gpus_grace_period": 5,
                "reset_gpus_timeout": 60,
            },
            timeout=self.deadline.cap(240),
            check=check,
        )
        kill = play["results"].get(KILL_MODULE)
        if kill is None:
            raise CheckError("reset_gpus ran no gpu_kill: %s" % play["output"][-1500:])
        return {
            "rc": play["rc"],
            "recap": play["recap"],
            "signalled": outcomes.signalled_by_reset(kill),
            "left_alone": sorted({item["pid"] for item in kill.get("left_alone") or []}),
            "elapsed_s": play["elapsed_s"],
        }

    def check_and_reset(self, scenario, ours, targets, baseline):
        """check_gpus, reset_gpus --check and reset_gpus beside our processes `ours` ({case: workload name}), all of
        them selected (reset_gpus_pids, the marker): only the attribution can spare the others. check_gpus must name
        exactly `targets` of ours as holders and none as left alone or suspect; both resets must signal exactly
        `targets`; afterwards the targets are gone, the others alive, the memory back at `baseline` MiB."""
        pids = {case: self.workloads.pid(name) for case, name in ours.items()}
        check = scenario["check_gpus"] = self.check_gpus()
        named_pids = check["named"]
        check["named"] = {key: outcomes.names_of(found, pids) for key, found in named_pids.items()}
        ok, _found = outcomes.exactly(named_pids["holders"], targets, pids)
        self.check(
            scenario,
            "check_gpus says the GPU is not free and names exactly %s of ours as holders" % targets,
            ok and check["rc"] != 0,
            check["named"],
        )
        spared = outcomes.exactly(named_pids["left_alone"] + named_pids["suspects"], [], pids)[1]
        self.check(scenario, "check_gpus leaves alone or suspects none of ours", not spared, spared)
        for mode in ("check", "reset"):
            run = scenario["reset_gpus_" + mode] = self.reset_gpus(pids.values(), check=mode == "check")
            ok, found = outcomes.exactly(run["signalled"], targets, pids)
            run["signalled"] = outcomes.names_of(run["signalled"], pids)
            run["left_alone"] = outcomes.names_of(run["left_alone"], pids)
            flag = " --check" if mode == "check" else ""
            self.check(scenario, "reset_gpus%s signals exactly %s" % (flag, targets), ok, found)
            self.check(scenario, "reset_gpus%s succeeds" % flag, run["rc"] == 0, run["recap"])
        alive = {case: self.workloads.alive(name) for case, name in ours.items()}
        scenario["alive_after_reset"] = alive
        self.check(
            scenario,
            "after the reset %s are gone and the others of ours live" % targets,
            all(alive[case] == (case not in targets) for case in alive),
            alive,
        )
        after = self.settle(15)
        scenario["memory_mib"] = {"baseline": baseline, "after_reset": after}
        self.check(
            scenario, "memory back at its level before the scenario", after <= baseline + self.args.tolerance_mib, after
        )

    # ---- a dead creator among bystanders, its number reused ---------------------------------------------------------

    def start_nvidia_smi(self, name, scenario, case):
        """`nvidia-smi -l 1` as one of ours, pinned as `name`: with `-f` to a log file named after the marker, so that
        the reset's match selects it like our other processes; where nvidia-smi refuses that, without (then the match
        alone leaves it out: recorded in scenario["nvidia_smi"]). Returns its PID once it holds /dev/nvidiactl, or
        None with the reason in scenario["not_run"][case] (no nvidia-smi, or it exits at once)."""
        program = find_program("nvidia-smi")
        if program is None:
            scenario.setdefault("not_run", {})[case] = "nvidia-smi not found on PATH or in %s" % ", ".join(PROGRAM_DIRS)
            return None
        log = os.path.join(self.workloads.run_dir, "nvidia-smi-%s.log" % self.marker)
        tried = scenario["nvidia_smi"] = []
        for argv in ([program, "-l", "1", "-f", log], [program, "-l", "1"]):
            launcher = self.workloads.start_program(name, argv)
            opened = poll_until(
                lambda launcher=launcher: (
                    "/dev/nvidiactl" in procs.device_fd_counts(launcher.pid) or launcher.poll() is not None
                ),
                self.deadline.cap(20),
                interval=0.05,
            )
            running = bool(opened) and launcher.poll() is None
            tried.append({"argv": argv, "running": running, "marker_in_cmdline": self.marker in " ".join(argv)})
            if running:
                self.record_process(name, launcher.pid, "nvidia_smi")
                return launcher.pid
            self.workloads.kill(name)
            tried[-1]["log"] = log_tail(self.workloads.log_path(name), 500)
        scenario.setdefault("not_run", {})[case] = "nvidia-smi -l 1 did not keep running: %s" % tried[-1]["log"]
        return None

    def start_dead_creator(self, name, scenario):
        """A holder of --tree-gib GiB that forks a child inheriting its handles; the holder is SIGKILLed (and reaped).
        It is no session or group leader (else its number stays taken while its child lives: Workloads.start), as
        the probe's trainer was not. Returns (creator's PID, child's PID); records what the driver lists then in
        scenario["dead_creator"]."""
        launcher = self.workloads.start(name, nbytes=self.args.tree_gib << 30, fork_child=True, new_session=False)
        infos = self.ready([name, name + ".child"], launcher, 120)
        creator, child = infos[name]["host_pid"], infos[name + ".child"]["host_pid"]
        self.gpu.processes()  # read while the creator lives (a simulated driver notes the creator's identity then)
        self.workloads.kill(name)
        gone = poll_until(lambda: not self.workloads.alive(name), self.deadline.cap(10))
        self.check(scenario, "the creator is gone after SIGKILL", gone)
        listed = self.gpu.processes().get(creator) or {}
        scenario["dead_creator"] = {
            "pid": creator,
            "child_pid": child,
            "listed_after_exit": bool(listed),
            "lists": listed.get("lists", []),
            "listed_mib": listed.get("used_mib"),
        }
        return creator, child

    def scenario_dead_creator(self, scenario):
        """A forked child holds the context of its SIGKILLed creator beside an NVML-only client, a process that only
        initialized CUDA (torch.cuda.is_available(), cuInit without PyTorch) and nvidia-smi -l 1: gpu_facts must make
        the child the only holder, check_gpus name it alone, reset_gpus signal it alone (every one of them selected)."""
        cases = attribution.SCENARIO_CASES["dead_creator"]
        baseline = self.used_mib()
        ours = {"nvml_only": "dead.nvml", "torch_available": "dead.available"}
        launchers = [
            (ours["nvml_only"], self.workloads.start(ours["nvml_only"], role="nvml")),
            (ours["torch_available"], self.workloads.start(ours["torch_available"], role="available")),
        ]
        for name, launcher in launchers:
            info = self.ready([name], launcher, 120)[name]
            scenario.setdefault("init_details", {})[name] = info["backend_details"]
        if self.start_nvidia_smi("dead.smi", scenario, "nvidia_smi") is not None:
            ours["nvidia_smi"] = "dead.smi"
        self.start_dead_creator("dead.creator", scenario)
        ours["inherited_child"] = "dead.creator.child"
        self.check(
            scenario,
            "the driver lists the dead creator while its child holds the context",
            scenario["dead_creator"]["listed_after_exit"],
            scenario["dead_creator"],
        )
        scenario["pids"] = {case: self.workloads.pid(name) for case, name in ours.items()}
        self.reading(scenario, "after_exit", scenario["pids"], cases)
        self.check_and_reset(scenario, ours, ["inherited_child"], baseline)
        scenario["table"] = attribution.table_rows(scenario, self.result["gpu"]["all_minors"], cases)

    def scenario_reused_pid(self, scenario):
        """The dead creator's PID number given to a new NVML-only client (ns_last_pid, as CRIU restores PIDs): the
        driver lists the number with the creator's memory. gpu_facts must not make the reuser a holder and must
        charge the child the memory; reset_gpus must end the child alone and the memory come back."""
        cases = attribution.SCENARIO_CASES["reused_pid"]
        baseline = self.used_mib()
        creator, _child = self.start_dead_creator("reuse.creator", scenario)
        try:
            launcher = self.workloads.start_at_pid("reuse.reuser", creator, role="nvml")
        except PidUnavailable as error:
            raise Skip(
                "the dead creator's PID %d could not be given to another process: %s" % (creator, error)
            ) from None
        self.ready(["reuse.reuser"], launcher, 60)
        listed = self.gpu.processes().get(creator) or {}
        scenario["reuse"] = {"pid": creator, "listed": bool(listed), "listed_mib": listed.get("used_mib")}
        self.check(scenario, "the driver lists the reused number with the creator's memory", listed, listed)
        ours = {"inherited_child": "reuse.creator.child", "reuser": "reuse.reuser"}
        scenario["pids"] = {case: self.workloads.pid(name) for case, name in ours.items()}
        facts = self.reading(scenario, "reused", scenario["pids"], cases)
        child = attribution.facts_view(scenario["pids"]["inherited_child"], facts)
        holder = next((h for h in facts["holders"] if h["pid"] == scenario["pids"]["inherited_child"]), {})
        charged = (holder.get("memory_mib") or {}).get(str(self.index))
        scenario["child_memory_mib"] = charged
        self.check(
            scenario,
            "gpu_facts charges the child the memory listed under the reused number",
            child["role"] == "holder" and charged == listed.get("used_mib"),
            [charged, listed.get("used_mib")],
        )
        self.check_and_reset(scenario, ours, ["inherited_child"], baseline)
        scenario["table"] = attribution.table_rows(scenario, self.result["gpu"]["all_minors"], cases)

    # ---- MPS with a private control daemon ----------------------------------------------------------------------

    def scenario_mps(self, scenario):
        """An MPS control daemon of our own (nvidia-cuda-mps-control -f, its own pipe and log directories under the
        run's work directory: a system daemon is never used or touched), its server and one client holding
        --tree-gib GiB. The driver lists the client in the compute and the MPS list: gpu_facts must count its memory
        once; reset_gpus (client, server and daemon selected) must end the client alone; the daemon is told to quit."""
        control = find_program("nvidia-cuda-mps-control")
        if control is None:
            raise Skip("nvidia-cuda-mps-control not found on PATH or in %s" % ", ".join(PROGRAM_DIRS))
        base = os.path.join(self.workdir, "mps")
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": os.path.join(base, "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": os.path.join(base, "log"),
        }
        for directory in env.values():
            os.makedirs(directory)
        scenario["directories"] = env
        baseline = self.used_mib()
        self.workloads.start_program("mps.control", [control, "-f"], env=env)
        try:
            self.mps_serving(scenario, env, baseline)
        finally:
            scenario["quit"] = self.mps_quit(control, env)
            scenario["logs"] = {
                name: log_tail(os.path.join(env["CUDA_MPS_LOG_DIRECTORY"], name), 800)
                for name in ("control.log", "server.log")
            }
        self.check(scenario, "the MPS daemon and server quit when told to", scenario["quit"]["quit"], scenario["quit"])

    def mps_serving(self, scenario, env, baseline):
        """The MPS scenario while the daemon runs (see scenario_mps)."""
        control_pid = self.workloads.pid("mps.control")
        socket = os.path.join(env["CUDA_MPS_PIPE_DIRECTORY"], "control")
        scenario["control_socket"] = bool(poll_until(lambda: os.path.exists(socket), self.deadline.cap(15)))
        if not self.workloads.alive("mps.control"):
            raise CheckError("nvidia-cuda-mps-control -f exited: %s" % log_tail(self.workloads.log_path("mps.control")))
        self.record_process("mps.control", control_pid, "mps_control")
        launcher = self.workloads.start("mps.client", nbytes=self.args.tree_gib << 30, env=env)
        client_pid = self.ready(["mps.client"], launcher, 60)["mps.client"]["host_pid"]
        server_pid = poll_until(lambda: mps_server(control_pid, env), self.deadline.cap(10))
        if server_pid is None:
            raise CheckError("no nvidia-cuda-mps-server under the control daemon (PID %d)" % control_pid)
        self.workloads.pin("mps.server", server_pid)
        self.record_process("mps.server", server_pid, "mps_server")
        listed = self.gpu.processes()
        client = scenario["client_listed"] = listed.get(client_pid) or {"lists": [], "used_mib": None}
        self.check(scenario, "the client is an MPS client (in the driver's MPS list)", "mps" in client["lists"], client)
        pids = scenario["pids"] = {"mps_client": client_pid, "mps_server": server_pid, "mps_control": control_pid}
        facts = self.reading(scenario, "serving", pids, attribution.SCENARIO_CASES["mps"])
        holder = next((h for h in facts["holders"] if h["pid"] == client_pid), {})
        counted = (holder.get("memory_mib") or {}).get(str(self.index))
        summary = scenario["gpu_facts"]["serving"]
        self.check(scenario, "gpu_facts counts the client's memory once", counted == client["used_mib"], counted)
        self.check(
            scenario,
            "gpu_facts explains no more memory than the GPU uses",
            (summary["explained_mib"] or 0) <= summary["memory_used_mib"] + self.args.tolerance_mib,
            summary,
        )
        server_mib = (listed.get(server_pid) or {}).get("used_mib") or 0
        self.mps_reset(scenario, pids, baseline + server_mib)

    def mps_reset(self, scenario, pids, level_mib):
        """reset_gpus with client, server and daemon selected: the client alone ended, memory back at `level_mib`."""
        run = scenario["reset_gpus"] = self.reset_gpus(pids.values())
        ok, found = outcomes.exactly(run["signalled"], ["mps_client"], pids)
        run["signalled"], run["left_alone"] = found, outcomes.names_of(run["left_alone"], pids)
        self.check(scenario, "reset_gpus signals exactly the MPS client", ok, found)
        self.check(scenario, "reset_gpus succeeds", run["rc"] == 0, run["recap"])
        alive = {name: self.workloads.alive(name) for name in ("mps.client", "mps.server", "mps.control")}
        scenario["alive_after_reset"] = alive
        self.check(
            scenario,
            "the client is gone, the MPS server and daemon live",
            alive == {"mps.client": False, "mps.server": True, "mps.control": True},
            alive,
        )
        back = poll_until(lambda: self.used_mib() <= level_mib + self.args.tolerance_mib, self.deadline.cap(15))
        scenario["memory_mib"] = {"expected_at_most": level_mib + self.args.tolerance_mib, "after": self.used_mib()}
        self.check(
            scenario, "the client's memory is back (the server's stays until quit)", back, scenario["memory_mib"]
        )

    def mps_quit(self, control, env):
        """Tell our MPS daemon to quit (`quit` on nvidia-cuda-mps-control's standard input, with our pipe directory)
        and wait for it and its server: {"rc", "output", "quit" (both gone), "seconds"}."""
        started = time.monotonic()
        try:
            done = subprocess.run(
                [control],
                input="quit\n",
                env=self.workloads.environment(env),
                capture_output=True,
                text=True,
                timeout=max(1.0, self.deadline.cap(15)),
                check=False,
            )
            rc, output = done.returncode, (done.stdout + done.stderr)[-500:]
        except (OSError, subprocess.SubprocessError) as error:
            rc, output = None, str(error)
        names = [name for name in ("mps.control", "mps.server") if name in self.workloads.pinned]
        gone = poll_until(
            lambda: not any(self.workloads.alive(name) for name in names), max(1.0, self.deadline.cap(20))
        )
        return {"rc": rc, "output": output, "quit": bool(gone), "seconds": round(time.monotonic() - started, 2)}

    # ---- CUDA IPC -----------------------------------------------------------------------------------------------

    def scenario_ipc(self, scenario):
        """An exporter (cuMemAlloc of --tree-gib GiB, cuIpcGetMemHandle) and an importer (cuIpcOpenMemHandle), both
        through libcuda with ctypes; the exporter is SIGKILLed. The importer keeps the imported memory: gpu_facts
        must make it the holder, reset_gpus must end it and the memory come back."""
        cases = attribution.SCENARIO_CASES["ipc"]
        baseline = self.used_mib()
        launcher = self.workloads.start("ipc.exporter", role="ipc_export", nbytes=self.args.tree_gib << 30)
        handle = self.ready(["ipc.exporter"], launcher, 60)["ipc.exporter"]["ipc_handle"]
        launcher = self.workloads.start("ipc.importer", role="ipc_import", ipc_handle=handle)
        self.ready(["ipc.importer"], launcher, 60)
        pids = scenario["pids"] = {case: self.workloads.pid("ipc." + case) for case in ("exporter", "importer")}
        self.reading(scenario, "both_alive", pids, cases)
        scenario["listed_both_alive"] = {case: self.gpu.processes().get(pid) for case, pid in pids.items()}
        self.workloads.kill("ipc.exporter")
        gone = poll_until(lambda: not self.workloads.alive("ipc.exporter"), self.deadline.cap(10))
        self.check(scenario, "the exporter is gone after SIGKILL", gone)
        released = poll_until(lambda: self.used_mib() <= baseline + self.args.tolerance_mib, self.deadline.cap(3))
        listed = self.gpu.processes()
        scenario["after_exporter_exit"] = {
            "memory_kept": not released,
            "used_mib": self.used_mib(),
            "importer": listed.get(pids["importer"]),
            "exporter_listed": pids["exporter"] in listed,
        }
        self.reading(scenario, "exporter_gone", {"importer": pids["importer"]}, cases)
        run = scenario["reset_gpus"] = self.reset_gpus([pids["importer"]])
        ok, found = outcomes.exactly(run["signalled"], ["importer"], {"importer": pids["importer"]})
        run["signalled"] = found
        self.check(scenario, "reset_gpus signals exactly the importer", ok, found)
        self.check(scenario, "reset_gpus succeeds", run["rc"] == 0, run["recap"])
        self.check(scenario, "the importer is gone", not self.workloads.alive("ipc.importer"))
        after = self.settle(15)
        scenario["memory_mib"] = {"baseline": baseline, "after_reset": after}
        self.check(
            scenario, "memory back at its level before the exporter", after <= baseline + self.args.tolerance_mib
        )
        scenario["table"] = attribution.table_rows(scenario, self.result["gpu"]["all_minors"], cases)

    # ---- release with pinned host memory ------------------------------------------------------------------------

    def scenario_pinned_release(self, scenario):
        """A holder of 8 GiB of GPU memory and --pinned-gib GiB of pinned host memory (torch pin_memory, else
        cuMemHostAlloc) is SIGKILLed: seconds until its exit, its leaving the driver's list, the memory's return."""
        pinned, available = self.args.pinned_gib, procs.mem_available_bytes()
        scenario.update(pinned_gib=pinned, gpu_gib=PINNED_GPU_GIB, host_available_mib=(available or 0) // MIB)
        if available is not None and available < (pinned + PINNED_HEADROOM_GIB) << 30:
            raise Skip(
                "%d GiB pinned needs %d GiB of host memory available, %d MiB are"
                % (pinned, pinned + PINNED_HEADROOM_GIB, available >> 20)
            )
        free = self.gpu.memory()["free_mib"]
        if free < PINNED_GPU_GIB * 1024 + 2048:
            raise Skip("%d GiB does not fit on the GPU: %d MiB free" % (PINNED_GPU_GIB, free))
        timing = self.timed_release("pinned", timeout=240, nbytes=PINNED_GPU_GIB << 30, pinned_bytes=pinned << 30)
        scenario.update(timing)
        self.check(
            scenario,
            "GPU memory released after SIGKILL with %d GiB of pinned host memory" % pinned,
            timing["status"] == "ok",
            timing["seconds"],
        )


def mps_server(control_pid, env, proc="/proc"):
    """The PID of our MPS server: a descendant of our control daemon whose argv[0] is nvidia-cuda-mps-server, else
    such a process whose environment names our pipe directory; None while there is none."""
    servers = [pid for pid in procs.all_pids(proc) if procs.argv0(pid, proc) == "nvidia-cuda-mps-server"]
    ours = set(procs.descendants(control_pid, proc))
    found = [pid for pid in servers if pid in ours]
    if not found:
        needle = ("CUDA_MPS_PIPE_DIRECTORY=%s" % env["CUDA_MPS_PIPE_DIRECTORY"]).encode()
        found = [pid for pid in servers if needle in procs.environ(pid, proc)]
    return found[0] if found else None
