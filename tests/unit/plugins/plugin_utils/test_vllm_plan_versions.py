# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The vllm_server plan per vLLM release: each instance is validated against the facts of the release its executable
runs (what vllm_server_host read), a newer release is warned about, an older one is refused."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_plan as p

SETTINGS = {
    "service_manager": "detached",
    "vllm_executable": "/opt/vllm-0.33/bin/vllm",
    "stop_timeout": 60,
    "min_acceptance_rate": 0.1,
    "unit_prefix": "vllm-",
    "state_dir": "/var/lib/vllm",
    "config_dir": "/etc/vllm",
    "log_dir": "/var/log/vllm",
    "user": "vllm",
    "systemd_dir": "/etc/systemd/system",
}
V33, V34 = "/opt/vllm-0.33/bin/vllm", "/opt/vllm-0.34/bin/vllm"
DRAFTER = json.loads((Path(__file__).parents[3] / "fixtures" / "drafters" / "dflash-qwen3" / "config.json").read_text())
DFLASH = {"method": "dflash", "model": "/models/d"}
DRAFTERS = [
    {"model": "/models/d", "drafter_config": None, "path": "/models/d/config.json", "config": DRAFTER, "error": None}
]


def host(versions, **extra):
    """What vllm_server_host returns, with `versions` {executable: version text, or an error as ("error", why)}."""
    read = {}
    for path, version in versions.items():
        error = version[1] if isinstance(version, tuple) else None
        read[path] = {"version": None if error else version, "source": None if error else "METADATA", "error": error}
    found = {
        "name": "gpu07",
        "systemd": False,
        "deployed": {},
        "running": {},
        "ports": {},
        "drafters": DRAFTERS,
        "paths": dict(
            [("/models/q", {"exists": True, "isdir": True, "executable": False})]
            + [(path, {"exists": True, "isdir": False, "executable": True}) for path in versions]
        ),
        "vllm_versions": read,
        "nvidia": {"driver": {"available": True}, "gpus": [{"index": i, "uuid": "GPU-%d" % i} for i in range(4)]},
    }
    found.update(extra)
    return found


def instance(name="a", gpus=(0, 1), port=8000, **extra):
    return dict({"name": name, "model": "/models/q", "port": port, "gpus": list(gpus)}, **extra)


def plan(instances, versions, **settings):
    return p.plan(instances, host(versions), dict(SETTINGS, **settings))


def test_the_host_is_asked_for_each_executables_release():
    request = p.host_request(
        [instance(), instance("b", vllm_executable=V34), instance("c", vllm_executable="vllm")], SETTINGS
    )
    assert request["executables"] == [V33, V34]


def test_a_plugin_method_is_accepted_on_a_0_34_instance_and_refused_on_a_0_33_one():
    spec = {"method": "my_plugin_drafter", "num_speculative_tokens": 4}
    planned = plan(
        [instance(speculative_config=spec, vllm_executable=V34), instance("b", [2, 3], 8001, speculative_config=spec)],
        {V33: "0.33.0", V34: "0.34.0"},
    )
    assert planned["problems"] == [
        "instance b: speculative_config.method 'my_plugin_drafter' is not a method of vLLM 0.33.0 (vLLM 0.34.0 runs a "
        "method a vLLM plugin registers; vLLM 0.33.0 runs only its built-in ones): its method field accepts only "
        + planned["problems"][0].split("accepts only ", 1)[1]
    ]
    assert len(planned["warnings"]) == 1
    assert planned["warnings"][0].startswith(
        "instance a: method: 'my_plugin_drafter' is no built-in method of vLLM 0.34.0"
    )


def test_disable_padded_drafter_batch_is_refused_on_a_0_34_instance():
    spec = dict(DFLASH, disable_padded_drafter_batch=True)
    assert plan([instance(speculative_config=spec)], {V33: "0.33.0"})["problems"] == []
    problems = plan([instance(speculative_config=spec, vllm_executable=V34)], {V34: "0.34.0"})["problems"]
    assert len(problems) == 1 and problems[0].startswith("instance a: speculative_config field(s) refused: ")
    assert "disable_padded_drafter_batch=true: a field of vLLM 0.32.0, 0.33.0, not of vLLM 0.34.0's" in problems[0]


