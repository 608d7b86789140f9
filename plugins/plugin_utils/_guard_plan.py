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
import re
from typing import Any, Collection, Dict, Iterable, List, Mapping, Optional, Set, Tuple, TypedDict, cast

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
    """A process the alerts ask to free: its PID and start time in clock ticks since boot, and the alerts that name
    it (one per GPU it holds)."""

    pid: int
    start_ticks: int
    alerts: List[AlertRef]


class PlanRefusal(TypedDict):
    """An alert the guard does not act on (alert None: a call without alerts, or alerts Alertmanager left out), and
    why."""

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


def _labels(alert: Mapping[str, Any]) -> Dict[str, Any]:
    labels = alert.get("labels")
    return labels if isinstance(labels, dict) else {}


def alert_ref(alert: Mapping[str, Any]) -> AlertRef:
    """The alert in a log line: its name, fingerprint, start and the labels that name the orphan."""
    labels = _labels(alert)
    keys = ("alertname", "inventory_hostname", "instance", "gpu", "pid", "start_ticks", "comm", "reason")
    return {
        "fingerprint": alert.get("fingerprint"),
        "startsAt": alert.get("startsAt"),
        "labels": {key: labels[key] for key in keys if key in labels},
    }


# A PID or a start time in clock ticks: ASCII digits only (str.isdigit() also takes "²" and "٣", which int() refuses
# or reads), at most 20 (2**64 has 20).
_WHOLE = re.compile(r"[0-9]{1,20}")


def _whole(value: object) -> Optional[int]:
    """A label's positive whole number, or None. Labels are text; a JSON number posted by hand is read as its text."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    return int(text) if _WHOLE.fullmatch(text) and int(text) > 0 else None


def _refusal(alert: object) -> Optional[str]:
    """Why this alert asks nothing the guard acts on, or None."""
    if not isinstance(alert, dict):
        return "the alert is not a JSON object"
    if not isinstance(alert.get("labels"), dict):
        return "the alert's labels are not a mapping of names to values"
    labels = alert["labels"]
    if labels.get("alertname") != ORPHAN_ALERT:
        return "not an orphan alert (alertname %s): the guard frees only what %s names" % (
            labels.get("alertname"),
            ORPHAN_ALERT,
        )
    if alert.get("status") != "firing":
        return "the alert is %s, not firing" % alert.get("status")
    if _whole(labels.get("pid")) is None or _whole(labels.get("start_ticks")) is None:
        return (
            "the alert does not name a process: labels pid and start_ticks must be positive whole numbers "
            "(ASCII digits)"
        )
    return None


def _identity(alert: Mapping[str, Any]) -> str:
    """What makes two alerts the same: Alertmanager's fingerprint (a hash of the labels), else the labels."""
    fingerprint = alert.get("fingerprint")
    if isinstance(fingerprint, str) and fingerprint:
        return fingerprint
    return json.dumps(_labels(alert), sort_keys=True, default=str)


def _alerts_of(calls: object) -> Tuple[List[object], List[PlanRefusal]]:
    """The alerts of the webhook calls (one payload, or a list of payloads), and the refusals of calls that carry
    none or say that Alertmanager left some out (max_alerts)."""
    alerts: List[object] = []
    refused: List[PlanRefusal] = []
    for payload in calls if isinstance(calls, list) else [calls]:
        found = payload.get("alerts") if isinstance(payload, dict) else None
        if not isinstance(found, list):
            refused.append({"alert": None, "why": "the payload carries no list of alerts"})
            continue
        alerts.extend(found)
        payload = cast(Dict[str, Any], payload)
        left_out = _whole(payload.get("truncatedAlerts"))
        if left_out:
            refused.append(
                {
                    "alert": None,
                    "why": "Alertmanager left %d alert(s) of group %s out of this call (max_alerts of its "
                    "webhook_configs): they come with its next notification" % (left_out, payload.get("groupKey")),
                }
            )
    return alerts, refused


def plan(calls: object, inventory: Collection[str]) -> GuardPlan:
    """Filter: Alertmanager's webhook payloads (one {"alerts": [...]}, or a list of them: the calls decided in one
    run) as {"hosts": {host: [{"pid", "start_ticks", "alerts"}]}, "refused": [{"alert", "why"}]}. `inventory`: the
    hosts of the inventory (groups['all']). Every alert is in exactly one entry: named (with every alert that names
    the same process), or refused with its reason, each alone."""
    hosts: Dict[str, List[NamedOrphan]] = {}
    alerts, refused = _alerts_of(calls)
    seen: Set[str] = set()
    for alert in alerts:
        why = _refusal(alert)
        if why is not None or not isinstance(alert, dict):
            refused.append({"alert": alert_ref(alert) if isinstance(alert, dict) else None, "why": why or ""})
            continue
        labels, identity = alert["labels"], _identity(alert)
        host = labels.get("inventory_hostname")
        if identity in seen:
            why = "the same alert (fingerprint %s) came again: decided once" % alert.get("fingerprint")
        elif not isinstance(host, str) or host not in inventory:
            why = "inventory_hostname %s is not a host of the inventory" % (host,)
        if why:
            refused.append({"alert": alert_ref(alert), "why": why})
            continue
        seen.add(identity)
        _name(hosts.setdefault(host, []), alert)
    return {"hosts": hosts, "refused": refused}


