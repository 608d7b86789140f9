# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The vllm_container module's run: an instance's container started or removed through its runtime (_container).

`run` returns a gpu/_outcome.Outcome; nothing here calls exit_json or fail_json.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _container


def argument_spec() -> Dict[str, Any]:
    """The vllm_container module's options (its DOCUMENTATION says what each means)."""
    return dict(
        runtime=dict(type="str", choices=["podman", "docker"], required=True),
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["started", "absent"], default="started"),
        argv=dict(type="list", elements="str"),
        environment=dict(type="dict", default={}),
        timeout=dict(type="float", default=60.0),
    )


def run(params: Mapping[str, Any], check_mode: bool) -> _outcome.Outcome:
    """Start the container (state started: changed unless it runs already in check mode) or remove it (absent)."""
    runtime, name = params["runtime"], params["name"]
    try:
        found = _container.inspect(runtime, name)
        if params["state"] == "absent":
            if check_mode or found is None:
                return _outcome.Outcome(dict(changed=found is not None, container=found))
            return _outcome.Outcome(dict(changed=True, container=_container.stop(runtime, name, params["timeout"])))
        if check_mode:
            return _outcome.Outcome(dict(changed=not (found and found["running"]), container=found))
        started = _container.start(runtime, name, params["argv"], params["environment"])
    except (_container.ContainerError, ValueError) as exc:
        return _outcome.refused(str(exc))
    return _outcome.Outcome(dict(changed=True, container=started))
