# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""roles/reset_gpus/templates/metrics.prom.j2 (the node_exporter textfile), rendered with Jinja2 as the role renders
it: its success gauge follows the run's outcome, the guarded GPU reset included."""

from __future__ import annotations

import datetime
from pathlib import Path

import jinja2
import pytest

TEMPLATE = Path(__file__).resolve().parents[2] / "roles" / "reset_gpus" / "templates" / "metrics.prom.j2"
GPU = {"index": 0, "uuid": "GPU-0", "memory_used_mib": 0, "holder_pids": [], "unexplained_mib": 0}


def render(outcome, phase=None, released=True):
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined)
    template = environment.from_string(TEMPLATE.read_text())
    return template.render(
        reset_gpus_kill={"elapsed_s": 0.5, "gpus": [0], "signalled": []},
        _reset_gpus_state={"last_wait": {"released": released}, "total": 1.0},
        _reset_gpus_result={"after": {"gpus": [GPU]}, "outcome": outcome, "phase": phase},
        now=lambda: datetime.datetime(2026, 12, 7),
    )


@pytest.mark.parametrize(
    "outcome, phase, released, success",
    [
        ("released", None, True, 1),
        ("no_holders", None, True, 1),
        ("failed", "free", False, 0),
        # Released by the wait, but the GPU reset the driver asked for failed: the host failed, and so did the reset.
        ("failed", "gpu_reset", True, 0),
    ],
)
def test_the_success_gauge_follows_the_runs_outcome(outcome, phase, released, success):
    text = render(outcome, phase, released)
    assert "gpuops_nvidia_reset_success %d\n" % success in text, text
    assert 'gpuops_nvidia_gpu_memory_used_bytes{gpu="0",uuid="GPU-0"} 0\n' in text
