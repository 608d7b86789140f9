# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The guard's decisions on the controller (docs/guard.md), found as gpuops.nvidia.guard.NAME:

- instances: a host's vllm_server_instances as gpu_guard's vllm_instances (name, the URL the host reaches it at).
- plan: Alertmanager's webhook payload as the orphans each host of the inventory is asked to free, and the
  refusals of what cannot be acted on.
- host_decision: on one host, what the alert names and what the host shows now, as the PIDs to end (each with its
  start time) and the refusals.
- host_lines: one host's log lines, every alert in exactly one (refused, done, or failed).
- outcomes: the host_lines of the hosts of a run together (a failure line for a host that has none).

Pure: no I/O. Every refusal says which alert asked for what.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._guard_plan import (
    host_decision,
    host_lines,
    instances,
    outcomes,
    plan,
)


class FilterModule(object):
    """The guard's controller-side decisions."""

    def filters(self) -> Dict[str, Callable[..., Any]]:
        return {
            "instances": instances,
            "plan": plan,
            "host_decision": host_decision,
            "host_lines": host_lines,
            "outcomes": outcomes,
        }
