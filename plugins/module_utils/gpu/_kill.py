# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run of gpu_kill: check the options, look, select, stop owners, end the targets, wait, and say so.

The module gives its parameters and a few callables of AnsibleModule (run_command, get_bin_path); `run`
returns an Outcome: the result dict, whether the run failed, and the warnings. Nothing here calls
exit_json or fail_json. Each step returns what it found (take_lock a Lock, first_look a Look, _stop_owners a
StopPlan and a Stopped, end an _terminate.Ended, wait a WaitStep); `assemble` builds the result from them once.
The parts are the other module_utils: _select chooses the targets, _stop_owners stops their owners (imported only
where stop_owners asks for it), _terminate ends them, _wait and _release wait for the release, _report and
_owner_lines word the result.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._outcome import Outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import (
    _gpus,
    _owner_lines,
    _release,
    _report,
    _select,
    _shapes,
    _terminate,
    _wait,
)

if TYPE_CHECKING:
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _stop_owners

# The module's result and the processes in it: JSON-ish dicts whose keys RETURN in plugins/modules/gpu_kill.py
# documents (a process is a snapshot holder plus what a step adds: owner words, signals, exit times, reasons).
Result = Dict[str, Any]
Entry = _terminate.Entry


class Lock(NamedTuple):
    """What taking the host's lock came to: the seconds waited for another run (0.0: none), and its warnings."""

    waited_s: float
    warnings: List[str]


class Look(NamedTuple):
    """The first look: the snapshot, the selection made from it, and how the selection splits its holders."""

    snapshot: _shapes.Snapshot
    selection: _select.Selection
    targets: List[Entry]  # the selected holders, with their owners' words (_report.annotate)
    left_alone: List[Entry]
    protected: List[Entry]
    not_holding: List[int]
    foreign: List[Entry]


class WaitReport(TypedDict):
    """The result's "wait": the wait for the release after a real run (wait=true), as gpu_wait reports it."""

    elapsed_s: float
    polls: int
    msg: str
    gpus: List[_shapes.WaitStatus]  # with "next_step" on each GPU not released
    memory_checked: bool
    driver: _shapes.Driver


class WaitStep(NamedTuple):
    """wait=true after a real run: the last snapshot, whether the GPUs were released, and the wait's report."""

    after: _shapes.Snapshot
    released: bool
    report: WaitReport


class Steps(NamedTuple):
    """What each step of a run found; None for a step that did not run."""

    driver: _shapes.Driver
    look: Optional[Look] = None  # None: the selection was refused (`refusal` says why)
    refusal: Optional[str] = None  # why nothing was signalled: the selection or stop_owners refused
    warnings: Sequence[str] = ()  # about the driver
    plan: Optional[_stop_owners.StopPlan] = None  # stop_owners=true
    stopped: Optional[_stop_owners.Stopped] = None  # stop_owners=true, in a real run
    ended: Optional[_terminate.Ended] = None  # a real run whose units were stopped
    elapsed_s: Optional[float] = None  # seconds from the start to the end of the targets
    waited: Optional[WaitStep] = None
    would_fail: Optional[str] = None  # check mode, wait=true: why a real run's wait would fail whatever it ended
    would_stay: Optional[str] = None  # check mode, wait=true: selected GPUs no target holds that are not free


def refused(msg: str, **result: Any) -> Outcome:
    """The Outcome of input refused before anything was signalled."""
    return Outcome(dict(result, changed=False, msg="nothing was signalled: %s" % msg), failed=True)


# gpu_kill's number options (_options.GPU).
NUMBERS = (
    "grace_period",
    "kill_wait",
    "driver_timeout",
    "wait_timeout",
    "max_used_mib",
    "poll_interval",
    "lock_timeout",
)


def argument_spec() -> Dict[str, Any]:
    """gpu_kill's argument spec: its number options from _options.GPU, the wait's, the selection's."""
    return dict(
        signal=dict(type="str", default="SIGTERM"),
        stop_owners=dict(type="bool", default=False),
        stop_spanning_owners=dict(type="bool", default=False),
        wait=dict(type="bool", default=False),
        fail_unreleased=dict(type="bool", default=True),
        **_options.spec(_options.GPU, "grace_period", "kill_wait", "wait_timeout", "lock_timeout"),
        **dict(_wait.WAIT_ARGS, **_select.HOLDER_ARGS, **_gpus.SELECTION_ARGS),
    )