def test_each_instance_gets_what_its_release_needs():
    """The same mixed sliding/full DFlash drafter: 0.33 pins the V2 model runner, 0.34 has no other."""
    planned = plan(
        [
            instance(speculative_config=DFLASH),
            instance("b", [2, 3], 8001, speculative_config=DFLASH, vllm_executable=V34),
        ],
        {V33: "0.33.0", V34: "0.34.0"},
    )
    assert planned["problems"] == [] and planned["warnings"] == []
    assert planned["instances"]["a"]["cfg"]["environment"]["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert "VLLM_USE_V2_MODEL_RUNNER" not in planned["instances"]["b"]["cfg"]["environment"]


def test_a_newer_release_is_validated_against_the_newest_known_with_a_warning_naming_both():
    planned = plan([instance(speculative_config=dict(DFLASH, speculator_options={"k": 1}))], {V33: "0.35.0"})
    assert planned["problems"] == []
    assert planned["warnings"] == [
        "instance a: vLLM 0.35.0 is newer than the releases this collection knows (0.32 to 0.34): its speculative "
        "config, flags, metrics and shutdown are validated against vLLM 0.34.0's; a field or method that 0.35.0 "
        "added is refused, one it removed is not"
    ]


def test_an_older_release_is_refused_with_the_supported_range():
    planned = plan([instance(speculative_config=DFLASH)], {V33: "0.31.0"})
    assert planned["problems"] == [
        "instance a: vLLM 0.31.0 is older than the releases this collection supports (0.32 to 0.34): upgrade the "
        "instance's vLLM, or use a release of this collection that supports 0.31.0 (%s, read from METADATA)" % V33
    ]


def test_a_release_that_could_not_be_read_is_refused():
    planned = plan([instance()], {V33: ("error", "%s --version exited 1: No module named torch" % V33)})
    assert planned["problems"] == [
        "instance a: cannot tell which vLLM %s runs: %s --version exited 1: No module named torch" % (V33, V33)
    ]
    # a missing executable is said once, by the path check
    missing = p.plan([instance()], host({}), SETTINGS)["problems"]
    assert missing == ["instance a: %s does not exist on gpu07" % V33]


def test_the_spec_flags_are_the_roles():
    """vLLM merges --spec-method, --spec-model and --spec-tokens into the speculative config, past the checks."""
    planned = plan([instance(extra_args=["--spec-model", "/models/other", "--spec-tokens=8"])], {V33: "0.33.0"})
    assert planned["problems"] == [
        "instance a: extra_args has --spec-model, which the role sets itself: use speculative_config.model; "
        "extra_args has --spec-tokens, which the role sets itself: use speculative_config.num_speculative_tokens"
    ]


def test_the_workers_shutdown_window_must_fit_the_stop_timeout():
    env = {"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "30"}
    assert plan([instance(environment=env)], {V34: "0.34.0"}, vllm_executable=V34)["problems"] == []
    problems = plan([instance(environment=env)], {V34: "0.34.0"}, vllm_executable=V34, stop_timeout=30)["problems"]
    assert problems == [
        "instance a: environment sets VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS=30: vLLM 0.34.0 then takes up to 34 s to "
        "stop (EngineCore's window of 30 s after the drain's SIGTERM; when the whole session is stopped, 30 s for the "
        "workers, then their SIGTERM and their SIGKILL 4 s later), which vllm_server_stop_timeout 30 cuts short: "
        "raise vllm_server_stop_timeout above 34, or lower VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"
    ]
    bad = plan([instance(environment={"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "5s"})], {V33: "0.33.0"})["problems"]
    assert bad == [
        "instance a: environment sets VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS=5s: vLLM 0.33.0 reads it with int() and "
        "fails at start: give whole seconds"
    ]
