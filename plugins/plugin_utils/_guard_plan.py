# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The guard's decisions on the controller (docs/guard.md): which hosts and processes an alert asks to free, and
why the rest is refused. Pure: data in, data out; the playbooks log every refusal with the alert that caused it.

An orphan is named by its PID and its start time in clock ticks since boot (field 22 of /proc/PID/stat), the
labels `pid` and `start_ticks` of gpuops_nvidia_guard_orphan_memory_bytes: a PID alone may have been reused.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Collection, Dict, Iterable, List, Mapping, Optional, TypedDict, cast

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_address import local_url

ORPHAN_ALERT = "GpuopsNvidiaOrphanedGpuMemory"


class _GuardInstanceKey(TypedDict, total=False):
    api_key: str


class GuardInstance(_GuardInstanceKey):
    """An entry of gpu_guard's vllm_instances: the instance's name and the URL the host reaches it at (api_key when
    the instance has one)."""

    name: str
    url: str


class AlertRef(TypedDict):
    """An alert in a log line (alert_ref): values as Alertmanager sent them."""

    fingerprint: Any
    startsAt: Any
    labels: Dict[str, Any]


class NamedOrphan(TypedDict):
    """A process an alert asks to free: its PID and start time in clock ticks since boot, and the alert."""

    pid: int
    start_ticks: int
    alert: AlertRef


class PlanRefusal(TypedDict):
    """An alert the guard does not act on (alert None: the payload had no alerts), and why."""

    alert: Optional[AlertRef]
    why: str


class GuardPlan(TypedDict):
    """What plan gives: the orphans each host is asked to free, and the refusals."""

    hosts: Dict[str, List[NamedOrphan]]
    refused: List[PlanRefusal]


class HostDecision(TypedDict):
    """What host_decision gives for one host: why nothing is done (or None), the PIDs to end with their start ticks
    (keyed by the PID as text), and the refused entries of plan (each with its why)."""

    blocked: Optional[str]
    pids: List[int]
    pid_start_ticks: Dict[str, int]
    refused: List[Dict[str, Any]]


def instances(vllm_server_instances: Optional[Iterable[Mapping[str, Any]]]) -> List[GuardInstance]:
    """Filter: vllm_server_instances (the vllm_server role's) as gpu_guard's vllm_instances."""
    found: List[GuardInstance] = []
    for instance in vllm_server_instances or []:
        entry: GuardInstance = {
            "name": instance["name"],
            "url": local_url(instance.get("host"), instance.get("port", 8000)),
        }
        if instance.get("api_key"):
            entry["api_key"] = instance["api_key"]
        found.append(entry)
    return found


def alert_ref(alert: Mapping[str, Any]) -> AlertRef:
    """The alert in a log line: its name, fingerprint, start and the labels that name the orphan."""
    labels = alert.get("labels") or {}
    keys = ("alertname", "inventory_hostname", "instance", "gpu", "pid", "start_ticks", "comm", "reason")
    return {
        "fingerprint": alert.get("fingerprint"),
        "startsAt": alert.get("startsAt"),
        "labels": {key: labels[key] for key in keys if key in labels},
    }


