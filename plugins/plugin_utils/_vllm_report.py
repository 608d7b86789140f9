# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the vllm_server role reports, on the controller: one entry per instance, the summary, the failure message.

entry(planned, results) -> the report entry of one instance (its "action": unchanged, would redeploy, redeployed
or FAILED); summary_lines(report, names) -> the host's summary; failures(report, host) -> why the host fails, or "";
failure(result) -> what a failed task says, in one line.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._report import cut_cmdline

# A report entry (entry): name, gpus, url, old, new, reasons, action, and what the run found; see entry.yml.
Entry = Dict[str, Any]
NOTHING_STOPPED = "nothing was stopped: the running server is as it was (the restore hooks were not run)"
# How roles/vllm_server/tasks/rollback.yml words a rollback that failed.
ROLLBACK_FAILED = "the rollback failed too"


def failure(result: Optional[Mapping[str, Any]]) -> str:
    """What a failed task's result says, for the summary: its msg, the exit status of a command and the last lines it
    wrote to stderr (a drain hook's "non-zero return code" alone says nothing)."""
    result = result or {}
    text = str(result.get("msg") or "failed").strip()
    if result.get("rc") not in (None, 0) and "rc " not in text:
        text += " (rc %s)" % result["rc"]
    lines = [
        line.strip() for line in str(result.get("stderr") or result.get("stdout") or "").splitlines() if line.strip()
    ]
    if lines and result.get("rc") is not None:
        text += ", %s: %s" % ("stderr" if result.get("stderr") else "stdout", " | ".join(lines[-3:]))
    return text


def _ran(result: Optional[Mapping[str, Any]]) -> bool:
    """Whether a registered result is of a task that ran (not skipped, not left unset)."""
    return bool(result) and not (result or {}).get("skipped")


