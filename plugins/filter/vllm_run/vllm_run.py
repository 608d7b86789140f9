# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The run-state filters of the vllm_server role, found as gpuops.nvidia.vllm_run.NAME; the logic is in
plugins/plugin_utils/_vllm_run.py. Documentation: the .yml files beside this one.

Apart from the role's other filters (plugins/filter/vllm_server/) because the `when:` of nearly every task of the
role asks `phases` or `attempts`, in a worker process that compiles from source every file of the directory a filter
is looked up in and what those import (docs/architecture.md, "Filters"): _vllm_run alone, about 3 ms, where the
whole vllm_server directory costs about 100 ms."""

from __future__ import annotations

from typing import Any, Callable, Dict

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_run


class FilterModule:
    """The vllm_server role's run-state filters."""

    def filters(self) -> Dict[str, Callable[..., Any]]:
        return {
            "step": _vllm_run.step,
            "report": _vllm_run.report,
            "attempts": _vllm_run.attempts,
            "restores": _vllm_run.restores,
            "phases": _vllm_run.phases,
            "files": _vllm_run.files,
        }