def _name(named: List[NamedOrphan], alert: Mapping[str, Any]) -> None:
    """Add the alert to its process among `named` (the same PID and start time), or a new entry; _refusal found both
    numbers."""
    pid, ticks = cast(int, _whole(alert["labels"]["pid"])), cast(int, _whole(alert["labels"]["start_ticks"]))
    for entry in named:
        if (entry["pid"], entry["start_ticks"]) == (pid, ticks):
            entry["alerts"].append(alert_ref(alert))
            return
    named.append({"pid": pid, "start_ticks": ticks, "alerts": [alert_ref(alert)]})


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


class HostLines(TypedDict):
    """What host_lines gives: the log entries of one host's alerts, those of processes the look decided (the
    ledger's `decided`: refused without a look for guard_interval), and what failed (empty when nothing did)."""

    entries: List[Dict[str, Any]]
    decided: List[Dict[str, Any]]
    failed: List[str]


def _alerts(named: Iterable[Mapping[str, Any]], pids: Optional[Collection[int]] = None) -> List[Any]:
    """The alerts of the named processes (of `pids` only, when given)."""
    return [alert for entry in named if pids is None or entry["pid"] in pids for alert in entry["alerts"]]


def _done(kill: Mapping[str, Any], mode: str) -> Dict[str, Any]:
    """What gpu_kill's result says it did: the PIDs signalled (or that would be), those left alone, its message."""
    key = "would_signal" if mode == "check" else "signalled"
    left = kill.get("left_alone") or []
    return {
        "result": [entry.get("pid") for entry in kill.get(key) or []],
        "left_alone": {str(entry.get("pid")): entry.get("reason") for entry in left},
        "message": kill.get("msg") or "",
    }


def host_lines(
    named: Iterable[Mapping[str, Any]],
    host: str,
    mode: str,
    decision: Optional[Mapping[str, Any]] = None,
    claim: Optional[Mapping[str, Any]] = None,
    kill: Optional[Mapping[str, Any]] = None,
    failure: Optional[str] = None,
) -> HostLines:
    """Filter: the log lines of one host, every alert of `named` in exactly one. `decision`: host_decision's (None
    when the look failed); `claim`: guard_ledger's claim_hosts result (None when nothing was to end); `kill`: gpu_kill's
    result; `failure`: what failed on the host (then the PIDs to end, or every alert when nothing was decided, are
    in one failure line)."""
    named = list(named)
    base = {"host": host, "mode": mode}
    if decision is None:
        why = failure or "the host gave no decision"
        return {
            "entries": [dict(base, action="failed", why=why, alerts=_alerts(named))],
            "decided": [],
            "failed": [why],
        }
    refused = [dict(entry, **base) for entry in decision["refused"]]
    pids = list(decision["pids"])
    entries, decided = (refused, []) if decision.get("blocked") else ([], refused)
    if not pids:
        return {"entries": entries, "decided": decided, "failed": []}
    line = dict(base, pids=pids, pid_start_ticks=decision["pid_start_ticks"], alerts=_alerts(named, pids))
    if failure:
        line.update(action="failed", why=failure)
    elif claim is not None and host not in (claim.get("claimed") or []):
        line.update(why=(claim.get("refusals") or {}).get(host) or "the host's remediation slot was not claimed")
    else:
        line.update(_done(kill or {}, mode), action="would signal" if mode == "check" else "signalled")
    return {"entries": entries + [line], "decided": decided, "failed": [failure] if failure else []}


def outcomes(
    targets: Mapping[str, Iterable[Mapping[str, Any]]],
    hostvars: Mapping[str, Any],
    mode: str,
    fact: str = "_guard_lines",
) -> HostLines:
    """Filter: the host_lines of every host of `targets` ({host: the processes it was asked to free}) together,
    read from hostvars[host][fact]; a host without them (it stopped before they were made) gets one failure line
    with its alerts."""
    found: HostLines = {"entries": [], "decided": [], "failed": []}
    for host, named in targets.items():
        lines = hostvars[host].get(fact) if host in hostvars else None
        if not isinstance(lines, dict):
            why = "the run on %s stopped before its outcome was known (unreachable, or a task failed)" % host
            lines = host_lines(named, host, mode, failure=why)
        found["entries"].extend(lines["entries"])
        found["decided"].extend(lines["decided"])
        found["failed"].extend(lines["failed"])
    return found
