# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What one run of a module comes to, and the one way a module exits with it.

Each module's `run(params, ...)` (gpu/_kill.py, gpu/_wait_run.py, gpu/_facts_run.py, gpu/_guard_ledger.py,
vllm/_guard.py, vllm/_drain_run.py, vllm/_detached_run.py, vllm/_ready_run.py, vllm/_acceptance_run.py,
vllm/_host_run.py, vllm/_speculative.py, vllm/_vllm_files.py, vllm/_container_run.py) returns an Outcome and never calls exit_json or
fail_json; the module's main() passes it to `exit_with`.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable


class Outcome:
    """A module's result: `result` (the result dict, with "msg"), `failed` and `warnings`."""

    def __init__(self, result: Dict[str, Any], failed: bool = False, warnings: Iterable[str] = ()) -> None:
        self.result = result
        self.failed = failed
        self.warnings = list(warnings)


def refused(msg: str, **result: Any) -> Outcome:
    """A failed Outcome with `msg` and nothing else done."""
    return Outcome(dict(msg=msg, **result), failed=True)


def exit_with(module: Any, outcome: Outcome) -> None:
    """module.warn each warning, then fail_json or exit_json with the result (an AnsibleModule; never returns)."""
    for warning in outcome.warnings:
        module.warn(warning)
    if outcome.failed:
        module.fail_json(**outcome.result)
    module.exit_json(**outcome.result)
