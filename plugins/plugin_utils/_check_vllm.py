# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What playbooks/check_vllm.yml watches on a host, on the controller.

check_vllm_plan(instances, given, min_acceptance_rate) -> {"problems", "window", "request_timeout", "bound",
"watches"}: the variables checked by name (_numbers.numbers), and a watch per instance with a speculative config, at
the URL where a check on the host reaches it (_vllm_address.local_url, as the role's checks reach it).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_address import local_url
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._numbers import Refused, number_or_none, numbers

# The playbook's number variables: their defaults (seconds), which are also the examples of a refusal.
SECONDS = {"check_vllm_window": 60, "check_vllm_request_timeout": 10}
NOT_SECONDS = "%s=%s is not a number of seconds above 0 (for example %s=%s): nothing was checked"
# What one watch may take beyond its window: at most four requests (the counters and the served names, at its start
# and at its end), each ended at check_vllm_request_timeout in all, and 30 s for the module's start.
REQUESTS_PER_WATCH = 4
MODULE_START_S = 30


def _seconds(given: Mapping[str, Any]) -> Dict[str, Any]:
    """{variable: seconds} of SECONDS, given or default, or {variable: None} for one that is refused, and the
    problems (a value that is not a number of seconds above 0, named as the operator set it)."""
    found: Dict[str, Any] = {"problems": []}
    for name, default in SECONDS.items():
        value = given.get(name, default)  # an explicit null is refused, as the operator set it
        try:
            defaults: Dict[str, Any] = {name: default}
            found[name] = numbers({name: value}, positive=(name,), **defaults)[name]
        except Refused:
            found[name] = None
            found["problems"].append(NOT_SECONDS % (name, value, name, default))
    return found


def _watch(instance: Mapping[str, Any], min_acceptance_rate: Any) -> Dict[str, Any]:
    """The watch of one instance with a speculative config: its name, URL, served model name and threshold."""
    rate = instance.get("min_acceptance_rate")
    rate = min_acceptance_rate if rate is None else rate
    return {
        "name": instance.get("name"),
        "url": local_url(instance.get("host") or None, instance.get("port")),
        "served_model_name": instance.get("served_model_name") or instance.get("name"),
        "min_acceptance_rate": rate,
        # as `| float > 0`: a threshold that is no number is 0, which skips the instance
        "watched": (number_or_none(rate) or 0) > 0,
    }


def check_vllm_plan(
    instances: Optional[Sequence[Any]], given: Mapping[str, Any], min_acceptance_rate: Any = 0.1
) -> Dict[str, Any]:
    """See the module docstring. `given`: check_vllm_window and check_vllm_request_timeout where set.
    `min_acceptance_rate`: vllm_server_min_acceptance_rate, the threshold of an instance that sets none."""
    seconds = _seconds(given)
    window, timeout = seconds["check_vllm_window"], seconds["check_vllm_request_timeout"]
    bound = None
    if window is not None and timeout is not None:
        bound = int(math.ceil(window + REQUESTS_PER_WATCH * timeout + MODULE_START_S))
    speculative = [
        instance for instance in instances or [] if isinstance(instance, dict) and instance.get("speculative_config")
    ]
    watches: List[Dict[str, Any]] = [_watch(instance, min_acceptance_rate) for instance in speculative]
    return {
        "problems": seconds["problems"],
        "window": window,
        "request_timeout": timeout,
        "bound": bound,
        "watches": watches,
    }
