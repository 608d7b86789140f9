# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run of detached_process: start a process in its own session, or end every member of that session.

`run` returns a gpu/_outcome.Outcome; nothing here calls exit_json or fail_json. Starting, the pidfile and the stop
are _detached's.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Mapping

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options, _outcome, _proc
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _detached


def argument_spec() -> Dict[str, Any]:
    """detached_process's argument spec (grace_period and kill_wait from _options.DETACHED)."""
    spec: Dict[str, Dict[str, Any]] = dict(
        state=dict(type="str", choices=["started", "stopped"], default="started"),
        argv=dict(type="list", elements="str"),
        pidfile=dict(type="path", required=True),
        log_file=dict(type="path"),
        environment=dict(type="dict", default={}),
        environment_files=dict(type="list", elements="path", default=[]),
        inherit_environment=dict(type="bool", default=True),
        cwd=dict(type="path", default="/"),
        **_options.spec(_options.DETACHED, "grace_period", "kill_wait"),
    )
    spec["grace_period"]["aliases"] = ["stop_timeout"]
    return spec


def run(params: Mapping[str, Any], check_mode: bool = False) -> _outcome.Outcome:
    """detached_process with `params` (the module's validated options)."""
    if params["state"] == "started" and not params["argv"]:
        return _outcome.refused("argv must not be empty")
    try:
        _options.check(_options.DETACHED, params, ("grace_period", "kill_wait"))
    except _options.OptionError as exc:
        return _outcome.refused("nothing was signalled: %s" % exc)
    started = time.monotonic()
    try:
        if params["state"] == "started":
            outcome = ensure_started(params, check_mode)
        else:
            outcome = ensure_stopped(params, check_mode)
    except _detached.DetachedError as exc:
        return _outcome.refused(str(exc))
    if not outcome.failed:
        outcome.result["elapsed_s"] = round(time.monotonic() - started, 3)
    return outcome


def ensure_started(params: Mapping[str, Any], check_mode: bool) -> _outcome.Outcome:
    """state=started: the running process of the pidfile, or a new one (its pidfile written)."""
    record = _detached.read_pidfile(params["pidfile"])
    if record is not None and record.alive():
        return _outcome.Outcome(
            dict(
                changed=False,
                pid=record[0],
                start_ticks=record[1],
                running_cmdline=_proc.read_cmdline(record[0]),
                msg="already running as PID %d" % record[0],
            )
        )
    if check_mode:
        return _outcome.Outcome(dict(changed=True, pid=None, msg="would start %s" % params["argv"][0]))
    pid, start_ticks, log_offset = _detached.start(
        params["argv"],
        params["log_file"],
        params["environment"],
        params["environment_files"],
        params["cwd"],
        params["inherit_environment"],
    )
    _detached.write_pidfile(params["pidfile"], pid, start_ticks)
    return _outcome.Outcome(
        dict(
            changed=True,
            pid=pid,
            start_ticks=start_ticks,
            log_offset=log_offset,
            msg="started PID %d, log in %s" % (pid, params["log_file"]),
        )
    )


def ensure_stopped(params: Mapping[str, Any], check_mode: bool) -> _outcome.Outcome:
    """state=stopped: every member of the session of the pidfile ended (_detached.stop)."""
    stopped = _detached.stop(params["pidfile"], params["grace_period"], params["kill_wait"], check_mode)
    if stopped["survived"]:
        survivors = "; ".join("PID %s (%s): %s" % (s["pid"], s["comm"], s["reason"]) for s in stopped["survived"])
        msg = "%d process(es) of the session survived SIGKILL: %s" % (len(stopped["survived"]), survivors)
        return _outcome.Outcome(dict(msg=msg, **stopped), failed=True)
    result: Dict[str, Any] = dict(stopped)
    if check_mode:
        result["msg"] = "would signal %d process(es)" % len(stopped["would_signal"])
    elif stopped["pid"] is None:
        result["msg"] = "no pidfile: nothing to stop"
    else:
        result["msg"] = "signalled %d process(es), %d exited" % (len(stopped["signalled"]), len(stopped["exited"]))
    return _outcome.Outcome(result)
