# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What one filter of the collection costs the task that uses it.

ansible-core finds a collection filter by importing every file of the directory it is looked up in
(Jinja2Loader.get_with_context in ansible/plugins/loader.py: plugins/filter/ for gpuops.nvidia.NAME, without its
subdirectories; plugins/filter/SUB/ for gpuops.nvidia.SUB.NAME), compiled from source in each task's worker process.
The per-host checks of the reset_gpus and check_gpus variables (plugins/filter/inputs.py) are looked up in
plugins/filter/: nothing there may pull in the reports, the vllm_server and prepare_hosts logic, or what only the host
needs, such as the HTTP client of the vLLM servers (docs/architecture.md, "Filters").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

COLLECTIONS = str(Path(__file__).resolve().parents[4] / ".collections")
FILTERS = Path(COLLECTIONS) / "ansible_collections/gpuops/nvidia/plugins/filter"
PACKAGE = "ansible_collections.gpuops.nvidia.plugins."
LOOKUP = """
import json, sys
from ansible.plugins.loader import filter_loader, init_plugin_loader
init_plugin_loader([%r])
assert filter_loader.get(sys.argv[1]) is not None, sys.argv[1]
print(json.dumps(sorted(sys.modules)))
"""
# Only the host reads and ends processes, or talks to the servers.
HOST_ONLY = (
    "ansible.module_utils.urls",
    PACKAGE + "module_utils.vllm._http",
    PACKAGE + "module_utils.vllm._vllm_host",
    PACKAGE + "module_utils.gpu._terminate",
    PACKAGE + "module_utils.vllm._detached",
)
# What the filters of the subdirectories import: 16-40 ms each in a worker, measured with python -X importtime.
NOT_PER_HOST = (
    PACKAGE + "module_utils.gpu._report",
    PACKAGE + "module_utils.gpu._owners",
    PACKAGE + "plugin_utils._vllm_plan",
    PACKAGE + "plugin_utils._vllm_checks",
    PACKAGE + "module_utils.vllm._speculative",
    "packaging.requirements",
)


def imported(name):
    found = subprocess.run(
        [sys.executable, "-c", LOOKUP % COLLECTIONS, name], capture_output=True, text=True, check=True
    )
    return set(json.loads(found.stdout))


def test_the_per_host_checks_import_only_the_top_level_filter_files():
    modules = imported("gpuops.nvidia.reset_gpus_plan")
    top = {PACKAGE + "filter." + path.stem for path in FILTERS.glob("*.py")}
    subdirectories = {path.name for path in FILTERS.iterdir() if path.is_dir() and path.name != "__pycache__"}
    # The premise: the lookup imported every file of plugins/filter/, and no file of a subdirectory.
    assert top and top <= modules
    assert subdirectories and not [m for m in modules if m.startswith(PACKAGE + "filter.") and m not in top]
    assert sorted(modules & set(HOST_ONLY + NOT_PER_HOST)) == []


@pytest.mark.parametrize(
    "name, own",
    [
        ("gpuops.nvidia.vllm_server.plan", "vllm_server.vllm_server"),
        ("gpuops.nvidia.vllm_run.phases", "vllm_run.vllm_run"),
        ("gpuops.nvidia.prepare_hosts.plan", "prepare_hosts.prepare_hosts"),
        ("gpuops.nvidia.reports.reset_gpus_result", "reports.reports"),
    ],
)
def test_a_filter_of_a_subdirectory_imports_its_own_file_and_nothing_of_the_host(name, own):
    modules = imported(name)
    filters = {m for m in modules if m.startswith(PACKAGE + "filter.")}
    assert PACKAGE + "filter." + own in filters
    assert not [m for m in filters if not m.startswith(PACKAGE + "filter." + own.split(".")[0])], filters
    assert sorted(modules & set(HOST_ONLY)) == []


CALL = """
import json, sys
from ansible.plugins.loader import filter_loader, init_plugin_loader
init_plugin_loader([%r])
found = filter_loader.get(sys.argv[1])
getattr(found, "j2_function", found)(*json.loads(sys.argv[2]))
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize(
    "name, args",
    [
        ("gpuops.nvidia.vllm_run.phases", [["all"], []]),
        ("gpuops.nvidia.vllm_run.attempts", [[], "a"]),
        ("gpuops.nvidia.reports.reset_gpus_state", [{}, {}, 120]),
    ],
)
def test_the_filters_of_when_conditions_import_only_what_they_call(name, args):
    # Asked in the `when:` of nearly every task of the vllm_server role, and of the reset_gpus role's common path:
    # each worker process compiles what the call imports (plugins/filter/vllm_server/vllm_server.py).
    found = subprocess.run(
        [sys.executable, "-c", CALL % COLLECTIONS, name, json.dumps(args)], capture_output=True, text=True, check=True
    )
    modules = set(json.loads(found.stdout))
    assert sorted(modules & set(HOST_ONLY + NOT_PER_HOST + (PACKAGE + "plugin_utils._vllm_report",))) == []


def test_the_state_of_a_reset_that_gpu_kill_finished_imports_no_module_utils():
    # The role's common path: gpu_kill released the GPUs within its slice. The `when:` of the tasks skipped then asks
    # reset_gpus_state on every host, each in its own worker; only a slice that did not release them needs _wait.
    released = {"released": True, "wait": {"elapsed_s": 0.4, "gpus": []}}
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            CALL % COLLECTIONS,
            "gpuops.nvidia.reports.reset_gpus_state",
            json.dumps([released, {}, 120]),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert [m for m in json.loads(found.stdout) if m.startswith(PACKAGE + "module_utils.")] == []
