# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The run-state of the vllm_server role: one value per instance (_vllm_server_run), on the controller.

run_state(planned, api_key, now) -> the run-state at the compare phase: what to deploy, and nothing run yet.
hook_failed / failed / started / rollback_to / rolled_back / rollback_failed -> the run-state after that step.
report(report, planned, run, registered, check_mode, log_lines, now) -> the host's report with the instance's entry.
attempts(report, name) -> whether an instance is deployed (no earlier instance of the host failed).
restores(report, planned, check_mode) -> whether the restore hooks put the instance back into routing.

A task registers its result under its own name; a result that a later phase reads is kept in the run-state by the
step that reads it, so that no result of an earlier instance is read for this one.
"""

from __future__ import annotations

import base64
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._tags import renamed

# The run-state of one instance (roles/vllm_server/tasks/compare.yml sets it, each phase notes what it needs to):
#   reasons     the reasons to restart (the plan's), [] for an instance left as it is
#   cfg, url, unit_text, api_key, stop  what runs next: the new configuration, or in a rollback the previous one;
#               stop is {"manager", "address", "container"} of the server the stop phase ends (container: the
#               name of its container, as its deployment recorded it)
#   down_at     when the compare phase began (seconds since the epoch)
#   hook_failure  what failed in a drain hook ("": none): nothing was stopped
#   failure, rollback  what failed in the redeploy ("": nothing), and what the rollback did
#   kill        the free phase's gpu_kill result ({} until it ran); kill_kept, the redeploy's, kept for the report
#   log_offset  where the started server's lines begin in its log file (bytes), None before a start
#   acceptance  the acceptance gate's result when the gate failed ({} else)
#   rollback_log_tail  what the previous configuration wrote when its start in the rollback failed ({} else)
RunState = Dict[str, Any]

ROLLED_BACK = "rolled back to the previous configuration, healthy again after %.1f s"
NOTHING_TO_GO_BACK_TO = "no previous configuration to go back to: the instance is left stopped"
NOT_ROLLED_BACK = "not rolled back (vllm_server_rollback is false): the failed configuration is left as it is"


def run_state(planned: Mapping[str, Any], api_key: Optional[str], now: float) -> RunState:
    """The run-state of an instance at its compare phase: `planned` is its plan entry (_vllm_plan), `api_key` the
    instance's (empty or None: none), `now` the time in seconds."""
    return {
        "reasons": list(planned["reasons"]),
        "cfg": planned["cfg"],
        "url": planned["url"],
        "unit_text": planned["unit"],
        "api_key": api_key or "",
        "stop": {
            "manager": planned["old_manager"],
            "address": planned["old_address"],
            "container": planned["old_container"],
        },
        "down_at": float(now),
        "hook_failure": "",
        "failure": "",
        "rollback": "",
        "kill": {},
        "kill_kept": {},
        "log_offset": None,
        "acceptance": {},
        "rollback_log_tail": {},
    }


def _what_failed(task: str, result: Optional[Mapping[str, Any]]) -> str:
    # _vllm_report is imported where a failure or an entry is worded, not at the top: nearly every task of the role
    # asks attempts() or phases() in its `when:`, in a worker process that compiles what it imports
    # (plugins/filter/vllm_run/vllm_run.py).
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_report

    return "%s: %s" % (task, _vllm_report.failure(result))


def hook_failed(run: RunState, task: str, result: Optional[Mapping[str, Any]]) -> RunState:
    """The run-state after a drain hook failed (`task`, the failed task's name; `result`, its result)."""
    return dict(run, hook_failure=_what_failed(task, result))


def failed(run: RunState, task: Mapping[str, Any], result: Optional[Mapping[str, Any]]) -> RunState:
    """The run-state at the start of the rollback: what failed (`task`, the failed task, ansible_failed_task; `result`,
    its result), the redeploy's free phase kept for the report (the failed result where gpu_kill is what failed), and
    the acceptance gate's figures where the gate is what failed."""
    result = result or {}
    kill = dict(result) if str(task.get("action") or "").endswith("gpu_kill") else run["kill"]
    return dict(
        run,
        failure=_what_failed(str(task.get("name")), result),
        rollback=NOT_ROLLED_BACK,
        kill_kept=kill,
        acceptance=dict(result) if "acceptance_rate" in result else {},
    )


