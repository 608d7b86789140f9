# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The option tables of _options (issue 42, item 1): each number default is written once in Python, and the copies that
documentation needs (the modules' DOCUMENTATION, the reset_gpus role's meta/argument_specs.yml and defaults/main.yml)
say the same. A default written again in the code of these modules fails here, with its file and line."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest
import yaml

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options

ROOT = pathlib.Path(__file__).resolve().parents[4]
GPU, DRAIN, DETACHED = _options.GPU, _options.DRAIN, _options.DETACHED

# Each module and the table its number options come from.
MODULES = {
    "gpu_kill": (GPU, ("grace_period", "kill_wait", "wait_timeout", "lock_timeout", "max_used_mib", "poll_interval")),
    "gpu_wait": (GPU, ("timeout", "progress_interval", "max_used_mib", "poll_interval", "driver_timeout")),
    "gpu_facts": (GPU, ("driver_timeout", "max_used_mib")),
    "gpu_guard": (GPU, ("driver_timeout", "max_used_mib")),
    "vllm_server_host": (GPU, ("driver_timeout", "max_used_mib")),
    "gpu_reset": (GPU, ("max_used_mib", "reset_timeout", "command_timeout", "driver_timeout")),
    "vllm_drain": (DRAIN, tuple(DRAIN)),
    "detached_process": (DETACHED, tuple(DETACHED)),
    "vllm_ready": (_options.READY, tuple(_options.READY)),
}
# The code that builds on the tables: none of it may write one of their defaults again.
CODE = [
    *(ROOT / "plugins/modules" / ("%s.py" % name) for name in MODULES),
    *(path for path in (ROOT / "plugins/module_utils/gpu").glob("*.py") if path.name != "_options.py"),
    *(ROOT / "plugins/module_utils/vllm" / name for name in ("_drain_run.py", "_detached_run.py", "_detached.py")),
    *(ROOT / "plugins/module_utils/vllm" / name for name in ("_guard.py", "_stop.py", "_drain.py")),
    *(ROOT / "plugins/module_utils/vllm" / name for name in ("_ready_run.py", "_readiness.py")),
    ROOT / "plugins/filter/inputs.py",
    ROOT / "plugins/action/gpu_wait.py",
    ROOT / "plugins/action/gpu_kill.py",
    ROOT / "plugins/plugin_utils/_numbers.py",
]
RESET_GPUS = ROOT / "roles/reset_gpus"
VLLM_SERVER = ROOT / "roles/vllm_server"


