# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/modules/vllm_server_host.py: its numbers are checked before it reads anything."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus
from ansible_collections.gpuops.nvidia.plugins.modules import vllm_server_host
from module_main import run_main


@pytest.mark.parametrize(
    "numbers, message",
    [
        ({"driver_timeout": -1}, "driver_timeout=-1.0 (must be greater than 0)"),
        ({"max_used_mib": -5}, "max_used_mib=-5 (must not be negative)"),
        ({"request_timeout": float("nan")}, "request_timeout=nan (must be a finite number)"),
        # The GPU table's bound (_options.GPU), as gpu_kill and gpu_wait have it.
        ({"driver_timeout": 1e10}, "driver_timeout=10000000000.0 (must be at most 600 seconds)"),
    ],
)
def test_bad_numbers_are_refused_before_the_host_is_read(capsys, monkeypatch, tmp_path, numbers, message):
    monkeypatch.setattr(_gpus, "Inspector", lambda **_kwargs: pytest.fail("the host was read"))
    directories = {key: str(tmp_path / key) for key in ("config_dir", "state_dir", "log_dir")}
    code, result = run_main(vllm_server_host, capsys, dict({"instances": []}, **directories, **numbers))
    assert code == 1 and result["msg"] == "invalid option value: " + message
