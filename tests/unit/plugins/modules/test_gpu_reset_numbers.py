# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_reset's numbers: refused with the bounds of the GPU option table before the driver is asked anything."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpu_reset
from ansible_collections.gpuops.nvidia.plugins.modules import gpu_reset
from module_main import run_main


@pytest.mark.parametrize(
    "args, words",
    [
        ({"reset_timeout": 7200}, "reset_timeout=7200.0 (must be at most 3600 seconds)"),
        ({"command_timeout": 0}, "command_timeout=0.0 (must be greater than 0)"),
        ({"driver_timeout": 601}, "driver_timeout=601.0 (must be at most 600 seconds)"),
        ({"max_used_mib": -1}, "max_used_mib=-1 (must not be negative)"),
    ],
)
def test_bad_numbers_are_refused_before_anything_is_done(capsys, monkeypatch, args, words):
    monkeypatch.setattr(_gpu_reset, "run", lambda *_: pytest.fail("gpu_reset ran with a refused number"))
    code, result = run_main(gpu_reset, capsys, args)
    assert code == 1 and result["failed"] is True and words in result["msg"], result
