# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run of vllm_server_host: check the options, read the host in one pass (_vllm_host) with its GPUs (gpu/_gpus).

`run` returns a gpu/_outcome.Outcome; nothing here calls exit_json or fail_json. `run_command(argv)` -> (rc, out,
err) and `which(name)` -> path are AnsibleModule's, for `systemctl show`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _advice, _gpus, _options, _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_host

# The number options, checked before anything is read.
NUMBERS = ("request_timeout", "max_used_mib", "driver_timeout")
RunCommand = Callable[[List[str]], Tuple[int, str, str]]
Which = Callable[[str], Optional[str]]


def argument_spec() -> Dict[str, Any]:
    """vllm_server_host's argument spec (max_used_mib and driver_timeout from _options.GPU)."""
    return dict(
        instances=dict(type="list", elements="dict", required=True),
        paths=dict(type="list", elements="path", default=[]),
        executables=dict(type="list", elements="path", default=[]),
        drafters=dict(type="list", elements="dict", default=[]),
        images=dict(type="list", elements="dict", default=[]),
        config_dir=dict(type="path", required=True),
        state_dir=dict(type="path", required=True),
        log_dir=dict(type="path", required=True),
        unit_prefix=dict(type="str", default="vllm-"),
        systemd_dir=dict(type="path", default="/etc/systemd/system"),
        request_timeout=dict(type="float", default=5.0),
        **_options.spec(_options.GPU, "max_used_mib", "driver_timeout"),
    )


def run(
    params: Mapping[str, Any], run_command: RunCommand, which: Which, check_libraries: Callable[[], None]
) -> _outcome.Outcome:
    """vllm_server_host with `params` (the module's validated options): what the host has, in one look.
    `check_libraries()` fails the module where the driver's Python libraries are missing, after the numbers' check."""
    try:
        # request_timeout is this module's own; the others are the GPU table's, with its bounds.
        _options.check_numbers(**_options.bounds(_options.GPU, NUMBERS[1:]), **{name: params[name] for name in NUMBERS})
    except _options.OptionError as exc:
        return _outcome.refused(str(exc))
    check_libraries()

    def systemctl(unit: str) -> Dict[str, str]:
        binary = which("systemctl")
        if binary is None:
            return {}
        rc, out, _err = run_command([binary, "show", "--property=LoadState,ActiveState,MainPID", unit])
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line) if rc == 0 else {}

    inspector = _gpus.Inspector(driver_timeout=params["driver_timeout"])
    try:
        result = _vllm_host.read_host(params, inspector, systemctl)
    finally:
        inspector.close()
    warnings = _advice.exited_notes(result["nvidia"]) + result["nvidia"]["scan_problems"]
    return _outcome.Outcome(dict(changed=False, **result), warnings=warnings)
