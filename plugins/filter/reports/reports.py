# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a reset or a check came to, in words, on the controller: per host and for the whole play. Found as
gpuops.nvidia.reports.NAME: in a subdirectory of plugins/filter/ so that the per-host checks of the variables
(plugins/filter/inputs.py) do not import these, nor _report (docs/architecture.md, "Filters").

- reset_gpus_state: where one host's wait stands after gpu_kill and gpu_wait (the last slice, the seconds waited,
  whether gpu_wait is to go on waiting, whether gpu_kill's run finished the reset).
- reset_gpus_progress: the line of progress the role prints after gpu_kill's slice (gpu_wait prints its own).
- reset_gpus_result: one host's reset (the GPUs before and after, the outcome, the phase that failed, its sentence,
  the summary lines of _report.summary_lines, the same lines gpu_kill returns on the common path).
- reset_gpus_report: the JSON report of one host's reset (reset_gpus_report_dir).
- reset_gpus_fleet_summary: the lines playbooks/reset_gpus.yml prints once for every host.
- check_gpus_lines: the lines playbooks/check_gpus.yml prints once for every host, each starting with "check_gpus ".

Never prints None: unknown memory, names and GPUs are said in words.

Each filter imports the module_utils it uses when it is called: ansible runs each task in a new worker process, whose
collection loader compiles what it imports from source. reset_gpus_state, in the `when:` of the role's common path,
compiles nothing more where gpu_kill released the GPUs, and _wait alone where it did not
(plugins/filter/vllm_run/vllm_run.py says why that counts).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple, cast

if TYPE_CHECKING:
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._shapes import Waited


def _seconds(value: object) -> float:
    """`value` as seconds, 0.0 where it is no number (Jinja's float filter)."""
    try:
        return float(value)  # type: ignore[arg-type]  # anything: what float() refuses counts as 0
    except (TypeError, ValueError):
        return 0.0


