# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Python that the collection's modules run with on a host.

Every module of the collection has an action plugin of its name (plugins/action/) that is this class. It runs the
module with the Python of the venv in the host variable gpuops_nvidia_venv (default /opt/gpuops-nvidia/venv,
made by playbooks/prepare_hosts.yml) and, where that Python does not exist on the host, with the interpreter the
task would use anyway (ansible_python_interpreter, or interpreter discovery). Only this task's copy of the variables
changes: the user's other tasks keep their interpreter, and no interpreter fact is stored for the venv.

How ansible-core picks the interpreter (2.17 to 2.21): ActionBase._configure_module hands the task variables to
module_common._get_shebang, which reads INTERPRETER_PYTHON with those variables (ansible_python_interpreter, the
highest of its sources) and runs discovery only when it is auto; discovery stores discovered_interpreter_python as a
host fact. The venv is tried first, without a look beforehand (a look costs a round trip on every module run): the
shell that starts a missing interpreter exits 127 with its path in stderr, nothing ran, and the module runs once
more with the task's own interpreter. Async runs, whose wrapper would leave its files behind, look first.

It also sees the module's arguments as given (self._task.args, templated, with the module defaults), which the module
does not: a selection option of gpu_kill or gpu_wait given as null (a vars file whose entries are all commented out, a
template that rendered null) reaches the module as None, the same as an option left out, which selects any. Such a
task is refused here, before the module runs, with the module's own words (module_utils/gpu/_nothing.py,
null_refusal); the module refuses the rest of what names nothing itself (check_not_empty).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible.plugins.action.normal import ActionModule as NormalAction
from ansible.utils.display import Display

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._nothing import null_refusal

DEFAULT_VENV = "/opt/gpuops-nvidia/venv"
VENV_VARIABLE = "gpuops_nvidia_venv"
NEXT_STEP = "ansible-playbook -i INVENTORY gpuops.nvidia.prepare_hosts -b (playbooks/prepare_hosts.yml)"
# ansible.module_utils.basic.missing_required_lib, which the modules' library check calls (module_utils/gpu/_gpus.py).
MISSING_LIBRARY = re.compile(r"Failed to import the required Python library \(([^)]+)\)")
# Exit statuses of a shell whose command could not be run: not found, not executable.
NOT_STARTED = (126, 127)

# The modules that select holders, and how each begins a refusal of its options (gpu_kill's: _kill.refused).
SELECTING = {"gpu_kill": "nothing was signalled: ", "gpu_wait": "", "gpu_reset": "no GPU was reset: "}
# A module run's result, and the interpreters tried: (interpreter, its source, "not found" or None where it ran).
Result = Dict[str, Any]
Tried = List[Tuple[str, str, Optional[str]]]

display = Display()


def venv_python(venv: object) -> Optional[str]:
    """bin/python of venv `venv`; None for an empty value (no venv: the task's own interpreter only)."""
    if not venv or str(venv).strip().lower() in ("none", "false", "no"):
        return None
    return posixpath.join(str(venv).strip(), "bin", "python")


def interpreter_missing(result: object, python: str) -> bool:
    """True when `result` is a module run that never started because `python` is missing on the host."""
    if not isinstance(result, dict) or result.get("rc") not in NOT_STARTED:
        return False
    output = "%s\n%s" % (result.get("module_stderr", ""), result.get("module_stdout", ""))
    return python in output


def explain(result: Result, tried: Tried) -> Result:
    """`result`, with one message naming every interpreter tried where none could run the module.

    `tried` is [(interpreter, source, outcome)] in the order tried; outcome is "not found" or None (it ran).
    """
    if not result.get("failed"):
        return result
    missing = MISSING_LIBRARY.findall(str(result.get("msg", "")))
    last_missing = tried and tried[-1][2] == "not found"
    if not missing and not last_missing:
        return result
    outcomes = []
    for interpreter, source, outcome in tried:
        outcomes.append("%s (%s): %s" % (interpreter, source, outcome or "lacks %s" % ", ".join(missing)))
    result = dict(result)
    result["msg"] = (
        "no Python with nvidia-ml-py and psutil for gpuops.nvidia on this host; tried %s. Next step: %s, which "
        "makes the venv of gpuops_nvidia_venv with both, or set gpuops_nvidia_venv to a venv that has them"
        % ("; then ".join(outcomes), NEXT_STEP)
    )
    result["interpreters_tried"] = [interpreter for interpreter, _source, _outcome in tried]
    # ansible-core 2.19 and later show a failure's exception (an error summary object) instead of its msg: keep the
    # one message. 2.17 and 2.18 keep the traceback text, which they show only with -vvv.
    if not isinstance(result.get("exception", ""), str):
        del result["exception"]
    return result


