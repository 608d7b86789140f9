# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPU reset's decisions, on data (docs/recovery.md): which GPUs a reset is for, the NVLink peers it takes with
them, every precondition by name, the steps and their undo, and the next step after a failed nvidia-smi.

Pure: a snapshot taken with recovery=True in, words and plans out. The run is _gpu_reset.py. Python 3.9.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Set, Tuple, TypedDict

# The GPU daemons a reset stops through their systemd units and starts again after: they hold every GPU's device
# file (nvidia-persistenced(1); DCGM's nv-hostengine, IBM/CAST#551; dcgm-exporter, an NVML client; the Fabric
# Manager where it holds one). Known by their executable (_select.daemon_name), never by a title.
RESET_DAEMONS = ("nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "nv-fabricmanager", "nvidia-fabricmanager")
# Exit codes of nvidia-smi (nvidia-smi(1), "RETURN VALUE").
EXIT_NOT_SUPPORTED = 3
EXIT_NO_PERMISSION = 4
EXIT_GPU_LOST = 15
IN_USE = "In use by another client"
DRAIN = 'scontrol update nodename=%s state=drain reason="gpuops: GPU reset failed"'


class Check(TypedDict):
    """One precondition: its name, whether it holds, the GPUs it is about and why, in words."""

    name: str
    ok: bool
    gpus: List[int]
    why: str


class Step(TypedDict):
    """One step of the reset: what it does, its command, and the command that undoes it (None: nothing to undo)."""

    step: str
    what: str
    command: List[str]
    undo: Optional[List[str]]


class Where(TypedDict):
    """Where the reset would run: root, a container, the PID namespace, the nvidia-smi found."""

    root: bool
    container: Optional[str]
    initial_pid_namespace: bool
    own_pid_namespace: bool
    nvidia_smi: Optional[str]


def _indices(pids: Sequence[int]) -> str:
    return ", ".join(str(pid) for pid in pids)


def candidates(view: Mapping[str, Any], selected: Optional[Collection[int]]) -> Dict[int, str]:
    """{index: why} of the selected GPUs a reset is for: memory no process explains on a GPU no process holds
    (still not released after the wait), or the driver's advice (a reset, or a reboot that the checks then name)."""
    found: Dict[int, str] = {}
    for gpu in view["gpus"]:
        if selected is not None and gpu["index"] not in selected:
            continue
        reasons = []
        if gpu.get("memory_unexplained") and not gpu.get("holder_pids") and gpu.get("unexplained_mib") is not None:
            reasons.append("%d MiB used that no process explains" % gpu["unexplained_mib"])
        recovery = gpu.get("recovery") or {}
        if recovery.get("needs"):
            reasons.extend(recovery.get("why") or [])
        if reasons:
            found[gpu["index"]] = "; ".join(reasons)
    return found


def with_peers(view: Mapping[str, Any], indices: Collection[int]) -> List[int]:
    """`indices` and every GPU linked to one of them directly by NVLink, and theirs (nvidia-smi(1): where a GPU
    cannot be reset alone, its NVLink peers must be reset in the same command)."""
    peers = {gpu["index"]: (gpu.get("recovery") or {}).get("reset_peers") or [] for gpu in view["gpus"]}
    group: Set[int] = set(indices)
    todo = list(indices)
    while todo:
        for peer in peers.get(todo.pop(), []):
            if peer not in group:
                group.add(peer)
                todo.append(peer)
    return sorted(group)


def host_checks(where: Where) -> List[Check]:
    """The preconditions on the host: root, no container, the host's PID namespace, nvidia-smi."""
    checks: List[Check] = [
        {"name": "root", "ok": where["root"], "gpus": [], "why": "the reset runs as root (become: true)"}
    ]
    if where["container"]:
        host_ok, host_why = (
            False,
            (
                "this runs in %s: a reset from a container can neither see nor stop what holds the GPU; run it on the host"
                % where["container"]
            ),
        )
    elif not where["initial_pid_namespace"] and not where["own_pid_namespace"]:
        host_ok, host_why = (
            False,
            (
                "this PID namespace is not the host's (initial) one: processes of other PID namespaces that use the GPU "
                "are invisible here; run it on the host, or set own_pid_namespace (reset_gpus_gpu_reset_own_pid_namespace) "
                "where this PID namespace holds every process of the machine (a systemd-nspawn or LXC system container)"
            ),
        )
    else:
        host_ok, host_why = True, "runs on the host, in its own PID namespace"
    checks.append({"name": "host", "ok": host_ok, "gpus": [], "why": host_why})
    smi = where["nvidia_smi"]
    checks.append(
        {
            "name": "nvidia_smi",
            "ok": bool(smi),
            "gpus": [],
            "why": "nvidia-smi is %s" % smi if smi else "nvidia-smi is not on PATH: install the NVIDIA driver's tools",
        }
    )
    return checks


def gpu_checks(
    view: Mapping[str, Any], targets: List[int], daemons: Mapping[int, Tuple[Optional[str], Optional[str]]]
) -> List[Check]:
    """The preconditions on the GPUs to reset, one by one: the driver answers each, its advice is one a reset
    follows, no holder, every device user a GPU daemon in a unit, no MIG instance. `daemons`: {PID: (daemon name,
    systemd unit)} of the device users."""
    gpus = [gpu for gpu in view["gpus"] if gpu["index"] in targets]
    lost = [g["index"] for g in gpus if g.get("error")]
    advice = [g for g in gpus if (g.get("recovery") or {}).get("needs") in ("reboot", "other")]
    held = [g["index"] for g in gpus if g.get("holder_pids")]
    mig = [g for g in gpus if g.get("mig_devices")]
    users = _blocking_users(view, targets, daemons)
    return [
        _check("driver", not lost, lost, "the driver answers GPU %s" % _indices(targets), _lost_why(gpus, lost)),
        _check("advice", not advice, [g["index"] for g in advice], "the driver advises nothing a reset cannot do",
               "; ".join("GPU %d: %s" % (g["index"], "; ".join(g["recovery"]["why"])) for g in advice)
               + ": a reset cannot help; reboot the node"),
        _check("holders", not held, held, "no process holds GPU %s" % _indices(targets),
               "; ".join("GPU %d is held by PID %s" % (g["index"], _indices(g["holder_pids"])) for g in gpus
                         if g.get("holder_pids")) + ": end them first (the reset's stop phase, reset_gpus)"),
        _check("device_users", not users, sorted({i for _pid, gpus_, _w in users for i in gpus_}),
               "every process with their device files open is a GPU daemon in a systemd unit, stopped and restarted",
               "; ".join(why for _pid, _gpus, why in users)),
        _check("mig", not mig, [g["index"] for g in mig], "no GPU has MIG instances",
               "; ".join("GPU %d has %d MIG instance(s): a reset destroys every GPU instance (they are not kept "
                         "across a reset) and applies a pending MIG mode; delete them (nvidia-smi mig -dci, -dgi) or "
                         "reboot" % (g["index"], len(g["mig_devices"])) for g in mig)),
    ]  # fmt: skip


def _check(name: str, ok: bool, gpus: List[int], ok_why: str, refused_why: str) -> Check:
    return {"name": name, "ok": ok, "gpus": gpus, "why": ok_why if ok else refused_why}


def _lost_why(gpus: List[Mapping[str, Any]], lost: List[int]) -> str:
    return "; ".join(
        "GPU %d answers %s: a lost GPU needs a reboot or power cycle" % (g["index"], g["error"])
        for g in gpus
        if g["index"] in lost
    )


def _blocking_users(
    view: Mapping[str, Any], targets: List[int], daemons: Mapping[int, Tuple[Optional[str], Optional[str]]]
) -> List[Tuple[int, List[int], str]]:
    """The device users of `targets` that the reset cannot stop through a unit: (PID, GPUs, why)."""
    blocking = []
    for user in view.get("device_users", []):
        gpus = sorted(set(user.get("device_gpus") or ()) & set(targets))
        if not gpus:
            continue
        name, unit = daemons.get(user["pid"], (None, None))
        if name and unit:
            continue
        what = "PID %d %s has the device file of GPU %s open" % (user["pid"], user.get("comm"), _indices(gpus))
        if name:
            why = "%s: the %s runs in no systemd unit the reset could stop and start again%s; stop it yourself" % (
                what,
                name,
                _owner_words(user.get("owner") or {}),
            )
        else:
            why = "%s and is no GPU daemon the reset stops (%s): end it first" % (what, ", ".join(RESET_DAEMONS))
        blocking.append((user["pid"], gpus, why))
    return blocking


def _owner_words(owner: Mapping[str, Any]) -> str:
    if owner.get("pod_uid"):
        return " (pod %s/%s: move it off the node first)" % (owner.get("pod_namespace"), owner.get("pod_name"))
    if owner.get("container_id"):
        return " (container %s)" % str(owner["container_id"])[:12]
    return ""


def units_to_stop(
    view: Mapping[str, Any], targets: List[int], daemons: Mapping[int, Tuple[Optional[str], Optional[str]]]
) -> Dict[str, List[int]]:
    """{unit: PIDs} of the GPU daemons that hold a device file of `targets`, in the order they are found."""
    units: Dict[str, List[int]] = {}
    for user in view.get("device_users", []):
        name, unit = daemons.get(user["pid"], (None, None))
        if name and unit and set(user.get("device_gpus") or ()) & set(targets):
            units.setdefault(unit, []).append(user["pid"])
    return units


def steps(
    view: Mapping[str, Any], targets: List[int], units: Mapping[str, List[int]], smi: str, systemctl: str
) -> List[Step]:
    """The reset's steps in order, each with its undo: stop the daemons' units, persistence mode off, the reset,
    persistence mode on again, the units started again."""
    gpus = [gpu for gpu in view["gpus"] if gpu["index"] in targets]
    uuids = [str(gpu["uuid"]) for gpu in gpus]
    persistent = [gpu for gpu in gpus if (gpu.get("recovery") or {}).get("persistence_mode")]
    plan: List[Step] = []
    for unit, pids in units.items():
        plan.append(
            {
                "step": "stop",
                "what": "stop %s (PID %s holds the GPUs' device files)" % (unit, _indices(pids)),
                "command": [systemctl, "stop", unit],
                "undo": [systemctl, "start", unit],
            }
        )
    for gpu in persistent:
        plan.append(
            {
                "step": "persistence_off",
                "what": "turn persistence mode off on GPU %d" % gpu["index"],
                "command": [smi, "-pm", "0", "-i", str(gpu["uuid"])],
                "undo": [smi, "-pm", "1", "-i", str(gpu["uuid"])],
            }
        )
    plan.append(
        {
            "step": "reset",
            "what": "reset GPU %s" % _indices(targets),
            "command": [smi, "--gpu-reset", "-i", ",".join(uuids)],
            "undo": None,
        }
    )
    for gpu in persistent:
        plan.append(
            {
                "step": "persistence_on",
                "what": "turn persistence mode on again on GPU %d" % gpu["index"],
                "command": [smi, "-pm", "1", "-i", str(gpu["uuid"])],
                "undo": None,
            }
        )
    for unit in reversed(list(units)):
        plan.append({"step": "start", "what": "start %s again" % unit, "command": [systemctl, "start", unit],
                     "undo": None})  # fmt: skip
    return plan


def failure_step(code: Optional[int], output: str, timeout_s: float, host: str) -> Tuple[str, str]:
    """Why a `nvidia-smi --gpu-reset` failed (code None: it did not return within timeout_s), and the next step."""
    reboot = "reboot the node (a power cycle where the GPU stays unusable); drain it first: %s (docs/schedulers.md)" % (
        DRAIN % host
    )
    if code is None:
        return "nvidia-smi --gpu-reset did not return within %.0f s (the driver may be stuck)" % timeout_s, reboot
    if IN_USE in output:
        return (
            "the driver says the GPU is in use by another client that no process here shows (a process in another "
            "PID namespace, a display driven by nvidia-drm, GPUDirect RDMA)",
            reboot,
        )
    if code == EXIT_NO_PERMISSION:
        return "nvidia-smi --gpu-reset was refused for lack of permission", "run the reset as root (become: true)"
    if code == EXIT_NOT_SUPPORTED:
        return "this GPU or system does not support a GPU reset (nvidia-smi exit 3)", reboot
    if code == EXIT_GPU_LOST:
        return "the GPU is lost (nvidia-smi exit 15)", reboot
    return "nvidia-smi --gpu-reset failed with exit %d: %s" % (code, " ".join(output.split())[:300]), reboot


def refusal(checks: List[Check]) -> Optional[str]:
    """The refused preconditions in words, or None when every one holds."""
    refused = ["%s: %s" % (check["name"], check["why"]) for check in checks if not check["ok"]]
    return "; ".join(refused) if refused else None


def run_steps(
    plan: List[Step], run: Callable[[Step], Optional[str]]
) -> Tuple[List[Step], Optional[Tuple[Step, str]], List[Tuple[Step, Optional[str]]]]:
    """Run `plan` in order with `run` (None: done, else why it failed). A failure before the reset is done undoes
    the steps done so far, newest first. Returns (done, the failed step and why, [(undo step, why it failed or
    None)]). A failure after the reset (restoring a setting) is reported, and the rest of the restore goes on."""
    done: List[Step] = []
    undone: List[Tuple[Step, Optional[str]]] = []
    failed: Optional[Tuple[Step, str]] = None
    reset_done = False
    for step in plan:
        error = run(step)
        if error is None:
            done.append(step)
            reset_done = reset_done or step["step"] == "reset"
            continue
        if reset_done:
            failed = failed or (step, error)
            continue
        failed = (step, error)
        for earlier in reversed(done):
            if earlier["undo"]:
                undo: Step = {"step": "undo", "what": "undo: " + earlier["what"], "command": earlier["undo"],
                              "undo": None}  # fmt: skip
                undone.append((undo, run(undo)))
        break
    return done, failed, undone