def _whole(value: object) -> Optional[int]:
    text = str(value if value is not None else "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _refusal(alert: Mapping[str, Any]) -> Optional[str]:
    """Why this alert asks nothing the guard acts on, or None."""
    labels = alert.get("labels") or {}
    if labels.get("alertname") != ORPHAN_ALERT:
        return "not an orphan alert (alertname %s): the guard frees only what %s names" % (
            labels.get("alertname"),
            ORPHAN_ALERT,
        )
    if alert.get("status") != "firing":
        return "the alert is %s, not firing" % alert.get("status")
    if _whole(labels.get("pid")) is None or _whole(labels.get("start_ticks")) is None:
        return "the alert does not name a process: labels pid and start_ticks must be positive whole numbers"
    return None


def plan(payload: object, inventory: Collection[str]) -> GuardPlan:
    """Filter: Alertmanager's webhook payload ({"alerts": [...]}) as {"hosts": {host: [{"pid", "start_ticks",
    "alert"}]}, "refused": [{"alert", "why"}]}. `inventory`: the hosts of the inventory (groups['all'])."""
    hosts: Dict[str, List[NamedOrphan]] = {}
    refused: List[PlanRefusal] = []
    alerts = payload.get("alerts") if isinstance(payload, dict) else None
    if not isinstance(alerts, list):
        return {"hosts": {}, "refused": [{"alert": None, "why": "the payload carries no list of alerts"}]}
    for alert in alerts:
        alert = alert if isinstance(alert, dict) else {}
        why = _refusal(alert)
        host = (alert.get("labels") or {}).get("inventory_hostname")
        if why is None and host not in inventory:
            why = "inventory_hostname %s is not a host of the inventory" % host
        if why:
            refused.append({"alert": alert_ref(alert), "why": why})
            continue
        labels = alert["labels"]
        # _refusal found both whole numbers
        named: NamedOrphan = {
            "pid": cast(int, _whole(labels["pid"])),
            "start_ticks": cast(int, _whole(labels["start_ticks"])),
            "alert": alert_ref(alert),
        }
        mine = hosts.setdefault(cast(str, host), [])  # a host of the inventory: a name
        if all((n["pid"], n["start_ticks"]) != (named["pid"], named["start_ticks"]) for n in mine):
            mine.append(named)
    return {"hosts": hosts, "refused": refused}


def redeploy_running(marker: Optional[Mapping[str, Any]], now: float, max_age: float) -> Optional[str]:
    """Why a redeploy of the host is running, from ansible.builtin.slurp's result for its marker, or None.
    A marker older than max_age seconds was left by a run that died: ignored."""
    if not marker or marker.get("failed") or not marker.get("content"):
        return None
    try:
        started = float(json.loads(base64.b64decode(marker["content"]).decode("utf-8"))["started"])
    except (ValueError, KeyError, TypeError):
        return "a redeploy marker is there but cannot be read: a redeploy may be running"
    age = now - started
    if age > max_age:
        return None
    return "a redeploy of this host is running (started %.0f s ago)" % max(age, 0)


def host_decision(
    named: Optional[Iterable[Mapping[str, Any]]],
    orphans: Optional[Iterable[Mapping[str, Any]]],
    marker: Optional[Mapping[str, Any]] = None,
    now: float = 0.0,
    max_age: float = 3600.0,
) -> HostDecision:
    """Filter: what to end on one host. `named`: plan's entries for it; `orphans`: gpu_guard's orphans now;
    `marker`: slurp of the redeploy marker. {"blocked": why nothing is done or None, "pids": [PID],
    "pid_start_ticks": {"PID": ticks}, "refused": [{"pid", "start_ticks", "alert", "why"}]}."""
    blocked = redeploy_running(marker, now, max_age)
    current = {orphan["pid"]: orphan for orphan in orphans or []}
    pids: List[int] = []
    ticks: Dict[str, int] = {}
    refused: List[Dict[str, Any]] = []
    for entry in named or []:
        found = current.get(entry["pid"])
        if blocked:
            why = blocked
        elif found is None:
            why = "not an orphaned holder now (it exited, or its server, unit, pod or job is alive)"
        elif found["start_ticks"] != entry["start_ticks"]:
            why = "PID %d was reused: the process now started at tick %d, the alert named tick %d" % (
                entry["pid"],
                found["start_ticks"],
                entry["start_ticks"],
            )
        else:
            pids.append(entry["pid"])
            ticks[str(entry["pid"])] = entry["start_ticks"]
            continue
        refused.append(dict(entry, why=why))
    return {"blocked": blocked, "pids": pids, "pid_start_ticks": ticks, "refused": refused}