def started(run: RunState, detached: Optional[Mapping[str, Any]], log_before: Optional[Mapping[str, Any]]) -> RunState:
    """The run-state once the server is started: where its lines begin in the log file, from detached_process's
    log_offset, else the size of the log before a systemd start (stat)."""
    offset = (detached or {}).get("log_offset")
    if offset is None:
        offset = ((log_before or {}).get("stat") or {}).get("size")
        offset = 0 if offset is None and "stat" in (log_before or {}) else offset
    return dict(run, log_offset=offset)


def _deployed_key(run: RunState, planned: Mapping[str, Any], deployed_key: Optional[Mapping[str, Any]]) -> str:
    """The API key of the previous configuration: the one read from the host before the files changed, else none
    where the key changed, else the instance's."""
    content = (deployed_key or {}).get("content")
    if content is not None:
        text = base64.b64decode(content).decode("utf-8", "replace")
        return (text[len("VLLM_API_KEY=") :] if text.startswith("VLLM_API_KEY=") else text).strip()
    return "" if "API key" in planned["changed"] else str(run["api_key"])


def rollback_to(run: RunState, planned: Mapping[str, Any], deployed_key: Optional[Mapping[str, Any]]) -> RunState:
    """The run-state that the rollback's stop, free and start phases read: the failed configuration is the one to stop,
    the previous one (or, with none, the failed one's files) the one to start; the new server's start is forgotten."""
    return dict(
        run,
        cfg=planned["old"] if planned["old"] else planned["cfg"],
        url=planned["old_url"],
        unit_text=planned["old_unit"],
        stop={
            "manager": planned["cfg"]["service_manager"],
            "address": planned["address"],
            "container": (planned["cfg"].get("container") or {}).get("name"),
        },
        log_offset=None,
        api_key=_deployed_key(run, planned, deployed_key),
    )


def rolled_back(run: RunState, planned: Mapping[str, Any], ready: Optional[Mapping[str, Any]]) -> RunState:
    """The run-state after a rollback that worked: healthy again, or left stopped with nothing to go back to."""
    if planned["old"]:
        return dict(run, rollback=ROLLED_BACK % float((ready or {}).get("healthy_after_s") or 0))
    return dict(run, rollback=NOTHING_TO_GO_BACK_TO)


def rollback_failed(
    run: RunState, task: str, result: Optional[Mapping[str, Any]], log_tail: Optional[Mapping[str, Any]]
) -> RunState:
    """The run-state after the rollback failed too, with what the previous configuration wrote to its log."""
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_report  # deferred: _what_failed

    return dict(
        run,
        rollback="%s: %s" % (_vllm_report.ROLLBACK_FAILED, _what_failed(task, result)),
        rollback_log_tail=dict(log_tail or {}),
    )


def report(
    found: Optional[Sequence[Mapping[str, Any]]],
    planned: Mapping[str, Any],
    run: RunState,
    registered: Mapping[str, Any],
    check_mode: bool,
    log_lines: Any,
    now: float,
) -> List[Dict[str, Any]]:
    """The host's report with the instance's entry appended (_vllm_report.entry). `registered`: the results the
    role's tasks registered that the entry reads, each of a task this instance reached: would_end (compare), drain
    and replaced (the drain of the servers this role did not start), ready and acceptance (a redeploy that passed),
    log_tail (the rollback)."""
    failure = run["failure"]
    # A template of a boolean reads as text "True"/"False" on the ansible-core lines that do not keep native types.
    check_mode = check_mode is True or str(check_mode).lower() == "true"
    results = {
        "reasons": run["reasons"],
        "check_mode": check_mode,
        "would_end": registered.get("would_end"),
        "hook_failure": run["hook_failure"],
        "failure": failure,
        "rollback": run["rollback"],
        "drain": registered.get("drain"),
        "replaced": registered.get("replaced"),
        "kill": run["kill_kept"] if failure else run["kill"],
        "ready": registered.get("ready"),
        "acceptance": run["acceptance"] if failure else registered.get("acceptance"),
        "log_tail": registered.get("log_tail") if failure else {},
        "log_lines": log_lines,
        "rollback_log_tail": run["rollback_log_tail"],
        "down_s": float(now) - float(run["down_at"]),
    }
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_report  # deferred: _what_failed

    return [dict(entry) for entry in found or []] + [_vllm_report.entry(planned, results)]


