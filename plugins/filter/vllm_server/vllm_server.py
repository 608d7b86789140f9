# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters of the vllm_server role, found as gpuops.nvidia.vllm_server.NAME. The logic is in plugins/plugin_utils:
_vllm_checks (the checks), _vllm_plan (what to ask the host, what to deploy), _vllm_report (entries, summary,
failures), _check_vllm (what playbooks/check_vllm.yml watches). Documentation: the .yml files beside this one. In a
subdirectory of plugins/filter/ so that a lookup of the collection's other filters does not import these, and apart
from the run-state filters that nearly every task asks (plugins/filter/vllm_run/; docs/architecture.md, "Filters")."""

from __future__ import annotations

from typing import Any, Callable, Dict

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _check_vllm, _vllm_checks, _vllm_plan, _vllm_report


class FilterModule:
    """The vllm_server role's filters."""

    def filters(self) -> Dict[str, Callable[..., Any]]:
        return {
            "check": _vllm_checks.vllm_server_check,
            "host_request": _vllm_plan.host_request,
            "plan": _vllm_plan.plan,
            "entry": _vllm_report.entry,
            "summary": _vllm_report.summary_lines,
            "failures": _vllm_report.failures,
            "failure": _vllm_report.failure,
            "check_vllm_plan": _check_vllm.check_vllm_plan,
        }
