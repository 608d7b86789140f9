# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The choice of the modules' Python (plugins/plugin_utils/_interpreter.py); the runs are in
tests/integration/test_prepare_hosts.py. The refusal of a null selection option on the controller; the ad hoc run is
in tests/integration/test_selection_refusals.py."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from ansible.plugins.action.normal import ActionModule as NormalAction

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _interpreter

PLUGINS = Path(__file__).resolve().parents[4] / "plugins"
VENV_PY = "/opt/gpuops-nvidia/venv/bin/python"


def test_every_module_has_an_action_plugin_that_picks_the_venv_python():
    modules = sorted(path.stem for path in (PLUGINS / "modules").glob("*.py") if not path.stem.startswith("_"))
    actions = sorted(path.stem for path in (PLUGINS / "action").glob("*.py"))
    assert modules and actions == modules
    for name in actions:
        tree = ast.parse((PLUGINS / "action" / (name + ".py")).read_text())
        imports = [
            (node.module, alias.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        ]
        assert ("ansible_collections.gpuops.nvidia.plugins.plugin_utils._interpreter", "ActionModule") in imports, name


def test_venv_python_is_the_venvs_bin_python_and_an_empty_value_turns_it_off():
    assert _interpreter.venv_python("/opt/gpuops-nvidia/venv") == VENV_PY
    assert _interpreter.venv_python("/srv/py/ ") == "/srv/py/bin/python"
    for off in ("", None, False, "none", "False"):
        assert _interpreter.venv_python(off) is None


def test_only_a_run_that_never_started_the_venv_python_counts_as_missing():
    dash = {"failed": True, "rc": 127, "module_stderr": "/bin/sh: 1: %s: not found\n" % VENV_PY, "module_stdout": ""}
    bash = {"failed": True, "rc": 127, "module_stderr": "bash: line 1: %s: No such file or directory" % VENV_PY}
    assert _interpreter.interpreter_missing(dash, VENV_PY) and _interpreter.interpreter_missing(bash, VENV_PY)
    # A module that failed by itself, or another command that was not found, is not a missing interpreter.
    assert not _interpreter.interpreter_missing({"failed": True, "rc": 1, "module_stderr": VENV_PY}, VENV_PY)
    assert not _interpreter.interpreter_missing(
        {"failed": True, "rc": 127, "module_stderr": "/bin/sh: 1: sudo: not found"}, VENV_PY
    )
    assert not _interpreter.interpreter_missing({"changed": False, "gpus": []}, VENV_PY)


def test_a_host_without_the_libraries_gets_one_message_naming_each_interpreter_and_the_next_step():
    failed = {
        "failed": True,
        "msg": "Failed to import the required Python library (psutil) on gpu01's Python /usr/bin/python3. "
        "Please read the module documentation (host gpu01, interpreter /usr/bin/python3)",
        "exception": object(),
    }
    result = _interpreter.explain(
        failed, [(VENV_PY, "gpuops_nvidia_venv", "not found"), ("/usr/bin/python3", "ansible_python_interpreter", None)]
    )
    assert result["msg"].startswith(
        "no Python with nvidia-ml-py and psutil for gpuops.nvidia on this host; tried "
        "%s (gpuops_nvidia_venv): not found; then /usr/bin/python3 (ansible_python_interpreter): "
        "lacks psutil. Next step: ansible-playbook -i INVENTORY gpuops.nvidia.prepare_hosts -b" % VENV_PY
    )
    assert "exception" not in result and result["interpreters_tried"] == [VENV_PY, "/usr/bin/python3"]
    assert failed["msg"].startswith("Failed to import")  # the module's result is not changed in place


def test_other_results_pass_unchanged():
    ok = {"changed": False, "gpus": [{"index": 0}]}
    busy = {"failed": True, "msg": "GPU 1: 4000 MiB used, held by PID 4"}
    for result in (ok, busy):
        assert _interpreter.explain(result, [(VENV_PY, "gpuops_nvidia_venv", None)]) is result
    # Both interpreters missing: the same one message.
    gone = {"failed": True, "rc": 127, "msg": "The module interpreter '/usr/bin/python3' was not found."}
    result = _interpreter.explain(
        gone,
        [(VENV_PY, "gpuops_nvidia_venv", "not found"), ("/usr/bin/python3", "ansible_python_interpreter", "not found")],
    )
    assert "/usr/bin/python3 (ansible_python_interpreter): not found. Next step:" in result["msg"]


# --- a null selection option, refused on the controller (issue 34 item 3) -----------------------------------------


def action(name, args):
    """The collection's action plugin for a task of module `name` (as written) with `args` (as given)."""
    task = SimpleNamespace(resolved_action="gpuops.nvidia." + name.rsplit(".", 1)[-1], action=name, args=args)
    return _interpreter.ActionModule(task, *(mock.MagicMock() for _part in range(5)))


@pytest.fixture
def module_runs(monkeypatch):
    """The arguments of each task that went on to the module (NormalAction.run)."""
    runs = []
    monkeypatch.setattr(NormalAction, "run", lambda self, tmp=None, task_vars=None: runs.append(self._task.args) or {})
    return runs


@pytest.mark.parametrize(
    "args, message",
    [
        ({"gpus": None}, "gpus is null"),
        ({"pids": None}, "pids is null"),
        ({"match": None}, "match is null"),
        ({"users": None}, "users is null"),
        ({"units": None}, "units is null"),
        ({"containers": None, "pods": None}, "containers, pods are null"),
        ({"slurm_jobs": None}, "slurm_jobs is null"),
        ({"gpus": None, "max_used_mib": 5}, "gpus is null"),
    ],
)
@pytest.mark.parametrize(
    "name, prefix",
    [("gpuops.nvidia.gpu_kill", "nothing was signalled: "), ("gpu_wait", ""), ("gpu_reset", "no GPU was reset: ")],
)
def test_a_null_selection_option_is_refused_before_the_module_runs(module_runs, args, message, name, prefix):
    result = action(name, args).run(task_vars={})
    assert result["failed"] is True and result["changed"] is False
    assert result["msg"] == (
        prefix + message + ": a selection that names nothing is refused (omit the option to select any)"
    )
    assert module_runs == []


def test_other_arguments_and_other_modules_go_to_the_module(module_runs):
    # What the module sees it refuses itself (a blank match: _select.check_not_empty); options left out select any.
    for name, args in (
        ("gpu_kill", {"gpus": [0], "pids": [5]}),
        ("gpu_kill", {}),
        ("gpu_wait", {"match": " "}),
        ("gpu_facts", {"gpus": None}),
        ("gpu_kill", "gpus=0"),
    ):
        assert action(name, args).run(task_vars={}) == {}
    assert len(module_runs) == 5
