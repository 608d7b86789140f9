# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run of gpu_guard: check the options, watch the vLLM instances, look at the GPUs, write the textfile.

`run` returns an _outcome.Outcome; nothing here calls exit_json or fail_json. The GPU side is gpu/'s (_orphans
judges the holders, _guard_metrics writes the text); the vLLM side is _vllm_stall's. It lives in vllm/ because it
watches both: vllm/ may import gpu/, never the other way.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional, Tuple, cast

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options, _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import (
    _gpus,
    _guard_metrics,
    _holders,
    _orphans,
    _shapes,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _http, _vllm_stall


def argument_spec() -> Dict[str, Any]:
    """gpu_guard's argument spec (driver_timeout and max_used_mib from _options.GPU)."""
    return dict(
        gpus=dict(type="bool", default=True),
        textfile=dict(type="path"),
        inventory_hostname=dict(type="str"),
        vllm_instances=dict(type="list", elements="dict", default=[]),
        stall_seconds=dict(type="float", default=30.0),
        request_timeout=dict(type="float", default=5.0),
        **_options.spec(_options.GPU, "driver_timeout", "max_used_mib"),
    )


def run(params: Mapping[str, Any], check_mode: bool = False) -> _outcome.Outcome:
    """gpu_guard with `params` (the module's validated options): one look, its textfile (not in check mode)."""
    path = params["textfile"]
    problems = refusals(params)
    if problems:
        return _outcome.refused("nothing was looked at: %s" % "; ".join(problems))
    vllm = watch_instances(params["vllm_instances"], params["stall_seconds"], params["request_timeout"])
    # Without GPUs: no driver state, no GPU, no orphan.
    view, orphans = look(params) if params["gpus"] else (cast(_shapes.Snapshot, {"gpus": [], "driver": {}}), [])
    found = _guard_metrics.samples(
        view, orphans, vllm, _holders.translates_pids(view["driver"]), time.time(), params["inventory_hostname"]
    )
    msg = summary(view, orphans, vllm)
    return finish(path, _guard_metrics.render(found), orphans, vllm, msg, check_mode)


def refusals(params: Mapping[str, Any]) -> List[str]:
    """Why nothing can be looked at ([] when it can): the instances, the textfile's path and directory, the numbers."""
    problems = instance_problems(params["vllm_instances"])
    path = params["textfile"]
    if path is not None and (not path.startswith("/") or not path.endswith(".prom")):
        problems.append("textfile must be an absolute path ending in .prom, got %s" % path)
    try:
        table = _options.bounds(_options.GPU, ("driver_timeout", "max_used_mib"))
        _options.check_numbers(
            positive=["stall_seconds", "request_timeout"] + table["positive"],
            at_most=table["at_most"],
            stall_seconds=params["stall_seconds"],
            request_timeout=params["request_timeout"],
            driver_timeout=params["driver_timeout"],
            max_used_mib=params["max_used_mib"],
        )
    except _options.OptionError as exc:
        problems.append(str(exc))
    if path is not None and not problems:
        problems += _guard_metrics.unwritable(path)
    return problems


def watch_instances(
    instances: List[Dict[str, Any]], stall_seconds: float, request_timeout: float
) -> List[Dict[str, Any]]:
    """The state of each instance, watched at the same time (_vllm_stall.watch)."""
    clients = [
        _http.Client(instance["url"], instance.get("api_key"), request_timeout, instance.get("validate_certs", True))
        for instance in instances
    ]
    states = _vllm_stall.watch(clients, stall_seconds)
    return [dict(state, name=instance["name"], url=instance["url"]) for state, instance in zip(states, instances)]


def instance_problems(instances: List[Dict[str, Any]]) -> List[str]:
    """Why O(vllm_instances) cannot be watched ([] when it can)."""
    problems: List[str] = []
    for position, instance in enumerate(instances):
        for key in ("name", "url"):
            if not isinstance(instance.get(key), str) or not instance[key].strip():
                problems.append("vllm_instances[%d] needs a %s (text)" % (position, key))
    names: List[Any] = [instance.get("name") for instance in instances]
    problems += ["vllm_instances names %r twice" % name for name in sorted(set(n for n in names if names.count(n) > 1))]
    return problems


def look(params: Mapping[str, Any]) -> Tuple[_shapes.Snapshot, List[_orphans.Orphan]]:
    """(snapshot, orphans) of one look at the host."""
    inspector = _gpus.Inspector(driver_timeout=params["driver_timeout"])
    try:
        view = inspector.snapshot(tolerance_mib=params["max_used_mib"], owners=True, recovery=True)
    finally:
        inspector.close()
    judge = _orphans.Judge(initial_pidns=_gpus.initial_pid_namespace())
    return view, _orphans.orphans(view, judge)


def summary(snapshot: _shapes.Snapshot, orphans: List[_orphans.Orphan], vllm: List[Dict[str, Any]]) -> str:
    """The look in one line: per GPU its orphaned holders and the MiB no listed process explains, then the vLLM
    instances: "GPU 0: orphaned PID 6 VLLM::Worker_TP (vllm_server_exited), 0 MiB unexplained; GPU 1: no orphaned
    holder, 3500 MiB unexplained; 1 vLLM instance(s) watched: qwen healthy"."""
    parts = []
    for gpu in snapshot.get("gpus") or []:
        mine = [o for o in orphans if gpu.get("index") in o["gpus"]]
        held = "orphaned %s" % ", ".join("PID %d %s (%s)" % (o["pid"], o["comm"], o["reason"]) for o in mine)
        mib = gpu.get("unexplained_mib")
        unexplained = "unexplained memory unknown" if mib is None else "%d MiB unexplained" % mib
        parts.append("GPU %s: %s, %s" % (gpu.get("index"), held if mine else "no orphaned holder", unexplained))
    if not parts:
        parts.append("no GPU looked at" if not (snapshot.get("driver") or {}).get("timed_out") else "driver hung")
    states = ", ".join("%s %s" % (item["name"], item["state"]) for item in vllm)
    parts.append("%d vLLM instance(s) watched%s" % (len(vllm), ": " + states if states else ""))
    return "; ".join(parts)


def finish(
    path: Optional[str],
    text: str,
    orphans: List[_orphans.Orphan],
    vllm: List[Dict[str, Any]],
    msg: str,
    check_mode: bool,
) -> _outcome.Outcome:
    """Write the textfile (not in check mode) and say `msg`; changed when the figures differ from the file's.
    A textfile that cannot be written fails with the path asked for and why, without the text."""
    before = _guard_metrics.read(path) if path else None
    changed = bool(path) and _guard_metrics.without_timestamp(before) != _guard_metrics.without_timestamp(text)
    written = None
    if path and not check_mode:
        try:
            _guard_metrics.write(path, text)
        except OSError as exc:
            why = exc.strerror or str(exc)
            failure = dict(msg="textfile %s not written: %s; %s" % (path, why, msg), orphans=orphans, vllm=vllm)
            return _outcome.Outcome(failure, failed=True)
        written = path
    result = dict(changed=changed, msg=msg, orphans=orphans, vllm=vllm, metrics=text, textfile=written)
    return _outcome.Outcome(result)
