# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run of gpu_reset (docs/recovery.md): look, decide (_reset_plan), stop the GPU daemons through their units,
turn persistence mode off, `nvidia-smi --gpu-reset`, restore, verify. Every command has a timeout; a failure before
the reset undoes what was done. Python 3.9.
"""

from __future__ import annotations

import os
import shutil
import socket
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus, _kernel_log, _options, _recovery
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _reset_plan as plan
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _select, _stop_owners

Result = Dict[str, Any]


def _run(argv: List[str], timeout: float) -> Tuple[Optional[int], str]:
    """(exit status, output) of `argv`; None as the status when it did not end within `timeout` seconds (the one
    bounded run of the collection, _stop_owners.run_bounded: AnsibleModule.run_command has no timeout)."""
    code, out, err = _stop_owners.run_bounded(argv, timeout)
    return code, (out + err).strip() if code is not None else ""


def _look(params: Mapping[str, Any], recovery: bool) -> Dict[str, Any]:
    """A full snapshot with owners (and the driver's advice); the NVML worker is gone when it returns, so that it
    holds no device file during the reset."""
    inspector = _gpus.Inspector(driver_timeout=params["driver_timeout"])
    try:
        return dict(inspector.snapshot(tolerance_mib=params["max_used_mib"], owners=True, recovery=recovery))
    finally:
        inspector.close()


def _where(params: Mapping[str, Any], proc: str = "/proc") -> plan.Where:
    """Root, the container or pod this process runs in by its cgroup (_owners; a cgroup namespace that hides it
    leaves the PID namespace as the guard), the PID namespace, nvidia-smi."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._owners import owner_of

    owner = owner_of(os.getpid(), proc)
    container = None
    if owner.get("pod_uid"):
        container = "pod %s" % owner["pod_uid"]
    elif owner.get("container_id"):
        container = "container %s" % str(owner["container_id"])[:12]
    return {
        "root": os.geteuid() == 0,
        "container": container,
        "initial_pid_namespace": _gpus.initial_pid_namespace(proc),
        "own_pid_namespace": bool(params["own_pid_namespace"]),
        "nvidia_smi": shutil.which("nvidia-smi"),
    }


def _daemons(view: Mapping[str, Any], proc: str = "/proc") -> Dict[int, Tuple[Optional[str], Optional[str]]]:
    """{PID: (the GPU daemon it runs, by its executable, or None; its systemd unit or None)} of the device users."""
    found: Dict[int, Tuple[Optional[str], Optional[str]]] = {}
    for user in view.get("device_users", []):
        name = _select.daemon_name(user["pid"], user.get("start_ticks"), proc)
        unit = (user.get("owner") or {}).get("systemd_unit")
        found[user["pid"]] = (name if name in plan.RESET_DAEMONS else None, unit)
    return found


def decide(params: Mapping[str, Any]) -> Tuple[Result, Optional[Dict[str, Any]]]:
    """Look and decide: the result so far, and the plan's parts where there is something to reset."""
    view = _look(params, recovery=True)
    result: Result = {"changed": False, "failed": False, "gpus": [], "candidates": {}, "checks": [], "steps": []}
    try:
        selected = _select.select_gpus(params["gpus"], view)  # type: ignore[arg-type]  # a view, as a Snapshot
    except _select.SelectionError as exc:
        return dict(result, failed=True, msg="gpu_reset: nothing was changed: %s" % exc), None
    candidates = plan.candidates(view, selected)
    result["candidates"] = {str(index): why for index, why in candidates.items()}
    if not candidates:
        return dict(result, msg="no selected GPU needs a reset: each one's memory is explained and the driver "
                    "advises nothing"), None  # fmt: skip
    targets = plan.with_peers(view, candidates)
    daemons = _daemons(view)
    where = _where(params)
    units = plan.units_to_stop(view, targets, daemons)
    result["gpus"] = targets
    result["checks"] = plan.host_checks(where) + plan.gpu_checks(view, targets, daemons)
    result["steps"] = plan.steps(view, targets, units, where["nvidia_smi"] or "nvidia-smi", "systemctl")
    return result, {"view": view, "targets": targets, "units": units}


def argument_spec() -> Dict[str, Any]:
    """The gpu_reset module's options (its DOCUMENTATION says what each means)."""
    return dict(
        gpus=dict(type="list", elements="raw"),
        **_options.spec(_options.GPU, "max_used_mib", "reset_timeout", "command_timeout", "driver_timeout"),
        own_pid_namespace=dict(type="bool", default=False),
    )


# Options that must be numbers at least 0, with the bounds of their table (_options.GPU, _options.bounds).
NUMBERS = ("max_used_mib", "reset_timeout", "command_timeout", "driver_timeout")


def run(params: Mapping[str, Any], check_mode: bool) -> Result:
    """The whole reset: decide, refuse or (not in check mode) do and verify. Returns the module's result."""
    result, parts = decide(params)
    if parts is None:
        return result
    refused = plan.refusal(result["checks"])
    if refused:
        return dict(result, failed=True, msg="gpu_reset refused, nothing was changed: %s" % refused,
                    next_step=_refusal_step(result["checks"]))  # fmt: skip
    if check_mode:
        return dict(result, changed=True, msg="would: %s" % "; ".join(step["what"] for step in result["steps"]))
    return _execute(params, result, parts)


def _refusal_step(checks: List[plan.Check]) -> str:
    names = [check["name"] for check in checks if not check["ok"]]
    if "advice" in names or "driver" in names:
        return "reboot the node (drain it first: docs/schedulers.md)"
    return "deal with what each refused precondition names, then run the reset again"


class _Runner:
    """Runs the steps: each command with its timeout; "recheck", a fresh look that nothing but the stopped daemons
    used the GPUs. Keeps a line per step and nvidia-smi's answer to the reset."""

    def __init__(self, params: Mapping[str, Any], targets: List[int]) -> None:
        self.params = params
        self.targets = targets
        self.log: List[str] = []
        self.reset_answer: Tuple[Optional[int], str] = (0, "")

    def __call__(self, step: plan.Step) -> Optional[str]:
        if step["step"] == "recheck":
            error = self._recheck()
            self.log.append("%s: %s" % (step["what"], error or "done"))
            return error
        timeout = self.params["reset_timeout"] if step["step"] == "reset" else self.params["command_timeout"]
        code, output = _run(step["command"], timeout)
        outcome = (
            "done" if code == 0 else "failed (exit %s)" % code if code is not None else "no answer in %s s" % timeout
        )
        self.log.append("%s: %s" % (step["what"], outcome))
        if step["step"] == "reset":
            self.reset_answer = (code, output)
        if code == 0:
            return None
        return output or ("no answer within %.0f s" % timeout if code is None else "exit %d" % code)

    def _recheck(self) -> Optional[str]:
        view = _look(self.params, recovery=False)
        users = [
            "PID %d %s" % (p["pid"], p.get("comm"))
            for p in view.get("holders", []) + view.get("device_users", [])
            if set(p.get("device_gpus") or ()) & set(self.targets)
        ]
        return "after the daemons stopped, %s still use(s) the GPUs" % ", ".join(users) if users else None


def _execute(params: Mapping[str, Any], result: Result, parts: Mapping[str, Any]) -> Result:
    """The steps (the daemons stopped, a look again, persistence off, the reset, the restore), then the verification."""
    targets, view = parts["targets"], parts["view"]
    before = {g["index"]: (g.get("recovery") or {}).get("persistence_mode") for g in view["gpus"]}
    recheck: plan.Step = {"step": "recheck", "what": "look again: nothing else uses the GPUs", "command": [],
                          "undo": None}  # fmt: skip
    stops = [step for step in result["steps"] if step["step"] == "stop"]
    ordered = stops + [recheck] + [step for step in result["steps"] if step["step"] != "stop"]
    runner = _Runner(params, targets)
    done, failed, undone = plan.run_steps(ordered, runner)
    reset_done = any(step["step"] == "reset" for step in done)
    result.update(
        changed=any(step["command"] for step in done),
        done=[step["what"] for step in done if step["command"]],
        log=runner.log,
        undone=[{"what": step["what"], "error": error} for step, error in undone],
    )
    if reset_done:
        try:
            _recovery.note_reset(_pci_keys(view, targets), _kernel_log.uptime_s() or 0.0)
        except OSError as exc:  # a read-only or full /run: the reset happened all the same, and is verified below
            runner.log.append("could not note the reset in %s: %s" % (_recovery.RESETS_FILE, exc))
    if failed:
        return _failed(params, result, failed, targets, runner.reset_answer)
    return _verify(params, result, targets, before, parts["units"])


def _pci_keys(view: Mapping[str, Any], targets: List[int]) -> List[str]:
    keys = [_kernel_log.pci_key(g.get("pci_bus_id")) for g in view["gpus"] if g["index"] in targets]
    return [key for key in keys if key]


def _failed(
    params: Mapping[str, Any],
    result: Result,
    failed: Tuple[plan.Step, str],
    targets: List[int],
    answer: Tuple[Optional[int], str],
) -> Result:
    step, why = failed
    restored = all(undo["error"] is None for undo in result["undone"])
    cause = " ".join(why.split())[:300]
    if step["step"] == "reset":
        cause, next_step = plan.failure_step(answer[0], answer[1], params["reset_timeout"], socket.gethostname())
    elif any(done.startswith("reset ") for done in result["done"]):
        next_step = "the GPUs were reset, but this step failed: run `%s` yourself" % " ".join(step["command"])
    else:
        next_step = "deal with it, then run the reset again"
    if not result["undone"]:
        said = "nothing to undo" if not result["done"] else "the reset was done, nothing undone"
    elif restored:
        said = "every step done before was undone (%s)" % "; ".join(u["what"] for u in result["undone"])
    else:
        said = "an undo failed: %s" % "; ".join(
            "%s: %s" % (u["what"], u["error"]) for u in result["undone"] if u["error"]
        )
    msg = "gpu_reset of GPU %s failed at %s: %s; %s; next: %s" % (
        ", ".join(str(i) for i in targets),
        step["what"],
        cause,
        said,
        next_step,
    )
    return dict(result, failed=True, msg=msg, next_step=next_step)


def _verify(
    params: Mapping[str, Any], result: Result, targets: List[int], before: Mapping[int, Any], units: Mapping[str, Any]
) -> Result:
    """After the reset: memory back at idle, no advice of a reset left, persistence mode and the units as before."""
    view = _look(params, recovery=True)
    problems = []
    for gpu in (g for g in view["gpus"] if g["index"] in targets):
        recovery = gpu.get("recovery") or {}
        if gpu.get("memory_unexplained") or gpu.get("error"):
            used = "memory not read" if gpu.get("memory_used_mib") is None else "%s MiB used" % gpu["memory_used_mib"]
            problems.append("GPU %d: %s%s" % (gpu["index"], used, ", %s" % gpu["error"] if gpu.get("error") else ""))
        if recovery.get("needs") == "reset":
            problems.append("GPU %d still needs a reset: %s" % (gpu["index"], "; ".join(recovery.get("why") or [])))
        if recovery.get("persistence_mode") != before.get(gpu["index"]):
            was, now = before.get(gpu["index"]), recovery.get("persistence_mode")
            problems.append("GPU %d: persistence mode %s, before %s" % (gpu["index"], now, was))
    for unit in units:
        code, output = _run(["systemctl", "is-active", unit], params["command_timeout"])
        if code != 0:
            problems.append("%s is %s, it was active" % (unit, output or "not active"))
    result["gpus_after"] = [
        {"index": g["index"], "memory_used_mib": g.get("memory_used_mib"), "recovery": g.get("recovery")}
        for g in view["gpus"]
        if g["index"] in targets
    ]
    if problems:
        step = "a GPU still unhealthy after a reset needs a power cycle: reboot the node, drain it first: %s" % (
            plan.DRAIN % socket.gethostname()
        )
        return dict(result, failed=True, msg="gpu_reset: reset, but %s; next: %s" % ("; ".join(problems), step),
                    next_step=step)  # fmt: skip
    return dict(result, msg="reset GPU %s: %s; memory back at idle, the driver advises nothing, every setting and "
                "daemon as before" % (", ".join(str(i) for i in targets), "; ".join(result["done"])))  # fmt: skip
