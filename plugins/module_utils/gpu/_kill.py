# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run of gpu_kill: check the options, look, select, stop owners, end the targets, wait, and say so.

The module gives its parameters and a few callables of AnsibleModule (run_command, get_bin_path); `run`
returns an Outcome: the result dict, whether the run failed, and the warnings. Nothing here calls
exit_json or fail_json. The parts are the other module_utils: _select chooses the targets, _terminate
ends them, _wait and _release wait for the release, _report and _owners word the result.
"""

from __future__ import annotations

import time

from ansible_collections.gpuops.nvidia.plugins.module_utils import _options
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import (
    _gpus,
    _owners,
    _release,
    _report,
    _select,
    _stop_owners,
    _terminate,
    _wait,
)


class Outcome:
    """What gpu_kill returns: `result` (the module's result dict, with "msg"), `failed` and `warnings`."""

    def __init__(self, result, failed=False, warnings=()):
        self.result = result
        self.failed = failed
        self.warnings = list(warnings)


def refused(msg, **result):
    """The Outcome of input refused before anything was signalled."""
    return Outcome(dict(result, changed=False, msg="nothing was signalled: %s" % msg), failed=True)


def run(params, given=None, check_mode=False, run_command=None, which=None):
    """gpu_kill with `params` (the module's validated options) and `given` (its arguments as passed, for
    null selection options). `run_command(argv)` -> (rc, out, err) and `which(name)` -> path run systemctl
    for stop_owners. A real run holds the host's lock (_terminate.HostLock) from its first look to its last."""
    started = time.monotonic()
    try:
        _options.check_numbers(
            positive=("driver_timeout",),
            at_most=_options.MAX_SECONDS,
            grace_period=params["grace_period"],
            kill_wait=params["kill_wait"],
            driver_timeout=params["driver_timeout"],
            wait_timeout=params["wait_timeout"],
            max_used_mib=params["max_used_mib"],
            poll_interval=params["poll_interval"],
            lock_timeout=params["lock_timeout"],
        )
        sig = _terminate.parse_signal(params["signal"])
        checked = _select.check_options(params, given)
    except ValueError as exc:  # OptionError, SelectionError and unknown signals
        return refused(str(exc))
    lock = _terminate.HostLock()
    try:
        waited, lock_warnings = take_lock(lock, params["lock_timeout"], check_mode)
        outcome = look_and_end(params, checked, sig, check_mode, run_command, which, started)
    except _terminate.LockTimeout as exc:
        return refused(str(exc))
    finally:
        lock.release()
    outcome.result["lock_waited_s"] = waited
    outcome.warnings[:0] = lock_warnings
    if waited:
        outcome.result["msg"] = "%s; %s" % (lock_warnings[0], outcome.result["msg"])
    return outcome


def take_lock(lock, timeout, check_mode):
    """(seconds waited for another gpu_kill run on this host, warnings). Check mode signals nothing and takes no
    lock: it says when another run is ending processes now. Raises LockTimeout after `timeout` seconds."""
    if check_mode:
        busy = lock.holders()
        return 0.0, [
            "another gpu_kill run on this host (%s) is ending processes now: what this check reports may change"
            % ", ".join("PID %s" % h["pid"] for h in busy)
        ] if busy else []
    try:
        waited = lock.acquire(timeout)
    except OSError as exc:
        return 0.0, [
            "the host's lock for gpu_kill could not be taken (%s): a gpu_kill run at the same time would signal the "
            "same processes" % exc
        ]
    return waited, [_terminate.waited_words(waited, lock.waited_for)] if waited else []


def look_and_end(params, checked, sig, check_mode, run_command, which, started):
    """Look, select, plan stop_owners, stop units and end the targets, wait; the Outcome."""
    inspector = _gpus.Inspector(driver_timeout=params["driver_timeout"])
    try:
        snapshot = inspector.snapshot(scope="listed", owners=True, tolerance_mib=params["max_used_mib"])
        try:
            selection = _select.Selection.from_params(params, snapshot, checked)
        except _select.SelectionError as exc:
            return refused(str(exc), driver=snapshot["driver"])
        warnings = driver_warnings(snapshot["driver"], params["driver_timeout"])
        result, targets = start_result(selection, snapshot)
        stop = _stop_owners.plan(targets, snapshot, selection) if params["stop_owners"] else None
        result["owners_beyond_selection"] = stop["beyond"] if stop else []
        result["unit_processes"] = stop["unit_processes"] if stop else {}
        why = _stop_owners.refusal(stop["beyond"], params["stop_spanning_owners"]) if stop else None
        if why:
            return refused(why, **result)
        if check_mode:
            result["would_signal"] = targets
            result["would_stop_units"] = stop["units"] if stop else []
            result["changed"] = bool(targets)
        else:
            if stop:
                result["owner_commands"] = _stop_owners.owner_commands(targets)
                failure = _stop_owners.stop_units(stop["units"], result, run_command, which)
                if failure:
                    return Outcome(dict(result, msg=failure), failed=True, warnings=warnings)
            end(inspector, selection, targets, sig, params, result)
        result["elapsed_s"] = round(time.monotonic() - started, 3)
        if params["wait"] and not check_mode and not result["survived"]:
            ended = result["signalled"] or result["stopped_units"]
            wait(inspector, selection, None if ended else snapshot, params, result)
        failure = would_fail(selection, snapshot, params) if params["wait"] and check_mode else None
    finally:
        inspector.close()
    return finish(result, failure, check_mode, params["wait"], warnings)


def driver_warnings(driver, driver_timeout):
    """Warnings for a driver that did not answer or a library that is not usable."""
    if driver["timed_out"]:
        return [
            "NVML did not answer within driver_timeout (%s s): the driver may be hung (look for Xid errors in the "
            "kernel log); GPU memory is unknown, so holders are the CUDA processes holding device files, from the "
            "/proc scan alone" % driver_timeout
        ]
    if not driver["available"]:
        return [
            "NVIDIA driver library not usable (%s): GPU memory is unknown, so holders are the CUDA processes "
            "holding device files, from the /proc scan alone" % driver["error"]
        ]
    return []


def start_result(selection, snapshot):
    """(the result before anything is done, the targets annotated with their owners' words)."""
    split = selection.split(snapshot)
    return dict(
        changed=False,
        gpus=None if selection.indices is None else list(selection.indices),
        mig_instances={str(i): sorted(uuids) for i, uuids in sorted(selection.instances.items())},
        driver=snapshot["driver"],
        would_signal=[],
        would_stop_units=[],
        signalled=[],
        exited=[],
        survived=[],
        not_signalled=[],
        respawned=[],
        left_alone=split["left_alone"],
        protected=split["protected"],
        not_holding=split["not_holding"],
        foreign=foreign(snapshot, selection),
        before=snapshot,
        stopped_units=[],
        owner_commands=[],
        unit_processes={},
        lock_waited_s=0.0,
    ), [_report.annotate(dict(target)) for target in split["targets"]]


def end(inspector, selection, targets, sig, params, result):
    """End the targets, three rounds at most (processes may appear while others die)."""

    def choose(_first):
        return [
            _report.annotate(t)
            for t in selection.split(
                inspector.snapshot(
                    scope="listed", indices=selection.indices, owners=True, tolerance_mib=params["max_used_mib"]
                )
            )["targets"]
        ]

    outcome = _terminate.end_until_gone(choose, targets, sig, params["grace_period"], params["kill_wait"])
    result.update(outcome)
    result["changed"] = result["changed"] or bool(outcome["signalled"])


def would_fail(selection, snapshot, params):
    """Check mode with wait=true: why the wait would fail whatever the run ended, in the words of the wait's own failure
    (selected GPUs that the driver answers with an error, such as a GPU that fell off the bus, or a driver that did not
    answer); None where ending the targets may free the GPUs (check mode cannot tell how their memory would go)."""
    status = [dict(gpu, holders=[]) for gpu in _release.gpu_status(selection, snapshot, params["max_used_mib"])]
    stuck = [gpu for gpu in status if gpu["error"] or snapshot["driver"]["timed_out"]]
    if not stuck:
        return None
    return _wait.conclude(
        {"gpus": stuck, "driver": snapshot["driver"], "released": False, "elapsed_s": 0.0},
        params["driver_timeout"],
        single_look=True,
    )


def wait(inspector, selection, first, params, result):
    """wait=true: wait for the release as gpu_wait does (`first`: the snapshot just taken when nothing was ended),
    and add "released", "wait_timed_out", "wait" ({"elapsed_s", "polls", "msg", "gpus" with next steps,
    "memory_checked", "driver"}) and "after"."""
    waited = _wait.wait_released(
        inspector, selection, params["wait_timeout"], params["max_used_mib"], params["poll_interval"], first=first
    )
    waited["msg"] = _wait.conclude(waited, params["driver_timeout"])
    result["after"] = waited.pop("snapshot")
    result["released"] = waited["released"]
    result["wait_timed_out"] = not waited["released"]
    result["wait"] = {key: waited[key] for key in ("elapsed_s", "polls", "msg", "gpus", "memory_checked", "driver")}


def foreign(snapshot, selection):
    """Foreign entries of the selected GPUs; where MIG instances are selected, of those instances only."""
    found = []
    for gpu in snapshot["gpus"]:
        if selection.indices is not None and gpu["index"] not in selection.indices:
            continue
        wanted = selection.instances.get(gpu["index"])
        if wanted is None:
            found.extend(dict(item, gpu=gpu["index"]) for item in gpu["foreign"])
            continue
        for device in gpu.get("mig_devices") or ():
            if device["uuid"] in wanted:
                found.extend(dict(item, gpu=gpu["index"], mig_uuid=device["uuid"]) for item in device["foreign"])
    return found


def finish(result, failure, check_mode, waited, warnings):
    """The Outcome: failed when a process survived SIGKILL, (wait=true) the GPUs were not released in time, or
    (check mode, wait=true) `failure` says why the wait would fail whatever was ended; with wait=true the result
    carries the summary lines of the reset_gpus role."""
    if result["survived"]:
        result["msg"] = "%d selected process(es) survived SIGKILL: %s" % (
            len(result["survived"]),
            "; ".join("PID %s (%s): %s" % (s["pid"], s["comm"], s["reason"]) for s in result["survived"]),
        )
        return Outcome(result, failed=True, warnings=warnings)
    result["msg"] = message(result, check_mode)
    if failure:
        result["msg"] += "; a real run would fail whatever it ended: %s" % failure
    warnings = warnings + owner_warnings(result, check_mode)
    failed = bool(failure)
    if waited:
        wait_report = dict(result.get("wait", {"elapsed_s": 0.0}), released=result.get("released"))
        outcome = _report.outcome(dict(result, failed=failed), wait_report, check_mode, wait_report["elapsed_s"])
        result["summary"] = _report.summary_lines(
            result, result["before"], result.get("after", result["before"]), check_mode, outcome
        )
        if result.get("wait_timed_out"):
            result["msg"] = "%s; %s" % (result["msg"], wait_report["msg"])
            failed = True
    return Outcome(result, failed=failed, warnings=warnings)


def _names(processes):
    return ", ".join("%s (%s)" % (p["pid"], p["comm"]) for p in processes)


def message(result, check_mode):
    """What was done (or would be) and what was left, in one line."""
    if check_mode:
        msg = "would signal %d process(es)%s" % (
            len(result["would_signal"]),
            ": " + _names(result["would_signal"]) if result["would_signal"] else "",
        )
        msg += "".join("; " + line.strip() for line in _stop_owners.unit_lines(result, check_mode))
    else:
        msg = "signalled %d process(es), %d exited" % (len(result["signalled"]), len(result["exited"]))
    if result["driver"]["timed_out"]:
        msg += "; NVML did not answer within driver_timeout (the driver may be hung): holders from the /proc scan alone"
    if result["left_alone"]:
        msg += "; left alone: %s" % "; ".join(
            "PID %s (%s): %s" % (h["pid"], h["comm"], h["reason"]) for h in result["left_alone"]
        )
    if result["not_holding"]:
        msg += "; PID(s) %s from pids hold none of the selected GPUs (or do not exist): nothing to do for them" % (
            ", ".join(str(pid) for pid in result["not_holding"])
        )
    for item in result["foreign"]:
        msg += "; the driver lists PID %s (%s) on GPU %s, which no process here holds (a container?): not signalled" % (
            item["pid"],
            "memory not reported" if item["used_mib"] is None else "%s MiB" % item["used_mib"],
            item["gpu"],
        )
    if not check_mode:
        msg += "".join("; " + line.strip() for line in _stop_owners.unit_lines(result, check_mode))
    msg += "".join("; " + line.strip() for line in _stop_owners.beyond_lines(result, check_mode))
    if result.get("released"):
        msg += "; %s" % result["wait"]["msg"]
    return msg


def owner_warnings(result, check_mode):
    """A warning for each holder whose owner will start it again, and for each respawn seen."""
    warnings = []
    stopped = {"systemctl stop %s" % unit for unit in result["stopped_units"]}
    for process in result["would_signal"] if check_mode else result["signalled"]:
        command = _owners.stop_command(process.get("owner"))
        if process.get("owner_note") and command not in stopped:
            warnings.append(
                "PID %s (%s): %s; ending the PID alone will not last%s"
                % (
                    process["pid"],
                    process["comm"],
                    process["owner_note"],
                    ": stop the owner (%s), or run with stop_owners=true" % command if command else "",
                )
            )
    for item in result["respawned"]:
        parent = item.get("parent")
        warnings.append(
            "PID %s (%s) came back as PID %s%s: stop that parent first (for example a torchrun or Ray agent, "
            "or a systemd unit), or the GPU will be held again"
            % (
                item["replaces"],
                item["replaces_comm"],
                item["pid"],
                ", started by PID %s (%s)" % (parent["pid"], parent["comm"]) if parent else "",
            )
        )
    return warnings