def run(
    params: Mapping[str, Any],
    check_mode: bool = False,
    run_command: Optional[_stop_owners.RunCommand] = None,
    which: Optional[_stop_owners.Which] = None,
) -> Outcome:
    """gpu_kill with `params` (the module's validated options; a null selection option was refused by the action
    plugin on the controller). `run_command(argv)` -> (rc, out, err) and `which(name)` -> path run systemctl
    for stop_owners. A real run holds the host's lock (_terminate.HostLock) from its first look to its last."""
    started = time.monotonic()
    try:
        sig, checked = check(params)
    except ValueError as exc:  # OptionError, SelectionError and unknown signals
        return refused(str(exc))
    host_lock = _terminate.HostLock()
    try:
        lock = take_lock(host_lock, params["lock_timeout"], check_mode)
        steps = look_and_end(params, checked, sig, check_mode, run_command, which, started)
    except _terminate.LockTimeout as exc:
        return refused(str(exc))
    finally:
        host_lock.release()
    return assemble(steps, lock, check_mode, params["wait"], params.get("fail_unreleased", True))


def check(params: Mapping[str, Any]) -> tuple[signal.Signals, _select.Checked]:
    """(the signal, the checked selection options); ValueError (OptionError, SelectionError) for input refused."""
    _options.check(_options.GPU, params, NUMBERS)
    return _terminate.parse_signal(params["signal"]), _select.check_options(params)


def take_lock(lock: _terminate.HostLock, timeout: float, check_mode: bool) -> Lock:
    """The seconds waited for another gpu_kill run on this host, and the warnings. Check mode signals nothing and
    takes no lock: it says when another run is ending processes now. Raises LockTimeout after `timeout` seconds."""
    if check_mode:
        busy = lock.holders()
        return Lock(
            0.0,
            [
                "another gpu_kill run on this host (%s) is ending processes now: what this check reports may change"
                % ", ".join("PID %s" % h["pid"] for h in busy)
            ]
            if busy
            else [],
        )
    try:
        waited = lock.acquire(timeout)
    except OSError as exc:
        return Lock(
            0.0,
            [
                "the host's lock for gpu_kill could not be taken (%s): a gpu_kill run at the same time would signal "
                "the same processes" % exc
            ],
        )
    return Lock(waited, [_terminate.waited_words(waited, lock.waited_for)] if waited else [])


def look_and_end(
    params: Mapping[str, Any],
    checked: _select.Checked,
    sig: signal.Signals,
    check_mode: bool,
    run_command: Optional[_stop_owners.RunCommand],
    which: Optional[_stop_owners.Which],
    started: float,
) -> Steps:
    """Look, select, plan stop_owners, stop units and end the targets, wait: what each step found."""
    inspector = _gpus.Inspector(driver_timeout=params["driver_timeout"])
    try:
        # Check mode scans every process: a holder that the driver's figures do not give away (the forked child of a
        # dead creator whose number a process with its own context has now) is named from the start, as the run ends
        # it. The run's looks scan the listed PIDs where they explain the GPUs: once the reuser has exited, its listed
        # number is an exited creator's and the next look scans every process. Where the selection leaves a holder
        # alone, that holder may be the reuser, which never exits: the first look then scans every process too.
        scope: _shapes.Scope = "full" if check_mode else "listed"
        snapshot = inspector.snapshot(scope=scope, owners=True, tolerance_mib=params["max_used_mib"])
        steps = Steps(snapshot["driver"])
        try:
            look = first_look(params, snapshot, checked)
            if snapshot["scan"] == "listed" and look.left_alone:
                snapshot = inspector.snapshot(scope="full", owners=True, tolerance_mib=params["max_used_mib"])
                look = first_look(params, snapshot, checked)
        except _select.SelectionError as exc:
            return steps._replace(refusal=str(exc))
        steps = steps._replace(look=look, warnings=driver_warnings(snapshot["driver"], params["driver_timeout"]))
        if params["stop_owners"]:
            steps = plan_stops(steps, look, snapshot, params)
            if steps.refusal:
                return steps
        if not check_mode:
            if steps.plan:
                stopped = stop_planned(steps.plan, params, run_command, which)
                steps = steps._replace(stopped=stopped)
                if stopped.failure:
                    return steps
            steps = steps._replace(ended=end(inspector, look, sig, params))
        steps = steps._replace(elapsed_s=round(time.monotonic() - started, 3))
        if params["wait"] and not check_mode and steps.ended is not None and not steps.ended["survived"]:
            ended = steps.ended["signalled"] or (steps.stopped is not None and steps.stopped.units)
            steps = steps._replace(waited=wait(inspector, look.selection, None if ended else snapshot, params))
        if params["wait"] and check_mode:
            fail, stay = predict(look.selection, snapshot, params)
            steps = steps._replace(would_fail=fail, would_stay=stay)
    finally:
        inspector.close()
    return steps