def selection_refusal(action: str, args: object) -> Optional[str]:
    """Why a task of module `action` (a name or FQCN) with arguments `args` (as given) must not run, or None: a
    selection option given as null, which the module would take as left out (null_refusal)."""
    prefix = SELECTING.get(action.rsplit(".", 1)[-1])
    if prefix is None or not isinstance(args, Mapping):
        return None
    refusal = null_refusal(args)
    return None if refusal is None else prefix + refusal


# ansible-core ships no type information: its ActionModule is Any to mypy.
class ActionModule(NormalAction):  # type: ignore[misc]
    """Runs the module with gpuops_nvidia_venv's Python where it exists on the host, else with the task's own.
    Refuses a null selection option before that (selection_refusal)."""

    def run(self, tmp: Optional[str] = None, task_vars: Optional[Dict[str, Any]] = None) -> Result:
        # Task.resolved_action: the module's FQCN however the task names it (short name under `collections:`).
        refusal = selection_refusal(self._task.resolved_action or self._task.action, self._task.args)
        if refusal:
            return {"failed": True, "changed": False, "msg": refusal}
        result: Result = super().run(tmp, task_vars)
        return result

    def _vars_with_interpreter(self, task_vars: Dict[str, Any], python: str) -> Dict[str, Any]:
        """A copy of `task_vars` whose ansible_python_interpreter (of the delegated host, if any) is `python`."""
        task_vars = dict(task_vars)
        if self._task.delegate_to:
            delegated = dict(task_vars.get("ansible_delegated_vars") or {})
            delegated[self._task.delegate_to] = dict(
                delegated.get(self._task.delegate_to) or {}, ansible_python_interpreter=python
            )
            task_vars["ansible_delegated_vars"] = delegated
        else:
            task_vars["ansible_python_interpreter"] = python
        return task_vars

    def _venv_python(self, task_vars: Dict[str, Any]) -> Optional[str]:
        own = task_vars
        if self._task.delegate_to:
            own = (task_vars.get("ansible_delegated_vars") or {}).get(self._task.delegate_to) or {}
        return venv_python(self._templar.template(own.get(VENV_VARIABLE, DEFAULT_VENV)))

    def _execute_module(
        self,
        module_name: Optional[str] = None,
        module_args: Optional[Dict[str, Any]] = None,
        tmp: Optional[str] = None,
        task_vars: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> Result:
        python = self._venv_python(task_vars) if task_vars is not None else None
        if task_vars is None or python is None or module_name not in (None, self._task.action):
            plain: Result = super()._execute_module(module_name, module_args, tmp, task_vars, **kwargs)
            return plain
        if kwargs.get("wrap_async") and not self._remote_file_exists(python):
            result = super()._execute_module(module_name, module_args, tmp, task_vars, **kwargs)
            return explain(
                result,
                [(python, VENV_VARIABLE, "not found"), (self._used_shebang(), "ansible_python_interpreter", None)],
            )
        display.vvv("gpuops.nvidia: %s with %s (%s)" % (self._task.action, python, VENV_VARIABLE))
        result = super()._execute_module(
            module_name, module_args, tmp, self._vars_with_interpreter(task_vars, python), **kwargs
        )
        if not interpreter_missing(result, python):
            return explain(result, [(python, VENV_VARIABLE, None)])
        display.vvv("gpuops.nvidia: %s not found; %s with the task's own interpreter" % (python, self._task.action))
        result = super()._execute_module(module_name, module_args, tmp, task_vars, **kwargs)
        fallback = self._used_shebang()
        return explain(
            result,
            [
                (python, VENV_VARIABLE, "not found"),
                (
                    fallback,
                    "ansible_python_interpreter",
                    "not found" if interpreter_missing(result, fallback) else None,
                ),
            ],
        )

    def _used_shebang(self) -> str:
        """The interpreter of the last module run (ActionBase records its shebang)."""
        return (getattr(self, "_used_interpreter", None) or "#!?").lstrip("#!").strip()