def documented_defaults(module):
    source = (ROOT / "plugins/modules" / ("%s.py" % module)).read_text()
    doc = yaml.safe_load(source.split('DOCUMENTATION = r"""', 1)[1].split('"""', 1)[0])
    return {name: option.get("default") for name, option in doc["options"].items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_modules_documentation_says_its_tables_defaults(module):
    table, names = MODULES[module]
    documented = documented_defaults(module)
    assert {name: documented.get(name) for name in names} == {name: table[name].default for name in names}


def test_the_reset_gpus_role_says_the_defaults_of_the_options_it_sets():
    variables = [name for name in _options.ROLE_NUMBERS if name.startswith("reset_gpus_")]
    wanted = _options.role_defaults(*variables)
    defaults = yaml.safe_load((RESET_GPUS / "defaults/main.yml").read_text())
    specs = yaml.safe_load((RESET_GPUS / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert {name: defaults.get(name) for name in variables} == wanted, "roles/reset_gpus/defaults/main.yml"
    assert {name: specs[name].get("default") for name in variables} == wanted, (
        "roles/reset_gpus/meta/argument_specs.yml"
    )


# The vllm_server role's number variables and the option each sets (its tasks pass it there). Those in
# VLLM_ROLE_OWN_DEFAULTS have the role's own default, written once in its defaults/main.yml: a redeploy waits for a
# model to load and for its GPUs longer than a lone module call. The others take their option's default.
VLLM_ROLE_NUMBERS = {
    "vllm_server_drain_timeout": (DRAIN, "timeout"),
    "vllm_server_drain_poll_interval": (DRAIN, "poll_interval"),
    "vllm_server_stop_timeout": (DRAIN, "grace_period"),
    "vllm_server_kill_wait": (DRAIN, "kill_wait"),
    "vllm_server_gpu_release_timeout": (GPU, "timeout"),
    "vllm_server_gpu_max_used_mib": (GPU, "max_used_mib"),
    "vllm_server_ready_timeout": (_options.READY, "timeout"),
    "vllm_server_ready_poll_interval": (_options.READY, "poll_interval"),
    "vllm_server_request_timeout": (_options.READY, "request_timeout"),
}
VLLM_ROLE_OWN_DEFAULTS = (
    "vllm_server_gpu_release_timeout",
    "vllm_server_ready_timeout",
    "vllm_server_ready_poll_interval",
    "vllm_server_request_timeout",
)


def test_the_vllm_server_role_says_the_defaults_of_the_options_it_sets():
    defaults = yaml.safe_load((VLLM_SERVER / "defaults/main.yml").read_text())
    specs = yaml.safe_load((VLLM_SERVER / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    wanted = {
        name: table[option].default
        for name, (table, option) in VLLM_ROLE_NUMBERS.items()
        if name not in VLLM_ROLE_OWN_DEFAULTS
    }
    assert {name: defaults.get(name) for name in wanted} == wanted, "roles/vllm_server/defaults/main.yml"
    assert {name: specs[name].get("default") for name in VLLM_ROLE_NUMBERS} == {
        name: defaults[name] for name in VLLM_ROLE_NUMBERS
    }, "roles/vllm_server/meta/argument_specs.yml"


def test_the_vllm_server_role_passes_each_number_variable_to_the_option_of_its_table():
    """The pairing above is the one the role's tasks make: each variable is the value of its option there."""
    tasks = "\n".join(path.read_text() for path in sorted((VLLM_SERVER / "tasks").glob("*.yml")))
    for variable, (_table, option) in VLLM_ROLE_NUMBERS.items():
        used = re.findall(r"^\s+(\w+): \"\{\{ (?:vllm_server_instance\.\w+ \| default\()?%s\b" % variable, tasks, re.M)
        assert used and option in used, (variable, option, used)


def copies(source, path="<source>"):
    """file:line of each number literal that gives an option of the tables (or a role variable that sets one) its own
    table default: `name=dict(..., default=10.0)`, `{"name": {"default": 10.0}}`, `def f(name: float = 10.0)`,
    `numbers(..., reset_gpus_grace_period=10)`."""
    defaults = {}
    for table in (GPU, DRAIN, DETACHED, _options.READY):
        for name, option in table.items():
            defaults.setdefault(name, set()).add(option.default)
    for variable, number in _options.role_defaults(*_options.ROLE_NUMBERS).items():
        defaults[variable] = {number}
    found = []

    def check(name, node):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
            node = next((k.value for k in node.keywords if k.arg == "default"), None)
        elif isinstance(node, ast.Dict):
            node = next((v for k, v in zip(node.keys, node.values) if getattr(k, "value", None) == "default"), None)
        value = getattr(node, "value", None)
        if isinstance(node, ast.Constant) and type(value) in (int, float) and value in defaults.get(name, ()):
            found.append("%s:%d %s=%r" % (path, node.lineno, name, value))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            # A spec entry, name=dict(default=...), or a role variable's default; other keywords pass values.
            for keyword in node.keywords:
                if isinstance(keyword.value, (ast.Call, ast.Dict)) or keyword.arg in _options.ROLE_NUMBERS:
                    check(keyword.arg, keyword.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                check(getattr(key, "value", None), value)
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)):
            arguments = node.args.args + node.args.kwonlyargs
            for argument, value in zip(arguments[len(arguments) - len(node.args.defaults) :], node.args.defaults):
                check(argument.arg, value)
            for argument, value in zip(node.args.kwonlyargs, node.args.kw_defaults):
                check(argument.arg, value)
    return found


def test_no_default_of_the_tables_is_written_again_in_the_code():
    assert [found for path in CODE for found in copies(path.read_text(), str(path.relative_to(ROOT)))] == []


@pytest.mark.parametrize(
    "source",
    [
        "spec = dict(grace_period=dict(type='float', default=10.0))",
        "def end(holders, grace_period: float = 10.0): pass",
        "def stop(pidfile, *, grace_period=30.0): pass",
        "values = numbers(given, reset_gpus_grace_period=10)",
        "spec = {'driver_timeout': {'type': 'float', 'default': 10.0}}",
        "bounds = {'wait_timeout': dict(type='float', default=60.0)}",
    ],
)
def test_a_second_copy_of_a_default_is_found(source):
    assert len(copies(source)) == 1, source


def test_gpu_facts_and_gpu_guard_refuse_a_driver_timeout_above_the_tables_bound():
    """A driver_timeout of 1e10 s crashed gpu_facts and gpu_guard ("timestamp out of range for platform time_t"), and
    100000 s let a hung driver hold them for a day: they take the GPU table's bound, as gpu_kill and gpu_wait do."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _facts_run
    from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _guard

    words = "driver_timeout=%s (must be at most 600 seconds)"
    for value in (1e10, 100000.0):
        outcome = _facts_run.run({"driver_timeout": value, "max_used_mib": 256, "recovery": True})
        assert outcome.failed and outcome.result["msg"] == "invalid option value: " + words % value, outcome
        guard = dict(vllm_instances=[], textfile=None, stall_seconds=30.0, request_timeout=5.0, driver_timeout=value)
        assert _guard.refusals(dict(guard, max_used_mib=256)) == ["invalid option value: " + words % value]