def attempts(found: Optional[Sequence[Mapping[str, Any]]], name: str) -> bool:
    """Whether the instance `name` is deployed: no earlier instance of the host failed, or it is the one that did
    (read before each task: once its own entry is in, its restore still runs)."""
    found = found or []
    return not any(entry.get("action") == "FAILED" for entry in found) or found[-1].get("name") == name


def restores(found: Optional[Sequence[Mapping[str, Any]]], planned: Mapping[str, Any], check_mode: bool) -> bool:
    """Whether the restore hooks put the instance back into routing: it ran before the redeploy (or a server this role
    did not start ran in its place), and its new configuration passed its gates, or the previous one runs again after
    a rollback."""
    if check_mode or not found or not (planned["running"] or planned.get("replaces")):
        return False
    entry = found[-1]
    if not entry.get("reasons"):
        return False
    return entry.get("action") == "redeployed" or str(entry.get("rollback") or "").startswith("rolled back")


def files(value: Mapping[str, Any], api_key: Optional[str] = None) -> Dict[str, Any]:
    """What vllm_server_files writes for an instance (roles/vllm_server/tasks/files.yml): {"cfg", "api_key", "unit"}
    of a run-state (_vllm_server_run: its "api_key" and "unit_text") or of a plan entry (_vllm_server_this: its "unit",
    and `api_key` as the instance gives it)."""
    if "unit_text" in value:
        return {"cfg": value["cfg"], "api_key": value["api_key"], "unit": value["unit_text"]}
    return {"cfg": value["cfg"], "api_key": api_key, "unit": value.get("unit")}


# The role's phases; each phase's tag is its name prefixed with the role's (docs/vllm_server.md, "Phases and tags"). A
# redeploy runs drain, stop, free and start together or not at all: a server stopped and not started again, or started
# on GPUs still held, is no selection.
PHASES = ("preflight", "drain", "stop", "free", "start", "gate", "rollback")
REDEPLOY = ("vllm_server_drain", "vllm_server_stop", "vllm_server_free", "vllm_server_start")


def _selected(tag: str, run_tags: Sequence[str], skip_tags: Sequence[str]) -> bool:
    return ("all" in run_tags or tag in run_tags) and tag not in skip_tags


def phases(run_tags: Optional[Sequence[str]], skip_tags: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """What the --tags and --skip-tags of a run (ansible_run_tags, ansible_skip_tags) select of the role's phases:
    "dry" (no redeploy phase runs: the instances are checked and compared, and reported as check mode reports them)
    and "problem" (why the selection is refused, "" when it is not)."""
    run_tags, skip_tags = list(run_tags or ["all"]), list(skip_tags or [])
    redeploy = [tag for tag in REDEPLOY if _selected(tag, run_tags, skip_tags)]
    problem = renamed(run_tags, skip_tags, "vllm_server", PHASES)
    if problem:
        redeploy = []
    elif "vllm_server_preflight" in skip_tags:
        problem = "--skip-tags vllm_server_preflight: the checks and the comparison come before every other phase"
    elif "vllm_server_rollback" in skip_tags and redeploy:
        problem = (
            "--skip-tags vllm_server_rollback: set vllm_server_rollback to false to leave a failed configuration as "
            "it is"
        )
    elif redeploy and len(redeploy) < len(REDEPLOY):
        problem = "--tags selects %s of the phases %s, which run together: select all of them, or preflight alone" % (
            ", ".join(redeploy),
            ", ".join(REDEPLOY),
        )
    return {"dry": not redeploy, "problem": problem}


STEPS: Dict[str, Callable[..., RunState]] = {
    "compare": run_state,
    "hook_failed": hook_failed,
    "failed": failed,
    "started": started,
    "rollback_to": rollback_to,
    "rolled_back": rolled_back,
    "rollback_failed": rollback_failed,
}


def step(value: Mapping[str, Any], name: str, **arguments: Any) -> RunState:
    """The run-state after the step `name` (STEPS): `value` is the plan entry for "compare", else the run-state."""
    if name not in STEPS:
        raise ValueError("no run-state step %r: %s" % (name, ", ".join(STEPS)))
    return STEPS[name](value, **arguments)
