# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The vllm_server plan checks the token budget with vLLM's defaults for the class of the instance's first GPU."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_plan as p

SETTINGS = {
    "service_manager": "detached",
    "vllm_executable": "/usr/local/bin/vllm",
    "stop_timeout": 60,
    "min_acceptance_rate": 0.1,
    "unit_prefix": "vllm-",
    "state_dir": "/var/lib/vllm",
    "config_dir": "/etc/vllm",
    "log_dir": "/var/log/vllm",
    "user": "vllm",
    "systemd_dir": "/etc/systemd/system",
}
DRAFTER = json.loads((Path(__file__).parents[3] / "fixtures" / "drafters" / "dflash-qwen3" / "config.json").read_text())
DRAFTERS = [
    {"model": "/models/d", "drafter_config": None, "path": "/models/d/config.json", "config": DRAFTER, "error": None}
]
# The simulator's H100 (tests/sim: the name NVML gives an H100 80GB HBM3, and its memory)
H100 = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}


def nvidia(*gpus):
    return {"driver": {"available": True}, "gpus": list(gpus), "holders": []}


def host(gpus):
    return {
        "name": "gpu07",
        "systemd": False,
        "deployed": {},
        "running": {},
        "ports": {},
        "drafters": DRAFTERS,
        "paths": {
            "/models/q": {"exists": True, "isdir": True, "executable": False},
            "/usr/local/bin/vllm": {"exists": True, "isdir": False, "executable": True},
        },
        "vllm_versions": {"/usr/local/bin/vllm": {"version": "0.33.0", "source": "METADATA", "error": None}},
        "nvidia": nvidia(*gpus),
    }


def instance(**extra):
    return dict({"name": "a", "model": "/models/q", "port": 8000, "gpus": [0]}, **extra)


def test_the_budget_on_an_h100_names_its_class_and_not_the_users_value():
    spec = {"method": "dflash", "model": "/models/d", "num_speculative_tokens": 15}
    given = instance(speculative_config=spec, extra_args=["--max-num-batched-tokens", "16"])
    planned = p.plan([given], host([H100]), SETTINGS)
    assert "vLLM 0.33.0 expects at most 14 with max_num_batched_tokens 16: dflash takes" in planned["problems"][0]
    assert "default" not in planned["problems"][0]
    # vLLM's 8192 on an H100 leaves no slot for K + 1 = 8192 (a warning for some classes where the GPU is unknown)
    wide = instance(speculative_config=dict(spec, num_speculative_tokens=8191))
    planned = p.plan([wide], host([H100]), SETTINGS)
    assert "max_num_batched_tokens 8192 (vLLM's default for H100/H200 class (70-160 GiB))" in planned["problems"][0]


def test_the_gpu_class_is_the_first_gpus_and_none_for_a_mig_instance():
    a100 = {"index": 1, "uuid": "GPU-1", "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920}
    assert p._gpu_class([0, 1], nvidia(H100, a100)) == "H100/H200 class (70-160 GiB)"
    assert p._gpu_class([1, 0], nvidia(H100, a100)) == "GPUs under 70 GiB and A100"
    assert p._gpu_class(["MIG-6a1e0c4f"], nvidia(H100)) is None
    assert p._gpu_class([0], nvidia({"index": 0, "uuid": "GPU-0"})) is None
