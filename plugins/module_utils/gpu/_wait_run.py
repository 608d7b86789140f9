# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run of gpu_wait: check the options, look, select, wait for the release, and say so.

`run` returns an _outcome.Outcome; nothing here calls exit_json or fail_json. The wait itself is _wait's, the words
of a GPU not freed _advice's. The slices of a long wait are the action plugin's (plugins/action/gpu_wait.py): each
run of the module is one.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, cast

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus, _options, _outcome, _select
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _shapes, _wait

# The number options, checked before anything is looked at.
NUMBERS = ("timeout", "max_used_mib", "poll_interval", "driver_timeout", "progress_interval")


def argument_spec() -> Dict[str, Any]:
    """gpu_wait's argument spec: its number options from _options.GPU, the wait's, the selection's."""
    return dict(
        require_memory=dict(type="bool", default=False),
        return_after=dict(type="bool", default=True),
        recovery=dict(type="bool", default=False),
        # The slices are the action plugin's (plugins/action/gpu_wait.py): each run of the module is one.
        **_options.spec(_options.GPU, "timeout", "progress_interval"),
        **dict(_wait.WAIT_ARGS, **_select.HOLDER_ARGS, **_gpus.SELECTION_ARGS),
    )


def run(params: Mapping[str, Any]) -> _outcome.Outcome:
    """gpu_wait with `params` (the module's validated options; a null selection option was refused by the action
    plugin on the controller, and is None here as one left out)."""
    try:
        _options.check(_options.GPU, params, NUMBERS)
        checked = _select.check_options(params)
    except _options.OptionError as exc:
        return _outcome.refused(str(exc))
    inspector = _gpus.Inspector(driver_timeout=params["driver_timeout"])
    try:
        # The first look initializes NVML (seconds on some drivers): it may take the whole driver_timeout.
        first = inspector.snapshot(scope="listed", tolerance_mib=params["max_used_mib"])
        try:
            selection = _select.Selection.from_params(params, first, checked)
        except _select.SelectionError as exc:
            return _outcome.refused(str(exc), driver=first["driver"])
        # The first look serves as the wait's first poll (one NVML query and one scan where the GPUs are free), unless
        # owner filters need the owners that a listed-PIDs look leaves out.
        reuse = not selection.owners or first["scan"] == "full"
        result = _wait.wait_released(
            inspector,
            selection,
            params["timeout"],
            params["max_used_mib"],
            params["poll_interval"],
            first=first if reuse else None,
        )
        result["after"] = result.pop("snapshot")
        if params.get("recovery"):
            _advise(inspector, result)
    finally:
        inspector.close()
    return conclude(params, result)


def _advise(inspector: _gpus.Inspector, result: _shapes.Waited) -> None:
    """With `recovery`: the driver's advice and the kernel log's Xids on the last look's GPUs, and "advice", the
    selected GPUs that need a reset, a reboot or another step (_recovery)."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _recovery

    reading = inspector.read_driver(advice=True)
    gpus = cast(List[Dict[str, Any]], result["after"]["gpus"])
    _recovery.recovery(gpus, reading.get("advice", []), inspector.proc)
    result["advice"] = _recovery.needing(gpus, [gpu["index"] for gpu in result["gpus"] if gpu["index"] is not None])


def conclude(params: Mapping[str, Any], result: _shapes.Waited) -> _outcome.Outcome:
    """Released: the result; else failed, with one line per GPU that says why and what to do next."""
    warnings = []
    driver = result["driver"]
    if not driver["available"] and not driver["timed_out"]:
        warnings.append(
            "NVIDIA driver library not usable (%s): waited for holders from the /proc scan alone; "
            "memory release is not confirmed" % driver["error"]
        )
    msg = _wait.conclude(result, params["driver_timeout"], params["timeout"] == 0)
    if not params["return_after"]:
        del result["after"]
    failed = not result["released"]
    if result["released"] and not result["memory_checked"] and params["require_memory"]:
        from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _advice

        msg, failed = _advice.not_checked(result), True
    if result.get("advice"):
        from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._recovery import advice_words

        msg, failed = "%s (the wait: %s)" % (advice_words(result["advice"]), msg), True
    outcome: Dict[str, Any] = dict(msg=msg, changed=False, **result)
    return _outcome.Outcome(outcome, failed=failed, warnings=warnings)