def reset_gpus_state(
    kill: Optional[Mapping[str, Any]],
    wait: Optional[Mapping[str, Any]],
    timeout: object,
    destinations: object = False,
    gpu_reset: object = False,
    reset_check: Optional[Mapping[str, Any]] = None,
    gpu_reset_result: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """Filter: where one host's wait stands, from gpu_kill's registered result `kill`, gpu_wait's registered result
    `wait` ({} or one without "released" when it did not run), reset_gpus_timeout (seconds), whether a textfile or a
    report is asked for (`destinations`), whether the guarded GPU reset is on (`gpu_reset`, reset_gpus_gpu_reset), the
    registered result of the look after the GPU reset (`reset_check`, tasks/gpu_reset.yml) and gpu_reset's own
    (`gpu_reset_result`; each {} where it did not run).

    Returns {"last_wait": the last look (the one after the GPU reset, else gpu_wait's last slice, else gpu_kill's own
    wait with its "released" and "after"; {} when none ran), "total": the seconds waited (gpu_kill's slice, all of
    gpu_wait's and the look after the GPU reset), "first_slice": gpu_kill's own slice, "left_s": the seconds left of
    the timeout after it (gpu_wait's timeout, and what the line of progress says), "more": whether gpu_wait is to go on
    waiting after it (_wait.worth_another_slice), "finished": whether gpu_kill's run finished the reset (released
    within its first slice, no textfile or report to write, no GPU reset to try)}. "more" and "left_s" come from
    gpu_kill's slice alone: the tasks before gpu_wait read them, while `wait` may be an earlier run's of the role.
    """
    kill = kill or {}
    own: Dict[str, Any] = {}
    if "released" in kill:
        own = dict(kill.get("wait") or {}, released=kill["released"], after=kill.get("after"))
    own_s = _seconds(own.get("elapsed_s"))
    more = False
    if "released" in own and not own["released"]:
        # Only a slice that ended with the GPUs still held may call for another. _wait is imported for it alone: the
        # role's common path asks this filter in the `when` of skipped tasks, and each worker compiles what it imports.
        from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _wait

        more = _wait.worth_another_slice(own, own_s, _seconds(timeout))
    ran = wait is not None and "released" in wait
    last = dict(wait) if wait is not None and ran else own
    # gpu_wait's elapsed_s sums its own slices (its action plugin).
    total = own_s + (_seconds(last.get("elapsed_s")) if ran else 0.0)
    if _looked_after_reset(kill, reset_check or {}, gpu_reset_result or {}):
        last = dict(reset_check or {})
        total += _seconds(last.get("elapsed_s"))
    return {
        "last_wait": last,
        "total": total,
        "first_slice": own,
        # gpu_wait's timeout after gpu_kill's slice, in whole milliseconds, never above the time left.
        "left_s": max(0.0, math.floor((_seconds(timeout) - own_s) * 1000) / 1000),
        "more": more,
        "finished": bool(kill.get("released")) and not destinations and not gpu_reset,
    }


def _looked_after_reset(kill: Mapping[str, Any], check: Mapping[str, Any], gpu_reset: Mapping[str, Any]) -> bool:
    """Whether `check` is this run's look after its GPU reset: tasks/gpu_reset.yml looks after a GPU reset that ran and
    did not fail, which only a kill that did not fail leads to. Else a look an earlier run of the role registered on
    this host would be taken for this run's."""
    ran = bool(gpu_reset) and not gpu_reset.get("skipped") and not gpu_reset.get("failed")
    return ran and "released" in check and not kill.get("failed")


def reset_gpus_progress(state: Mapping[str, Any], timeout: object) -> str:
    """Filter: the line of progress after gpu_kill's slice (_report.first_progress_line), from reset_gpus_state's
    `state` and reset_gpus_timeout: the seconds waited so far, for each GPU still held its used memory (MiB) and who
    holds it, and how long gpu_wait may wait for the rest (its own lines count within that rest)."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _report

    first = state.get("first_slice") or {}
    return _report.first_progress_line(
        first.get("gpus"), _seconds(first.get("elapsed_s")), timeout, _seconds(state.get("left_s"))
    )


def _failed(kill: Optional[Mapping[str, Any]]) -> bool:
    # A kill that did not run (no result) counts as failed: "gpu_kill did not run".
    return not kill or bool(kill.get("failed"))


def reset_gpus_result(
    kill: Optional[Mapping[str, Any]],
    wait: Optional[Mapping[str, Any]],
    facts: Optional[Mapping[str, Any]],
    check_mode: bool,
    waited_s: float,
    waited_more: bool,
    refusal: Optional[str] = None,
    gpu_reset: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """Filter: one host's reset, from gpu_kill's registered result `kill`, the last look of the wait `wait` (gpu_kill's
    own, gpu_wait's or the one after the GPU reset, {} when none ran), gpu_facts' registered result `facts` ({} when
    not run, or failed), check mode, the seconds waited in all slices, whether gpu_wait ran slices after gpu_kill's,
    the role's refusal of its variables (the plan's "refusal": None where none) and gpu_reset's registered result
    (`gpu_reset`, tasks/gpu_reset.yml; {} where it did not run).

    Returns {"before", "after"} (the GPUs in the shape of the nvidia facts: after as the wait last saw them, else as
    gpu_facts read them, else as gpu_kill found them; before as gpu_kill found them, else as after; None where nothing
    read them), "memory_checked", "outcome" (check, failed, released, no_holders), "phase" (where it failed: preflight,
    the variables refused; stop, gpu_kill failed; free, not released in time; gpu_reset, released but the GPU reset
    failed; None),
    "message" (_report.outcome, and what the GPU reset did) and "summary" (lines). A failure in check mode is "failed"
    too. A kill refused before it selected anything (no "gpus") is summarized by its message alone.
    """
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _report

    kill = dict(kill or {})
    # After a kill that failed no GPU reset ran: a result of one would be an earlier run's. A kill that did not run (its
    # tag not asked for) counts as failed below, but the GPU reset may have run.
    gpu_reset = gpu_reset if gpu_reset and not gpu_reset.get("skipped") and not kill.get("failed") else {}
    failed = _failed(kill)
    kill["failed"] = failed
    wait = wait or {}
    after = wait.get("after") or (facts or {}).get("ansible_facts", {}).get("nvidia") or kill.get("before")
    before = kill.get("before") or after
    memory_checked = _memory_read(after, wait, kill.get("gpus"))
    phase = _failed_phase(refusal, failed, check_mode, wait) or ("gpu_reset" if gpu_reset.get("failed") else None)
    if refusal:
        message = "FAILED%s: %s" % (" (check mode)" if check_mode else "", refusal)
    else:
        read = dict(wait, memory_checked=memory_checked, driver=(after or {}).get("driver"))
        message = _with_gpu_reset(_report.outcome(kill, read, check_mode, waited_s), gpu_reset, check_mode)
    outcome = "failed" if phase else "check" if check_mode else "released" if memory_checked else "no_holders"
    if kill.get("summary") and not waited_more and not gpu_reset:
        lines = list(kill["summary"])
    elif before and after and "gpus" in kill:
        kill.setdefault("left_alone", kill.get("protected", []))
        lines = _report.summary_lines(kill, before, after, check_mode, message)
    else:
        lines = [message]
    return {
        "before": before,
        "after": after,
        "memory_checked": memory_checked,
        "outcome": outcome,
        "phase": phase,
        "message": message,
        "summary": lines,
    }


def _reset_gpus(gpu_reset: Mapping[str, Any]) -> List[int]:
    """The GPUs gpu_reset's registered result reset (or in check mode would reset); [] where it reset none."""
    return list(gpu_reset.get("gpus") or ()) if gpu_reset.get("changed") and not gpu_reset.get("failed") else []


def _with_gpu_reset(message: str, gpu_reset: Mapping[str, Any], check_mode: bool) -> str:
    """The outcome `message` with what the guarded GPU reset did: its failure (FAILED, with gpu_reset's words and next
    step), or the GPUs it reset; `message` as it is where it did not run or reset nothing."""
    if gpu_reset.get("failed"):
        words = gpu_reset.get("msg") or "the GPU reset failed"
        if check_mode:
            return "FAILED (check mode): %s (%s)" % (words, message)
        if message.startswith("FAILED"):
            return "%s; %s" % (message, words)
        return "FAILED: %s (%s)" % (words, message)
    done = _reset_gpus(gpu_reset)
    if not done:
        return message
    verb = "would be reset" if check_mode else "was reset" if len(done) == 1 else "were reset"
    return "%s; GPU %s %s (reset_gpus_gpu_reset)" % (message, ", ".join(str(index) for index in done), verb)


def _failed_phase(refusal: Optional[str], failed: bool, check_mode: bool, wait: Mapping[str, Any]) -> Optional[str]:
    """The role's phase that failed (its tags): preflight, stop or free; None where none did."""
    if refusal:
        return "preflight"
    if failed:
        return "stop"
    if not check_mode and not wait.get("released"):
        return "free"
    return None


# gpu_kill's results that the report carries as they are, with their value where gpu_kill did not return them.
REPORT_LISTS: Tuple[Tuple[str, Any], ...] = tuple(
    (key, []) for key in ("would_signal", "signalled", "survived", "protected", "not_signalled", "respawned")
) + (("stopped_units", []), ("stopped_containers", []), ("owner_commands", []), ("mig_instances", {}))


def reset_gpus_report(
    result: Mapping[str, Any], kill: Optional[Mapping[str, Any]], state: Mapping[str, Any], host: str, check_mode: bool
) -> Dict[str, Any]:
    """Filter: the JSON report of one reset_gpus run on one host (reset_gpus_report_dir), from reset_gpus_result's
    `result`, gpu_kill's registered result `kill`, reset_gpus_state's `state`, the inventory hostname and check mode.

    Times: UTC, ISO 8601 with +00:00; message and wait_seconds count the same whole wait. Each holder in would_signal,
    signalled, not_signalled and respawned carries its owner block and gpu_kill's owner_note, owner_command and
    owner_label; stopped_units are the units stop_owners stopped, stopped_containers the docker and podman containers
    it stopped (id, runtime, command), owner_commands the commands that stop the other containers and pods (not run).
    mig_instances: the MIG instances the run selected by MIG UUID ({"<GPU index>": [MIG UUID, ...]}, {} for whole
    GPUs); per-instance figures are in gpus_before/gpus_after[].mig_devices.

    A failed run names its phase ("phase": preflight, stop, free or gpu_reset) and says why in "message". What was not
    read is left out, never null: kill_seconds (gpu_kill did not run), wait_seconds (no wait ran), driver, gpus_before
    and gpus_after (nothing read the GPUs: the variables refused, the host's Python without the NVIDIA library).
    """
    import datetime

    kill = kill or {}
    report: Dict[str, Any] = {
        "host": host,
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00"),
        "check_mode": bool(check_mode),
        "outcome": result["outcome"],
    }
    if result.get("phase"):
        report["phase"] = result["phase"]
    report.update(message=result["message"], memory_checked=result["memory_checked"])
    if kill.get("elapsed_s") is not None:
        report["kill_seconds"] = kill["elapsed_s"]
    if (state.get("last_wait") or {}).get("elapsed_s") is not None:
        report["wait_seconds"] = _seconds(state.get("total"))
    if (result.get("after") or {}).get("driver"):
        report["driver"] = result["after"]["driver"]
    for key, empty in REPORT_LISTS:
        report[key] = kill.get(key) or empty
    for key, facts in (("gpus_before", result.get("before")), ("gpus_after", result.get("after"))):
        if facts and facts.get("gpus") is not None:
            report[key] = facts["gpus"]
    return report


def _memory_read(after: Optional[Mapping[str, Any]], wait: Mapping[str, Any], selected: Optional[List[int]]) -> bool:
    """Whether the used memory of the selected GPUs (`selected`: indices, None for all) was read: the driver library
    answered, the wait (where one ran) read it, and the driver reports memory for each of them (a GB10 does not)."""
    if not ((after or {}).get("driver") or {}).get("available") or wait.get("memory_checked") is False:
        return False
    return not any(
        gpu.get("memory_supported") is False
        for gpu in (after or {}).get("gpus") or ()
        if selected is None or gpu.get("index") in selected
    )


def _var(hostvars: Mapping[str, Any], host: str, name: str, default: Any = None) -> Any:
    try:
        value = hostvars[host].get(name, default)
    except KeyError:
        return default
    return default if value is None else value


def _printed(hostvars: Mapping[str, Any], host: str, play_hosts: List[str]) -> bool:
    """Whether the role printed a host's summary: it printed that of every host it got to after gpu_kill, failed ones
    too (tasks/finish.yml), but not of a host that could not be reached (Ansible runs no more of its tasks)."""
    kill = _var(hostvars, host, "reset_gpus_kill", None)
    if host in play_hosts:
        return True
    return kill is not None and bool(kill) and not kill.get("unreachable") and not kill.get("skipped")


def reset_gpus_fleet_summary(
    hostvars: Mapping[str, Any], play_hosts: List[str], all_hosts: List[str], check_mode: bool
) -> List[str]:
    """Filter: the closing lines of playbooks/reset_gpus.yml. First, prefixed with the host's name, the summary lines
    of each host whose gpu_kill run finished the reset (released in its first slice, no report or textfile, no GPU
    reset to try: the role printed nothing for it); then one line that sums up the play: hosts ok, failed or
    unreachable, on which holders were (or would be) ended, on which GPUs were (or would be) reset, on which the used
    memory was not read, on which (check mode) ending the holders would not free the GPUs (gpu_kill's would_stay), and
    whose summary the role printed above."""
    from ansible.module_utils.parsing.convert_bool import boolean

    lines: List[str] = []
    done: List[str] = []
    ended: List[str] = []
    reset: List[str] = []
    unread: List[str] = []
    stay: List[str] = []
    for host in all_hosts:
        kill = _var(hostvars, host, "reset_gpus_kill", {})
        if kill.get("changed"):
            ended.append(host)
        if kill.get("would_stay"):
            stay.append(host)
        if _reset_gpus(_var(hostvars, host, "_reset_gpus_gpu_reset", {})):
            reset.append(host)
        # Ok without the driver library (or where it reports no memory): no holder is left, the memory was not read.
        if host in play_hosts and (kill.get("wait") or {}).get("memory_checked") is False:
            unread.append(host)
        own = _var(hostvars, host, "reset_gpus_textfile", "") or _var(hostvars, host, "reset_gpus_report_dir", "")
        own = own or boolean(_var(hostvars, host, "reset_gpus_gpu_reset", False), strict=False)
        if host in play_hosts and kill.get("released") and not own:
            done.append(host)
            lines.extend("%s: %s" % (host, line) for line in kill.get("summary", []))
    failed = [host for host in all_hosts if host not in play_hosts]
    above = [host for host in all_hosts if host not in done and _printed(hostvars, host, play_hosts)]
    verb = "would be ended" if check_mode else "ended"
    lines.append(
        "reset_gpus summary%s: %d host(s): %d ok%s; %s%s%s%s%s"
        % (
            " (check mode: nothing was signalled)" if check_mode else "",
            len(all_hosts),
            len(play_hosts),
            ", %d failed or unreachable (%s)" % (len(failed), ", ".join(failed)) if failed else "",
            "holders %s on %d (%s)" % (verb, len(ended), ", ".join(ended)) if ended else "no holder %s" % verb,
            "; GPUs %s on %d (%s)" % ("would be reset" if check_mode else "reset", len(reset), ", ".join(reset))
            if reset
            else "",
            "; used memory not read on %d (%s)" % (len(unread), ", ".join(unread)) if unread else "",
            "; GPUs that ending the holders would not free on %d (%s)" % (len(stay), ", ".join(stay)) if stay else "",
            "; %s printed above (%s)"
            % ("1 host's summary" if len(above) == 1 else "%d hosts' summaries" % len(above), ", ".join(above))
            if above
            else "",
        )
    )
    return lines


# check_gpus' statuses, in the order of its summary line, with their words there.
CHECK_LABELS = (
    ("free", "free"),
    ("free_left_out", "free but for what was left out"),
    ("no_holders", "without holders, memory not read"),
    ("not_free", "not free"),
    ("not_checked", "not checked"),
    ("failed", "failed to check"),
)


def _left_out(result: Mapping[str, Any]) -> Tuple[str, int]:
    """The left-alone holders that hold memory, per GPU, in words, and their MiB in all; ("", 0) when none:
    "GPU 0: 60000 MiB held by PID 7 vllm (excluded by name)"; each holder's own MiB where several share a GPU."""
    parts: List[str] = []
    total = 0
    for gpu in result.get("gpus", []):
        mib = gpu.get("left_alone_mib") or 0
        if mib <= 0:
            continue
        total += mib
        holders = gpu.get("left_alone", [])
        held = ", ".join(
            "PID %s %s (%s%s)"
            % (
                h["pid"],
                h["comm"],
                h["reason"],
                ", %s MiB" % h["memory_mib"] if h.get("memory_mib") and len(holders) > 1 else "",
            )
            for h in holders
        )
        index = "?" if gpu.get("index") is None else gpu["index"]
        parts.append("GPU %s: %d MiB held by %s" % (index, mib, held or "no process named"))
    return "; ".join(parts), total


def _bound(result: Mapping[str, Any], max_used_mib: int) -> Tuple[int, str]:
    """(MiB, words) of the used memory that a free GPU of `result` was held to: (256, "") where NVML memory info v2
    reports it; where only v1 answers, whose used memory includes reserved memory, the threshold plus the reserved
    allowance and words that say so."""
    allowance = max([gpu.get("reserved_allowance_mib") or 0 for gpu in result.get("gpus", [])] or [0])
    if not allowance:
        return max_used_mib, ""
    return max_used_mib + allowance, (
        ", reserved memory included (NVML memory info v1 cannot tell it apart: %s MiB and up to %s MiB of reserved "
        "memory)" % (max_used_mib, allowance)
    )


def check_gpus_status(
    result: Mapping[str, Any],
    allow_proc_only: bool,
    max_used_mib: int,
    host: str = "HOST",
    options: Optional[Mapping[str, Any]] = None,
) -> Tuple[str, str]:
    """(status, words) of one host's gpu_wait result: free, free_left_out (free once the memory of left-alone holders,
    check_gpus_exclude's or the protected daemons', is left out: that memory and its holders come first), no_holders
    (memory not read: no driver library, or memory the driver does not report; accepted by check_gpus_allow_proc_only),
    not_free (not_free_words), not_checked (memory not read or the driver did not answer), failed (the check itself
    failed or did not run). Used memory is named as it was measured (_bound). `host`: the inventory hostname;
    `options`: gpu_wait's options (the check's selection, which the next step's reset keeps)."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _advice

    if "gpus" not in result:
        return "failed", "check failed: %s" % (result.get("msg") or "gpu_wait returned no result")
    if (result.get("driver") or {}).get("timed_out"):
        return "not_checked", "not checked: %s" % result.get("msg", "")
    if result.get("advice"):
        from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._recovery import advice_words

        held = "%s; " % not_free_words(result, host, options or {}) if not result.get("released") else ""
        return "not_free", "not free: %s%s" % (held, advice_words(result["advice"], host))
    if not result.get("released"):
        return "not_free", "not free: %s" % not_free_words(result, host, options or {})
    unread = [gpu for gpu in result["gpus"] if not gpu.get("memory_checked", True)]
    if not unread:
        words, mib = _left_out(result)
        if mib:
            return "free_left_out", (
                "GPUs free (%d checked) but for what was left out: %s; no other holder, the rest of each GPU's used "
                "memory at most %s MiB%s" % ((len(result["gpus"]), words) + _bound(result, max_used_mib))
            )
        return "free", "GPUs free (%d checked): no holder, used memory at most %s MiB each%s" % (
            (len(result["gpus"]),) + _bound(result, max_used_mib)
        )
    # gpu_wait's result, as _advice words it (a _shapes.Waited).
    not_read = _advice.describe_unread(cast("Waited", result))
    if allow_proc_only:
        return "no_holders", "%s; accepted by check_gpus_allow_proc_only" % not_read
    return "not_checked", "not checked: %s; set check_gpus_allow_proc_only=true to accept a check without memory" % (
        not_read
    )


def not_free_words(result: Mapping[str, Any], host: str, options: Mapping[str, Any]) -> str:
    """What holds each GPU that is not free, and one next step for those that a reset frees, on one line: "GPU 0:
    75034 MiB used, held by PID 6 VLLM::Worker_TP (state S); next, to end them: ansible-playbook gpuops.nvidia.reset_gpus
    -l gpu07" (it ends them whatever they serve, a live server too).
    A GPU that a reset does not free (NVML errors, a holder in D, memory no process here explains) keeps its own next
    step (_advice.next_step); a parent that starts the holders again is named where it is torchrun, a Ray raylet or
    supervisord (_advice.restarters)."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _advice, _wait

    stuck = [gpu for gpu in result["gpus"] if not gpu.get("released") and gpu.get("next_step")]
    if not stuck:  # a result without per-GPU steps: its own message
        return re.sub(r"^not (free|released after [0-9.]+ s): ", "", result.get("msg", ""))
    reset = [gpu for gpu in stuck if _advice.ended_by_a_reset(gpu)]
    words = "; ".join(_advice.describe(gpu, with_step=gpu not in reset) for gpu in stuck)
    if reset:
        indices = [str(gpu["index"]) for gpu in reset if gpu.get("index") is not None]
        which = " for GPU %s" % ", ".join(indices) if indices and len(reset) < len(stuck) else ""
        words += "; next%s, to end them: %s%s" % (
            which,
            reset_command(host, options),
            _advice.restarters(holder for gpu in reset for holder in gpu["holders"]),
        )
    return words + _wait.left_alone_words(result.get("left_alone") or ())


def reset_command(host: str, options: Mapping[str, Any]) -> str:
    """The command that ends the holders of `host`'s GPUs that check_gpus found held, with the check's own selection
    (check_gpus_gpus, check_gpus_exclude) as the reset's variables. On the host itself (the check run with
    `-i localhost, -c local`, docs/schedulers.md) the same inventory: reset_gpus refuses the implicit localhost."""
    import json
    import shlex

    extra = {"reset_gpus_gpus": options.get("gpus"), "reset_gpus_exclude": options.get("exclude")}
    extra = {name: value for name, value in extra.items() if value}
    command = "ansible-playbook gpuops.nvidia.reset_gpus -l %s" % shlex.quote(host)
    if host == "localhost":
        command = "ansible-playbook -i localhost, -c local gpuops.nvidia.reset_gpus"
    return command + (" -e %s" % shlex.quote(json.dumps(extra)) if extra else "")


def check_gpus_lines(
    hostvars: Mapping[str, Any], all_hosts: List[str], options: Optional[Mapping[str, Any]]
) -> List[str]:
    """Filter: the closing lines of playbooks/check_gpus.yml: "check_gpus HOST: words" per host, then
    "check_gpus summary: N host(s): ..." with the hosts of each status but free. `options`: gpu_wait's options from
    check_gpus_plan (the threshold, require_memory)."""
    options = options or {}
    allow = not options.get("require_memory", True)
    threshold = options.get("max_used_mib", 256)
    found = []
    for host in all_hosts:
        result = _var(hostvars, host, "check_gpus_result", None) or {
            "msg": "no result: unreachable, or failed before the check"
        }
        found.append((host,) + check_gpus_status(result, allow, threshold, host, options))
    parts = []
    for status, label in CHECK_LABELS:
        names = [host for host, got, _words in found if got == status]
        if names:
            parts.append("%d %s%s" % (len(names), label, "" if status == "free" else " (%s)" % ", ".join(names)))
    return ["check_gpus %s: %s" % (host, words) for host, _status, words in found] + [
        "check_gpus summary: %d host(s): %s" % (len(found), ", ".join(parts))
    ]


class FilterModule(object):
    """Reports of reset_gpus and check_gpus."""

    def filters(self) -> Dict[str, Callable[..., Any]]:
        return {
            "reset_gpus_state": reset_gpus_state,
            "reset_gpus_progress": reset_gpus_progress,
            "reset_gpus_result": reset_gpus_result,
            "reset_gpus_report": reset_gpus_report,
            "reset_gpus_fleet_summary": reset_gpus_fleet_summary,
            "check_gpus_lines": check_gpus_lines,
        }