def plan_stops(steps: Steps, look: Look, snapshot: _shapes.Snapshot, params: Mapping[str, Any]) -> Steps:
    """stop_owners=true: the owners to stop with the targets (_stop_owners.plan), and why it stops none where it
    refuses (_stop_owners.refusal). Imported here: a run without stop_owners never compiles _stop_owners."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _stop_owners

    plan = _stop_owners.plan(look.targets, snapshot, look.selection, timeout_s=params["grace_period"])
    return steps._replace(plan=plan, refusal=_stop_owners.refusal(plan["beyond"], params["stop_spanning_owners"]))


def stop_planned(
    plan: _stop_owners.StopPlan,
    params: Mapping[str, Any],
    run_command: Optional[_stop_owners.RunCommand],
    which: Optional[_stop_owners.Which],
) -> _stop_owners.Stopped:
    """stop_owners in a real run: the planned units, then (unless a unit's stop failed) the containers."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _stop_owners

    if run_command is None or which is None:
        raise TypeError("stop_owners needs run_command and which")
    stopped = _stop_owners.stop_units(plan["units"], plan["unit_processes"], run_command, which)
    if not stopped.failure:
        stopped = _stop_owners.stop_containers(
            stopped, plan["containers"], plan["container_processes"], which, params["grace_period"]
        )
    return stopped


def first_look(params: Mapping[str, Any], snapshot: _shapes.Snapshot, checked: _select.Checked) -> Look:
    """The selection made from the first snapshot and how it splits the holders; raises SelectionError."""
    selection = _select.Selection.from_params(params, snapshot, checked)
    split = selection.split(snapshot)
    return Look(
        snapshot,
        selection,
        [_report.annotate(dict(target), params["grace_period"]) for target in split["targets"]],
        split["left_alone"],
        split["protected"],
        split["not_holding"],
        foreign(snapshot, selection),
    )


def driver_warnings(driver: _shapes.Driver, driver_timeout: float) -> List[str]:
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


def end(inspector: _gpus.Inspector, look: Look, sig: signal.Signals, params: Mapping[str, Any]) -> _terminate.Ended:
    """End the targets, three rounds at most (processes may appear while others die)."""
    selection = look.selection

    def choose(_first: bool) -> List[Entry]:
        return [
            _report.annotate(t, params["grace_period"])
            for t in selection.split(
                inspector.snapshot(
                    scope="listed", indices=selection.indices, owners=True, tolerance_mib=params["max_used_mib"]
                )
            )["targets"]
        ]

    return _terminate.end_until_gone(choose, look.targets, sig, params["grace_period"], params["kill_wait"])


def predict(
    selection: _select.Selection, snapshot: _shapes.Snapshot, params: Mapping[str, Any]
) -> Tuple[Optional[str], Optional[str]]:
    """Check mode with wait=true: what a real run's wait would find whatever the run ended, in the words of the wait's
    own failure. First, why it would fail: selected GPUs that the driver answers with an error (such as a GPU that fell
    off the bus), or a driver that did not answer. Second, the selected GPUs that no target holds and that are not free
    (memory no process explains, or holders left alone): the wait would go on until its timeout, and fail unless the
    driver frees that memory first. None for each where there is none: a GPU that a target holds may be freed by its
    end (check mode cannot tell how its memory would go)."""
    statuses = _release.gpu_status(selection, snapshot, params["max_used_mib"])
    stuck = [dict(gpu, holders=[]) for gpu in statuses if gpu["error"] or snapshot["driver"]["timed_out"]]
    if stuck:
        return _single_look(stuck, snapshot, params), None
    stay = [gpu for gpu in statuses if not gpu["released"] and not gpu["holders"]]
    return None, _single_look(stay, snapshot, params) if stay else None


def _single_look(gpus: List[Any], snapshot: _shapes.Snapshot, params: Mapping[str, Any]) -> str:
    """The wait's message on `gpus` (gpu_status entries) as one look at `snapshot` would give it."""
    return _wait.conclude(
        _shapes.Waited(released=False, elapsed_s=0.0, polls=0, gpus=gpus, driver=snapshot["driver"], snapshot=snapshot),
        params["driver_timeout"],
        single_look=True,
    )


def wait(
    inspector: _gpus.Inspector,
    selection: _select.Selection,
    first: Optional[_shapes.Snapshot],
    params: Mapping[str, Any],
) -> WaitStep:
    """wait=true: wait for the release as gpu_wait does (`first`: the snapshot just taken when nothing was ended)."""
    waited = _wait.wait_released(
        inspector, selection, params["wait_timeout"], params["max_used_mib"], params["poll_interval"], first=first
    )
    msg = _wait.conclude(waited, params["driver_timeout"])  # adds "memory_checked" to `waited`
    report = WaitReport(
        elapsed_s=waited["elapsed_s"],
        polls=waited["polls"],
        msg=msg,
        gpus=waited["gpus"],
        memory_checked=waited["memory_checked"],
        driver=waited["driver"],
    )
    return WaitStep(waited["snapshot"], waited["released"], report)


def foreign(snapshot: _shapes.Snapshot, selection: _select.Selection) -> List[Entry]:
    """Foreign entries of the selected GPUs; where MIG instances are selected, of those instances only."""
    found: List[Entry] = []
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


def assemble(steps: Steps, lock: Lock, check_mode: bool, waits: bool, fail_unreleased: bool = True) -> Outcome:
    """The Outcome of a run from what its steps found, with the lock's wait said first."""
    outcome = _outcome(steps, lock, check_mode, waits, fail_unreleased)
    msg = outcome.result["msg"]
    return Outcome(
        dict(
            outcome.result,
            lock_waited_s=lock.waited_s,
            msg="%s; %s" % (lock.warnings[0], msg) if lock.waited_s else msg,
        ),
        outcome.failed,
        lock.warnings + outcome.warnings,
    )


def _outcome(steps: Steps, lock: Lock, check_mode: bool, waits: bool, fail_unreleased: bool) -> Outcome:
    if steps.look is None:
        return refused(steps.refusal or "", driver=steps.driver)
    data = result_data(steps, steps.look, lock, check_mode)
    if steps.refusal:
        return refused(steps.refusal, **data)
    if steps.stopped and steps.stopped.failure:
        return Outcome(dict(data, msg=steps.stopped.failure), failed=True, warnings=steps.warnings)
    return finish(data, steps.would_fail, check_mode, waits, steps.warnings, fail_unreleased)


def result_data(steps: Steps, look: Look, lock: Lock, check_mode: bool) -> Result:
    """The result of a run but for its message and summary."""
    plan, stopped, ended = steps.plan, steps.stopped, steps.ended
    done = stopped is None or not stopped.failure
    commands: List[str] = []
    if stopped:
        from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _stop_owners

        commands = _stop_owners.owner_commands(look.targets)
    data: Result = dict(
        changed=bool(look.targets)
        if check_mode
        else done and bool((stopped and (stopped.units or stopped.containers)) or (ended and ended["signalled"])),
        gpus=None if look.selection.indices is None else list(look.selection.indices),
        mig_instances={str(i): sorted(uuids) for i, uuids in sorted(look.selection.instances.items())},
        driver=look.snapshot["driver"],
        would_signal=look.targets if check_mode and not steps.refusal else [],
        would_stop_units=plan["units"] if check_mode and plan and not steps.refusal else [],
        would_stop_containers=plan["containers"] if check_mode and plan and not steps.refusal else [],
        signalled=ended["signalled"] if ended else [],
        exited=ended["exited"] if ended else [],
        survived=ended["survived"] if ended else [],
        not_signalled=ended["not_signalled"] if ended else [],
        respawned=ended["respawned"] if ended else [],
        left_alone=look.left_alone,
        protected=look.protected,
        not_holding=look.not_holding,
        foreign=look.foreign,
        before=look.snapshot,
        stopped_units=stopped.units if stopped else [],
        stopped_containers=stopped.containers if stopped else [],
        owner_commands=commands,
        unit_processes=(stopped.unit_processes if stopped else plan["unit_processes"]) if plan else {},
        container_processes=(stopped.container_processes if stopped else plan["container_processes"]) if plan else {},
        lock_waited_s=lock.waited_s,
        owners_beyond_selection=plan["beyond"] if plan else [],
    )
    if steps.elapsed_s is not None:
        data["elapsed_s"] = steps.elapsed_s
    if steps.would_stay:
        data["would_stay"] = steps.would_stay
    if steps.waited:
        data.update(
            after=steps.waited.after,
            released=steps.waited.released,
            wait_timed_out=not steps.waited.released,
            wait=steps.waited.report,
        )
    return data


def finish(
    data: Result,
    failure: Optional[str],
    check_mode: bool,
    waits: bool,
    warnings: Sequence[str],
    fail_unreleased: bool = True,
) -> Outcome:
    """The Outcome: failed when a process survived SIGKILL, (wait=true) the GPUs were not released in time (unless
    `fail_unreleased` is false: a caller that goes on waiting), or (check mode, wait=true) `failure` says why the wait
    would fail whatever was ended; with wait=true the result carries the summary lines of the reset_gpus role."""
    if data["survived"]:
        msg = "%d selected process(es) survived SIGKILL: %s" % (
            len(data["survived"]),
            "; ".join("PID %s (%s): %s" % (s["pid"], s["comm"], s["reason"]) for s in data["survived"]),
        )
        return Outcome(dict(data, msg=msg), failed=True, warnings=warnings)
    msg = message(data, check_mode)
    if failure:
        msg += "; a real run would fail whatever it ended: %s" % failure
    msg += _report.would_stay_words(data)
    warnings = list(warnings) + owner_warnings(data, check_mode)
    failed = bool(failure)
    if not waits:
        return Outcome(dict(data, msg=msg), failed=failed, warnings=warnings)
    result = dict(data, msg=msg)
    wait_report = dict(data.get("wait", {"elapsed_s": 0.0}), released=data.get("released"))
    said = _report.outcome(dict(result, failed=failed), wait_report, check_mode, wait_report["elapsed_s"])
    after = data["after"] if "after" in data else data["before"]
    summary = _report.summary_lines(result, data["before"], after, check_mode, said)
    if data.get("wait_timed_out"):
        msg = "%s; %s" % (msg, wait_report["msg"])
        failed = failed or fail_unreleased
    return Outcome(dict(result, msg=msg, summary=summary), failed=failed, warnings=warnings)


def _names(processes: Iterable[Entry]) -> str:
    return ", ".join("%s (%s)" % (p["pid"], p["comm"]) for p in processes)


def _inline(lines: Iterable[str]) -> str:
    """Summary lines as parts of the one-line message: "; LINE" each, without their indent."""
    return "".join("; " + line.strip() for line in lines)


def message(result: Result, check_mode: bool) -> str:
    """What was done (or would be) and what was left, in one line."""
    if check_mode:
        msg = "would signal %d process(es)%s" % (
            len(result["would_signal"]),
            ": " + _names(result["would_signal"]) if result["would_signal"] else "",
        )
        msg += _inline(_owner_lines.unit_lines(result, check_mode))
    else:
        msg = "signalled %d process(es), %d exited" % (len(result["signalled"]), len(result["exited"]))
    # Where the wait timed out with NVML still silent, the wait's message (added by finish) says it.
    said = result.get("wait_timed_out") and ((result.get("wait") or {}).get("driver") or {}).get("timed_out")
    if result["driver"]["timed_out"] and not said:
        msg += "; NVML did not answer within driver_timeout (the driver may be hung): holders from the /proc scan alone"
    if result["left_alone"]:
        msg += "; left alone: %s" % "; ".join(
            "PID %s (%s): %s" % (h["pid"], h["comm"], h["reason"]) for h in result["left_alone"]
        )
        msg += _inline(_report.shared_lines(result, result["before"], check_mode))
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
        msg += _inline(_owner_lines.unit_lines(result, check_mode))
    msg += _inline(_owner_lines.beyond_lines(result, check_mode))
    if result.get("released"):
        msg += "; %s" % result["wait"]["msg"]
    return msg


def owner_warnings(result: Result, check_mode: bool) -> List[str]:
    """A warning for each holder whose owner will start it again, and for each respawn seen."""
    stopped = _owner_lines.stopped_names(result)
    processes = result["would_signal"] if check_mode else result["signalled"]
    warnings = [text for text in (_owner_lines.owner_warning(p, stopped) for p in processes) if text]
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