def _drain(result: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """What the summary says about a vllm_drain result, or None when the drain did not run."""
    if result is None or not _ran(result) or "drain_s" not in result:
        return None
    keys = ("drained", "drain_s", "running", "waiting", "running_at_start", "metrics", "reachable")
    return dict({key: result.get(key) for key in keys}, stop_s=(result.get("stop") or {}).get("stop_s"))


def _tail(result: Optional[Mapping[str, Any]], keep: int) -> List[str]:
    """The last `keep` lines of a registered `tail` result ([] when it did not run)."""
    lines = (result or {}).get("stdout_lines") or []
    return lines[-keep:] if keep else []


def _replaced(planned: Mapping[str, Any], result: Optional[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The servers this role did not start that the instance replaces (planned "replaces"), each with "drain" (as
    _drain words it, or None) and "stop" (vllm_drain's, or None while it was not signalled), from the loop `result`
    of their drain task."""
    done = {(item.get("item") or {}).get("pid"): item for item in (result or {}).get("results") or [] if _ran(item)}
    found = []
    for server in planned.get("replaces") or []:
        drained = done.get(server["pid"])
        found.append(dict(server, drain=_drain(drained), stop=(drained or {}).get("stop")))
    return found


def entry(planned: Mapping[str, Any], results: Mapping[str, Any]) -> Entry:
    """The report entry of one instance. `planned`: its plan entry (_vllm_plan). `results`: "reasons", "check_mode",
    and the registered results and notes of the run: "would_end", "hook_failure", "failure", "rollback", "drain",
    "replaced" (the drain of the servers this role did not start), "kill", "ready", "acceptance", "log_tail" (what the
    new server wrote), "rollback_log_tail" (what the previous configuration wrote when started again), "down_s",
    "log_lines"."""
    reasons = results.get("reasons") or []
    found = {
        "name": planned["name"],
        "gpus": planned["cfg"]["gpus"],
        "url": planned["url"],
        "old": planned["old"],
        "new": planned["cfg"],
        "reasons": reasons,
        "replaced": _replaced(planned, results.get("replaced")) if reasons else [],
    }
    if not reasons or results.get("check_mode"):
        would_end = (results.get("would_end") or {}).get("would_signal") or []
        return dict(found, action="would redeploy" if reasons else "unchanged", would_end=would_end)
    if results.get("hook_failure"):
        return dict(
            found,
            action="FAILED",
            before_stop=True,
            error=results["hook_failure"],
            rollback=NOTHING_STOPPED,
            log_tail=[],
        )
    acceptance = results.get("acceptance") or {}
    found.update(leftovers=(results.get("kill") or {}).get("signalled") or [], drain=_drain(results.get("drain")))
    if results.get("failure"):
        keep = int(results.get("log_lines") or 30)
        rollback = results.get("rollback") or ""
        return dict(
            found,
            action="FAILED",
            error=results["failure"],
            rollback=rollback,
            rollback_failed=rollback.startswith(ROLLBACK_FAILED),
            acceptance=acceptance if "acceptance_rate" in acceptance else None,
            log_tail=_tail(results.get("log_tail"), keep),
            rollback_log_tail=_tail(results.get("rollback_log_tail"), keep),
        )
    return dict(
        found,
        action="redeployed",
        # A server this role did not start that served on its behalf counts: the instance's port was served before.
        was_running=bool(planned["running"]) or any(not s.get("starting") for s in planned.get("replaces") or []),
        healthy_after_s=(results.get("ready") or {}).get("healthy_after_s"),
        down_s=round(float(results.get("down_s") or 0), 1),
        acceptance=acceptance if _ran(acceptance) and "acceptance_rate" in acceptance else None,
    )


def _json(value: object) -> str:
    """A configuration value as the summary shows it: JSON, and "not set" for a key the instance leaves out."""
    return "not set" if value is None else json.dumps(value, sort_keys=True)


def _join(values: Iterable[object], separator: str = ",") -> str:
    return separator.join(str(value) for value in values)


def _change_lines(e: Entry) -> List[str]:
    if e["action"] == "unchanged":
        return []
    if e["old"] is None:
        spec = e["new"].get("speculative_config")
        return [
            "  configuration: none deployed by this role -> %s"
            % (("speculative_config " + _json(spec)) if spec else "no speculative config")
        ]
    return [
        "  %s: %s -> %s" % (key, _json(e["old"].get(key)), _json(e["new"][key]))
        for key in sorted(e["new"])
        if key != "argv" and e["old"].get(key) != e["new"][key]
    ]


def _drain_lines(drain: Optional[Mapping[str, Any]]) -> List[str]:
    if not drain:
        return []
    if not drain["reachable"]:
        return ["  drain: the running server did not answer /metrics, nothing to drain"]
    if not drain["metrics"]:
        return [
            "  drain: /metrics has no vllm:num_requests_running (--disable-log-stats?): in-flight requests unknown at the stop"
        ]
    stop = ", server exited %.1f s after SIGTERM" % drain["stop_s"] if drain.get("stop_s") is not None else ""
    return [
        "  %s in %.1f s: %s request(s) running and %s waiting at the stop (%s running at the start)%s"
        % (
            "drained" if drain["drained"] else "not drained",
            drain["drain_s"],
            drain["running"],
            drain["waiting"],
            drain["running_at_start"],
            stop,
        )
    ]


def _would_end_lines(e: Entry) -> List[str]:
    would_end = e.get("would_end") or []
    lines = []
    if would_end:
        servers = []
        for process in would_end:
            agent = (process.get("owner") or {}).get("agent")
            if agent and agent.get("pid") not in servers:
                servers.append(agent.get("pid"))
        lines.append(
            "  would end %d process(es) on its GPUs%s:"
            % (len(would_end), (", with their vLLM API server(s) " + _join(servers, ", ")) if servers else "")
        )
        lines += [
            "    PID %s %s (GPUs %s): %s" % (p["pid"], p["comm"], _join(p["gpus"]), cut_cmdline(p.get("cmdline")))
            for p in would_end
        ]
    elif e["action"] == "would redeploy":
        lines.append("  would end no process on its GPUs (none holds them now)")
    old = e["old"]
    if e["action"] == "would redeploy" and old and old.get("gpus") != e["new"]["gpus"]:
        lines.append(
            "  would also stop the running server on GPUs %s (its whole %s)"
            % (_join(old.get("gpus") or []), "unit" if old.get("service_manager") == "systemd" else "session")
        )
    return lines


def _replaced_lines(e: Entry) -> List[str]:
    """What became of the servers this role did not start that the instance replaces."""
    lines = []
    for server in e.get("replaced") or []:
        named = "the vLLM server PID %s on port %s that this role did not start" % (server["pid"], server["port"])
        named += " (still starting: not listening yet)" if server.get("starting") else ""
        verb = "stop" if server.get("starting") else "drain"
        if e["action"] == "would redeploy":
            lines.append("  would %s and replace %s: %s" % (verb, named, server["command"]))
            continue
        stop = server.get("stop") or {}
        if not stop.get("signalled"):
            lines.append(
                "  did not signal %s (%s): %s" % (named, "it had exited" if stop else "not reached", server["command"])
            )
            continue
        lines.append(
            "  %s and replaced %s: %s" % ("stopped" if server.get("starting") else "drained", named, server["command"])
        )
        drained = [] if server.get("starting") else ["  " + line for line in _drain_lines(server.get("drain"))]
        if not any("after SIGTERM" in line for line in drained):
            drained.append("    SIGTERM to its API server: its tree exited after %.1f s" % (stop.get("stop_s") or 0))
        lines += drained
        if stop.get("killed"):
            lines.append(
                "    SIGKILLed what was left of its tree after vllm_server_stop_timeout: %s"
                % ", ".join("%s %s" % (p["pid"], p["comm"]) for p in stop["killed"])
            )
        if stop.get("left"):
            lines.append(
                "    still running after SIGKILL: %s" % ", ".join("%s %s" % (p["pid"], p["comm"]) for p in stop["left"])
            )
    return lines


def restart_hint(server: Mapping[str, Any]) -> str:
    """How an operator starts again a replaced server the role cannot restart: its command line in its working
    directory, with its GPUs, its output appended to its log file (where that was a file), as one shell line."""
    log = str(server.get("log_file") or "")
    devices = server.get("cuda_visible_devices")
    words = ["cd %s &&" % shlex.quote(server["cwd"])] if server.get("cwd") else []
    words += ["CUDA_VISIBLE_DEVICES=%s" % shlex.quote(devices)] if devices else []
    words += ["nohup", server["command"]]
    words += [">> %s 2>&1" % shlex.quote(log)] if log.startswith("/") else []
    return " ".join(words + ["&"])


def not_restarted(e: Entry) -> List[str]:
    """For a FAILED entry: the servers this role did not start that it stopped, which no rollback starts again."""
    return [
        "the vLLM server PID %s that this role did not start was stopped for this instance and is not started again "
        "(the role has no configuration of it). It ran in %s with output to %s: %s. To start it again: %s"
        % (
            server["pid"],
            server.get("cwd") or "an unknown directory",
            server.get("log_file") or "an unknown file",
            server["command"],
            restart_hint(server),
        )
        for server in e.get("replaced") or []
        if (server.get("stop") or {}).get("signalled")
    ]


def _outcome_lines(e: Entry) -> List[str]:
    lines = []
    if e.get("leftovers"):
        lines.append(
            "  ended %d process(es) left on its GPUs: %s"
            % (len(e["leftovers"]), ", ".join("%s %s" % (p["pid"], p["comm"]) for p in e["leftovers"]))
        )
    if e.get("healthy_after_s") is not None and e.get("was_running", True):
        lines.append("  healthy %.1f s after start, down %.1f s in all" % (e["healthy_after_s"], e["down_s"]))
    elif e.get("healthy_after_s") is not None:
        lines.append(
            "  healthy %.1f s after start, %.1f s after its redeploy began (it was not running before)"
            % (e["healthy_after_s"], e["down_s"])
        )
    acceptance = e.get("acceptance")
    if acceptance:
        lines.append(
            "  acceptance rate %.1f%% (%s of %s draft tokens), mean acceptance length %.2f, %s tok/s over the warm-up"
            % (
                100 * acceptance["acceptance_rate"],
                acceptance["accepted_tokens"],
                acceptance["draft_tokens"],
                acceptance["mean_acceptance_length"],
                acceptance["tokens_per_s"],
            )
        )
    if "error" in e:
        lines += ["  failed at %s" % e["error"], "  %s" % e["rollback"]]
        lines += ["  %s" % line for line in not_restarted(e)]
        for what, log, when, tail in _logs(e):
            if tail:
                lines.append("  last lines %s wrote to %s%s:" % (what, log, when))
                lines += ["    %s" % line for line in tail]
    return lines


def _logs(e: Entry) -> List[Tuple[str, str, str, List[str]]]:
    """(who, log file, when, lines) of a FAILED entry: the new server's, then the previous configuration's where its
    start in the rollback failed."""
    logs = [("the new server", e["new"]["log_file"], "", e.get("log_tail") or [])]
    if e.get("rollback_failed"):
        log = (e["old"] or e["new"]).get("log_file") or e["new"]["log_file"]
        logs.append(("the previous configuration", log, " when started again", e.get("rollback_log_tail") or []))
    return logs


def summary_lines(report: Optional[Sequence[Entry]], names: Optional[Iterable[str]]) -> List[str]:
    """The host's summary: a line per instance, then what changed, the drain, what was ended, health and gates."""
    if not report:
        return ["no instance was deployed: the checks above failed before anything was stopped"]
    lines = []
    for e in report:
        reasons = (" (%s)" % ", ".join(e["reasons"])) if e["reasons"] else ""
        lines.append("%s (GPUs %s, %s): %s%s" % (e["name"], _join(e["gpus"]), e["url"], e["action"], reasons))
        lines += _change_lines(e) + _drain_lines(e.get("drain")) + _replaced_lines(e) + _would_end_lines(e)
        lines += _outcome_lines(e)
    reported = [e["name"] for e in report]
    left = [name for name in names or [] if name not in reported]
    if left:
        lines.append("not attempted after the failure above: %s" % ", ".join(left))
    return lines


def failures(report: Optional[Sequence[Entry]], host: str) -> str:
    """Why the host fails: a paragraph per FAILED instance, or "" when none failed."""
    texts = []
    for e in report or []:
        if e["action"] != "FAILED":
            continue
        before = e.get("before_stop")
        text = "vLLM instance %s on %s: %s %s -- %s." % (
            e["name"],
            host,
            "failed before anything was stopped, at" if before else "the new configuration failed at",
            e["error"],
            e["rollback"],
        )
        text += "".join(" %s%s." % (line[0].upper(), line[1:]) for line in not_restarted(e))
        after_lines = False  # a sentence after the lines of a log starts on a line of its own
        for what, log, when, tail in [] if before else _logs(e):
            text += "\n" if after_lines else " "
            if tail:
                text += "Last lines %s wrote to %s%s:\n%s" % (what, log, when, "\n".join(tail))
            else:
                text += "%s wrote nothing to %s." % (what[0].upper() + what[1:], log)
            after_lines = bool(tail)
        texts.append(text)
    return "\n".join(texts)
