# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run of vllm_drain: check the options, find the server's main process, drain, then stop it.

`run` returns a gpu/_outcome.Outcome; nothing here calls exit_json or fail_json. The drain is _drain's, the stop
_stop's, the pidfile _detached's.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options, _outcome, _proc
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _detached, _drain, _http, _stop

# The number options, checked before anything is asked or signalled.
NUMBERS = ("timeout", "poll_interval", "request_timeout", "grace_period", "kill_wait")


def argument_spec() -> Dict[str, Any]:
    """vllm_drain's argument spec: the server's (_http.SERVER_ARGS), its number options from _options.DRAIN."""
    spec = dict(
        _http.SERVER_ARGS,
        served_model_name=dict(type="str", aliases=["model"]),
        pid=dict(type="int"),
        pidfile=dict(type="path"),
        fail_on_survivors=dict(type="bool", default=False),
        start_ticks=dict(type="int"),
        tree=dict(type="bool", default=False),
        **_options.spec(_options.DRAIN, *NUMBERS),
    )
    spec["grace_period"]["aliases"] = ["stop_timeout"]
    return spec


def run(params: Mapping[str, Any], check_mode: bool = False) -> _outcome.Outcome:
    """vllm_drain with `params` (the module's validated options). Check mode drains with no wait and stops nothing."""
    try:
        _options.check(_options.DRAIN, params, NUMBERS)
        record = main_process(params)
    except (_options.OptionError, _detached.DetachedError) as exc:
        return _outcome.refused(str(exc))
    client = _http.client_of(params)
    try:
        drained = _drain.drain(
            client, params["served_model_name"], 0 if check_mode else params["timeout"], params["poll_interval"]
        )
    except _http.VllmApiError as exc:
        return _outcome.refused("%s: %s; nothing was signalled" % (params["url"], exc))
    msg = "%s: %s" % (params["url"], drained["msg"])
    warnings = [msg] if not drained["metrics"] else []
    stop = None
    if record is not None and not check_mode:
        stop = stop_server(params, record)
        msg += stop_words(stop)
        if stop["left"] and params["fail_on_survivors"]:
            return _outcome.Outcome(dict(msg=msg, changed=stop["signalled"], **result(drained, stop)), failed=True)
    changed = bool(stop and stop["signalled"])
    return _outcome.Outcome(dict(changed=changed, msg=msg, **result(drained, stop)), warnings=warnings)


def main_process(params: Mapping[str, Any]) -> Optional[Tuple[int, int]]:
    """The (PID, start_ticks) of the server's main process from O(pidfile) or O(pid); None when neither is given or
    the PID does not run. Raises _detached.DetachedError when the pidfile cannot be read."""
    if params["pidfile"]:
        return _detached.read_pidfile(params["pidfile"])
    if params["pid"]:
        ticks = _proc.read_start_ticks(params["pid"])
        if ticks is None or params["start_ticks"] not in (None, ticks):
            return None  # gone, or the PID names another process now
        return (params["pid"], ticks)
    return None


def stop_server(params: Mapping[str, Any], record: Tuple[int, int]) -> _stop.Stopped:
    """SIGTERM to the main process, then its session (a pidfile's) or its whole tree (O(tree))."""
    if params["tree"]:
        return _stop.stop_tree(record, params["grace_period"], params["kill_wait"])
    return _stop.stop_main_process(record, params["grace_period"], session=bool(params["pidfile"]))


def stop_words(stop: _stop.Stopped) -> str:
    """What the stop did, to follow the drain's words ("" when nothing was signalled)."""
    if not stop["signalled"]:
        return ""
    return "; SIGTERM to PID %d: %s after %.1f s%s" % (
        stop["pid"],
        "exited" if stop["exited"] else "%d process(es) left" % len(stop["left"]),
        stop["stop_s"],
        ", %d process(es) of its tree SIGKILLed" % len(stop["killed"]) if stop["killed"] else "",
    )


def result(drained: _drain.Drained, stop: Optional[_stop.Stopped]) -> Dict[str, Any]:
    """The module's result: the drain's (its message apart) and the stop's."""
    found: Dict[str, Any] = {key: value for key, value in drained.items() if key != "msg"}
    found["stop"] = stop
    return found
