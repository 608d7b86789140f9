# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run of vllm_ready: check the options, find the server's process, wait until the server is ready.

`run` returns a gpu/_outcome.Outcome; nothing here calls exit_json or fail_json. The wait is _readiness's.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options, _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _detached, _http, _readiness

# The number options (_options.READY), checked before anything is asked.
NUMBERS = ("timeout", "poll_interval", "request_timeout", "completion_max_tokens")


def argument_spec() -> Dict[str, Any]:
    """vllm_ready's argument spec: the server's (_http.SERVER_ARGS), its number options from _options.READY."""
    spec: Dict[str, Dict[str, Any]] = dict(
        _http.SERVER_ARGS, pid=dict(type="int"), pidfile=dict(type="path"), **_options.spec(_options.READY, *NUMBERS)
    )
    spec["completion_max_tokens"]["no_log"] = False
    return spec


def run(params: Mapping[str, Any]) -> _outcome.Outcome:
    """vllm_ready with `params` (the module's validated options)."""
    try:
        _options.check(_options.READY, params, NUMBERS)
        process = server_process(params)
    except (_options.OptionError, _detached.DetachedError) as exc:
        return _outcome.refused(str(exc))
    ready = _readiness.wait_ready(
        _http.client_of(params),
        params["served_model_name"],
        params["timeout"],
        params["poll_interval"],
        process,
        params["completion_max_tokens"],
    )
    msg = "%s: %s" % (params["url"], ready["msg"])
    result = {key: value for key, value in ready.items() if key != "msg"}
    if not ready["ready"]:
        return _outcome.Outcome(dict(msg=msg, **result), failed=True)
    return _outcome.Outcome(dict(changed=False, msg=msg, **result))


def server_process(params: Mapping[str, Any]) -> _readiness.ProcessArg:
    """What the wait watches: O(pid), or the (PID, start_ticks) of O(pidfile) ((0, 0): no process, as for O(pid=0));
    None when neither is given. Raises _detached.DetachedError for a pidfile that cannot be read."""
    process: _readiness.ProcessArg = None if params["pid"] is None else params["pid"] or (0, 0)
    if params["pidfile"]:
        record: Optional[Tuple[int, int]] = _detached.read_pidfile(params["pidfile"])
        process = record or (0, 0)
    return process
