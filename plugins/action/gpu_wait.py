# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_wait's action: the module runs with the Python of gpuops_nvidia_venv where it exists on the host, and a null
selection option is refused before it runs (plugins/plugin_utils/_interpreter.py).

With progress_interval greater than 0, the wait goes in slices: one module run of at most progress_interval seconds
each (never past the time left before timeout), and between two slices one line of progress on the controller's
output (Display, which a worker process hands to the main process: it shows at once under the default callback).
Another slice runs only while the last one ended with GPUs still held, waiting can help and time is left
(_wait.worth_another_slice). The result is the last slice's, with elapsed_s and polls summed over all slices, "slices"
and a message that names the whole time waited (_wait.whole_time). progress_interval 0 (the default), a value the
module refuses (it says why), an async task: one module run, as without this option.

The module_utils of the slices are imported where a wait goes in slices: ansible runs each task in a new worker
process, whose collection loader compiles what it imports, and most gpu_wait tasks (check_gpus.yml on every host)
run once.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from ansible.module_utils.common.validation import check_type_float
from ansible.utils.display import Display

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._interpreter import ActionModule as InterpreterAction
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._interpreter import Result

display = Display()


def _number(value: object, default: float) -> float:
    """`value` as the module reads a float option (None: `default`); raises TypeError where it is none."""
    return default if value is None else float(check_type_float(value))


def slice_plan(args: Mapping[str, Any]) -> Optional[Tuple[float, float]]:
    """(timeout, progress_interval) in seconds of a wait in slices, from the task's arguments `args`; None for one
    module run: progress_interval 0 or left out, or a timeout or progress_interval that the module refuses (not a
    number, negative, not finite, above its bound), so that the module says why before anything runs."""
    if not args.get("progress_interval"):
        return None
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options

    try:
        timeout = _number(args.get("timeout"), _options.default("timeout"))
        interval = _number(args.get("progress_interval"), _options.default("progress_interval"))
        _options.check_numbers(at_most=_options.MAX_SECONDS, timeout=timeout, progress_interval=interval)
    except (TypeError, _options.OptionError):
        return None
    return (timeout, interval) if interval > 0 else None


def wait_in_slices(
    run: Callable[[float], Result],
    timeout_s: float,
    interval_s: float,
    show: Callable[[str], object],
    clock: Optional[Callable[[], float]] = None,
) -> Result:
    """Wait in slices: `run(seconds)` runs the module once with that timeout and returns its result; `show(line)`
    prints a line of progress; `clock()` reads the controller's clock (seconds; time.monotonic when None).

    The wait is bounded by the controller's clock, not by the time the slices report: each slice's timeout is at
    most `interval_s` and the time left before `timeout_s`, counted from the first slice's start, so that a slice's
    start (a module run: 0.3-1 s here) counts too, and no slice starts once the time is up. Slices go on while
    _wait.worth_another_slice says so; a line of progress before each slice but the first.

    Returns the last slice's result with "elapsed_s" the whole wait on the controller's clock, "polls" summed over
    all slices, "slices" and, where the message counts the time of its slice, the whole time instead, so that the two
    agree even after one slice (without the
    slice's "exception", whose summary ansible-core 2.19 and later print instead of "msg"). A slice without
    "elapsed_s" (the module refused an option, the host could not be reached) ends the wait: its result is returned
    as it is, with "slices"."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _report, _wait

    clock = clock or time.monotonic
    start = clock()
    polls = 0
    slices = 0
    seconds = min(interval_s, timeout_s)
    while True:
        result = run(seconds)
        slices += 1
        if "elapsed_s" not in result:
            return dict(result, slices=slices)
        waited = clock() - start
        polls += int(result.get("polls") or 0)
        if waited >= timeout_s or not _wait.worth_another_slice(result, waited, timeout_s, seconds):
            break
        show(_report.progress_line(result.get("gpus"), waited, timeout_s))
        seconds = min(interval_s, timeout_s - waited)
    summed = dict(result, elapsed_s=round(waited, 3), polls=polls, slices=slices)
    if isinstance(result.get("msg"), str):
        summed["msg"] = _wait.whole_time(result["msg"], summed["elapsed_s"])
        summed.pop("exception", None)
    return summed


class ActionModule(InterpreterAction):
    """gpu_wait's action: the interpreter and the null-selection refusal of every module of the collection, and the
    wait in slices with a line of progress between them (progress_interval)."""

    def _execute_module(
        self,
        module_name: Optional[str] = None,
        module_args: Optional[Dict[str, Any]] = None,
        tmp: Optional[str] = None,
        task_vars: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> Result:
        execute = super()._execute_module
        plan = None
        # The task's own run only (not another module's, not an async one, whose result is a job).
        if module_name in (None, self._task.action) and module_args is None and not kwargs.get("wrap_async"):
            plan = slice_plan(self._task.args)
        if plan is None:
            result: Result = execute(module_name, module_args, tmp, task_vars, **kwargs)
            return result
        timeout_s, interval_s = plan
        given = dict(self._task.args)

        def run(seconds: float) -> Result:
            # A fresh dict per run: ActionBase adds its _ansible_ keys to the arguments it is given.
            one: Result = execute(
                module_name, dict(given, timeout=seconds, progress_interval=0.0), tmp, task_vars, **kwargs
            )
            return one

        label = self._host_label(task_vars or {})
        return wait_in_slices(run, timeout_s, interval_s, lambda line: display.display("%s %s" % (label, line)))

    def _host_label(self, task_vars: Mapping[str, Any]) -> str:
        """The host as the default callback names it: "[node1]", "[node1 -> node2]" where the task is delegated."""
        host = str(task_vars.get("inventory_hostname") or "")
        delegate = self._task.delegate_to
        return "[%s -> %s]" % (host, delegate) if delegate and delegate != host else "[%s]" % host
