# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run of gpu_facts: check the options, take one look (_gpus.Inspector.snapshot), return it as facts.

`run` returns an _outcome.Outcome; nothing here calls exit_json or fail_json.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _advice, _gpus, _options, _outcome

# The number options, checked before the look.
NUMBERS = ("driver_timeout", "max_used_mib")


def argument_spec() -> Dict[str, Any]:
    """gpu_facts' argument spec (driver_timeout and max_used_mib from _options.GPU)."""
    return dict(recovery=dict(type="bool", default=True), **_options.spec(_options.GPU, *NUMBERS))


def run(params: Mapping[str, Any]) -> _outcome.Outcome:
    """gpu_facts with `params` (the module's validated options): the look as the fact `nvidia`, and its notes."""
    try:
        _options.check(_options.GPU, params, NUMBERS)
    except _options.OptionError as exc:
        return _outcome.refused(str(exc))
    inspector = _gpus.Inspector(driver_timeout=params["driver_timeout"])
    try:
        view = inspector.snapshot(tolerance_mib=params["max_used_mib"], recovery=params["recovery"])
    finally:
        inspector.close()
    warnings = _advice.exited_notes(view) + view["scan_problems"]
    if not view["driver"]["available"]:
        warnings.append(
            "NVIDIA driver library not usable (%s): GPU memory is unknown; holders are the CUDA processes "
            "holding device files, from the /proc scan alone" % view["driver"]["error"]
        )
    return _outcome.Outcome(dict(changed=False, ansible_facts={"nvidia": view}), warnings=warnings)
