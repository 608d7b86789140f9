# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters of the vllm_server role, found as gpuops.nvidia.vllm_server.NAME. The logic is in plugins/plugin_utils:
_vllm_checks (the checks), _vllm_plan (what to ask the host, what to deploy), _vllm_run (the run-state of an
instance, phase by phase), _vllm_report (entries, summary, failures), _check_vllm (what playbooks/check_vllm.yml
watches). Documentation: the .yml files beside this one. In a subdirectory of plugins/filter/ so that a lookup of the
collection's other filters does not import these (docs/architecture.md, "Filters")."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Tuple

PLUGIN_UTILS = "ansible_collections.gpuops.nvidia.plugins.plugin_utils."
# Each filter: (its module in plugins/plugin_utils, its function).
FILTERS: Dict[str, Tuple[str, str]] = {
    "check": ("_vllm_checks", "vllm_server_check"),
    "host_request": ("_vllm_plan", "host_request"),
    "plan": ("_vllm_plan", "plan"),
    "entry": ("_vllm_report", "entry"),
    "summary": ("_vllm_report", "summary_lines"),
    "failures": ("_vllm_report", "failures"),
    "failure": ("_vllm_report", "failure"),
    "run": ("_vllm_run", "step"),
    "report": ("_vllm_run", "report"),
    "attempts": ("_vllm_run", "attempts"),
    "restores": ("_vllm_run", "restores"),
    "phases": ("_vllm_run", "phases"),
    "check_vllm_plan": ("_check_vllm", "check_vllm_plan"),
}


def deferred(module: str, function: str) -> Callable[..., Any]:
    """`function` of plugins/plugin_utils/`module`, imported when the filter is first called.

    Ansible runs each task in a new worker process, and its collection loader compiles a collection's Python from
    source there (it keeps no bytecode). Imported here, all five modules cost every task that uses any of these
    filters about 100 ms of CPU; deferred, a `when:` that asks `phases` or `attempts` compiles _vllm_run alone."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(PLUGIN_UTILS + module), function)(*args, **kwargs)

    call.__name__ = call.__qualname__ = function
    return call


class FilterModule:
    """The vllm_server role's filters."""

    def filters(self) -> Dict[str, Callable[..., Any]]:
        return {name: deferred(module, function) for name, (module, function) in FILTERS.items()}
