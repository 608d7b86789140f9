# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/plugin_utils/_vllm_plan.py: what the vllm_server role asks the host and what it deploys."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_host
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative import validate_speculative_config
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_parse import SpeculativeConfigError
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
FIXTURE = Path(__file__).parents[3] / "fixtures" / "drafters" / "dflash-qwen3"
DRAFTER = json.loads((FIXTURE / "config.json").read_text())  # sliding-window layers: the V2 model runner is needed


SPEC = {"method": "dflash", "model": "/models/d", "num_speculative_tokens": 15}
# What vllm_server_host returns for SPEC's drafter.
DRAFTERS = [
    {"model": "/models/d", "drafter_config": None, "path": "/models/d/config.json", "config": DRAFTER, "error": None}
]


def host(**extra):
    found = {
        "name": "gpu07",
        "systemd": False,
        "deployed": {},
        "running": {},
        "ports": {},
        "drafters": [],
        "paths": {
            "/models/q": {"exists": True, "isdir": True, "executable": False},
            "/usr/local/bin/vllm": {"exists": True, "isdir": False, "executable": True},
        },
        # what vllm_server_host read of the executable's vLLM release (these tests describe 0.33.0)
        "vllm_versions": {"/usr/local/bin/vllm": {"version": "0.33.0", "source": "METADATA", "error": None}},
        "nvidia": {
            "driver": {"available": True},
            "gpus": [{"index": i, "uuid": "GPU-%d" % i} for i in range(4)],
            "holders": [],
        },
    }
    found.update(extra)
    return found


def instance(**extra):
    return dict({"name": "a", "model": "/models/q", "port": 8000, "gpus": [0, 1]}, **extra)


def test_host_request_names_what_the_host_must_read():
    request = p.host_request(
        [
            instance(speculative_config={"method": "dflash", "model": "/models/d"}, drafter_config="/x"),
            instance(name="b", model="Qwen/Qwen3-8B", vllm_executable="/opt/vllm", host="::"),
        ],
        SETTINGS,
    )
    assert request["paths"] == ["/models/q", "/opt/vllm", "/usr/local/bin/vllm"]
    assert request["drafters"] == [{"model": "/models/d", "drafter_config": "/x"}]
    assert request["instances"][1] == {"name": "b", "host": "::", "port": "8000", "served_model_name": "b"}


def test_configuration_command_line_and_urls():
    planned = p.plan(
        [
            instance(
                host="::",
                data_parallel_size=2,
                max_model_len=4096,
                shutdown_timeout=5,
                extra_args=["--enable-prefix-caching"],
                environment={"HF_HOME": "/srv/hf"},
                api_key="sk-secret-4711",
            )
        ],
        host(),
        SETTINGS,
    )
    assert planned["problems"] == [] and planned["manager"] == "detached"
    entry = planned["instances"]["a"]
    cfg = entry["cfg"]
    assert cfg["tensor_parallel_size"] == 1 and cfg["data_parallel_size"] == 2 and cfg["served_model_name"] == "a"
    assert cfg["environment"] == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "HF_HOME": "/srv/hf",
    }
    assert cfg["api_key_file"] == "/etc/vllm/a.env" and "sk-secret-4711" not in json.dumps(cfg)
    assert cfg["argv"] == [
        "/usr/local/bin/vllm",
        "serve",
        "/models/q",
        "--host",
        "::",
        "--port",
        "8000",
        "--served-model-name",
        "a",
        "--tensor-parallel-size",
        "1",
        "--gpu-memory-utilization",
        "0.9",
        "--data-parallel-size",
        "2",
        "--max-model-len",
        "4096",
        "--shutdown-timeout",
        "5",
        "--enable-prefix-caching",
    ]
    assert entry["url"] == "http://[::1]:8000" and entry["address"] == ["::1", 8000]
    assert entry["old"] is None and entry["probe"] == ["not running"] and entry["running"] is False
    assert entry["unit"] is None and entry["gate"] is False


def test_running_server_and_its_deployed_address():
    old = dict(p.plan([instance(port=9000)], host(), SETTINGS)["instances"]["a"]["cfg"])
    running = {"a": {"ready": False, "process_exited": False, "last_error": "GET /health: HTTP 503", "pid": 41}}
    entry = p.plan([instance()], host(deployed={"a": old}, running=running), SETTINGS)["instances"]["a"]
    assert (
        entry["old"] == old and entry["old_url"] == "http://127.0.0.1:9000" and entry["url"] == "http://127.0.0.1:8000"
    )
    assert entry["old_address"] == ["127.0.0.1", 9000] and entry["running"] and entry["pid"] == 41
    assert entry["probe"] == ["not healthy (GET /health: HTTP 503)"]
    running["a"].update(ready=True, last_error=None)
    assert p.plan([instance()], host(deployed={"a": old}, running=running), SETTINGS)["instances"]["a"]["probe"] == []


def test_host_answers_become_problems_by_instance():
    answers = host(
        paths={"/models/q": {"exists": False}, "/usr/local/bin/vllm": {"exists": True, "executable": False}},
        ports={"a": "GET /health: HTTP 404"},
    )
    planned = p.plan([instance()], answers, SETTINGS)
    assert planned["instances"] == {}
    assert planned["problems"] == [
        "instance a: model /models/q does not exist on gpu07; /usr/local/bin/vllm is not executable on gpu07; port 8000 "
        "is already used on gpu07 by a server that is not this instance (GET /health: HTTP 404): stop it or choose "
        "another port"
    ]


def test_speculative_config_is_checked_with_the_drafter_the_host_read():
    spec, drafters = SPEC, DRAFTERS
    planned = p.plan([instance(speculative_config=spec)], host(drafters=drafters), SETTINGS)
    assert planned["problems"] == [], planned
    entry = planned["instances"]["a"]
    assert entry["gate"] and entry["min_rate"] == 0.1 and entry["cfg"]["speculative_config"]["method"] == "dflash"
    assert (
        json.loads(entry["cfg"]["argv"][entry["cfg"]["argv"].index("--speculative-config") + 1])
        == entry["cfg"]["speculative_config"]
    )
    wrong = dict(DRAFTER, dflash_config=dict(DRAFTER["dflash_config"], mask_token_id=1))
    spec_wrong = dict(spec, mask_token_id=248070)
    planned = p.plan(
        [instance(speculative_config=spec_wrong)], host(drafters=[dict(drafters[0], config=wrong)]), SETTINGS
    )
    assert planned["problems"][0].startswith(
        "instance a: speculative_config does not match the drafter (/models/d/config.json)"
    )
    missing = [dict(drafters[0], config=None, error="drafter config /models/d/config.json not found on this host")]
    planned = p.plan([instance(speculative_config=spec)], host(drafters=missing), SETTINGS)
    assert planned["problems"] == ["instance a: drafter config /models/d/config.json not found on this host"]


MTP_TARGET = str(FIXTURE.parent / "mtp")  # a checkpoint that carries its own MTP layers (num_nextn_predict_layers)
PLAIN_TARGET = str(FIXTURE.parents[1] / "models" / "Qwen3.6-27B")  # one without MTP layers


def planned_through_the_host(one):
    """The plan of instance `one` over the drafters vllm_server_host reads for the role's request, from disk."""
    request = p.host_request([one], SETTINGS)
    drafters = [_vllm_host.read_drafter(entry) for entry in request["drafters"]]
    paths = dict(host()["paths"], **{one["model"]: {"exists": True, "isdir": True, "executable": False}})
    return request, p.plan([one], host(drafters=drafters, paths=paths), SETTINGS)


@pytest.mark.parametrize(
    "spec, target",
    [
        ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}, "/models/q"),
        ({"method": "mtp", "num_speculative_tokens": 1}, MTP_TARGET),
        ({"method": "deepseek_mtp"}, MTP_TARGET),
    ],
)
def test_a_speculative_config_without_a_drafter_model_deploys(spec, target):
    request, planned = planned_through_the_host(instance(model=target, speculative_config=dict(spec)))
    assert planned["problems"] == [], planned["problems"]
    deployed = planned["instances"]["a"]["cfg"]["speculative_config"]
    if spec.get("method") == "ngram":
        assert request["drafters"] == [] and deployed == spec  # no drafter to read
    else:  # vLLM drafts with the target's own MTP layers: its config.json is the drafter's
        assert request["drafters"] == [{"model": None, "drafter_config": target + "/config.json"}]
        assert deployed == {"method": "mtp", "num_speculative_tokens": 1}


@pytest.mark.parametrize(
    "spec, target",
    [
        ({"num_speculative_tokens": 4}, "/models/q"),
        ({"method": "ngram"}, "/models/q"),
        ({"method": "mtp", "num_speculative_tokens": 1}, PLAIN_TARGET),
        ({"method": "mtp", "model": 5}, "/models/q"),
    ],
)
def test_a_speculative_config_vllm_refuses_is_refused_as_the_module_words_it(spec, target):
    request, planned = planned_through_the_host(instance(model=target, speculative_config=dict(spec)))
    given = {"drafter_config": target + "/config.json"} if target != "/models/q" else {}
    with pytest.raises(SpeculativeConfigError) as refused:
        validate_speculative_config(dict(spec), vllm_version="0.33.0", **given)
    assert planned["instances"] == {} and planned["problems"] == ["instance a: %s" % refused.value], planned


def test_mtp_without_model_on_a_hugging_face_target_reads_no_relative_path():
    """A target given as a Hugging Face id is no checkpoint on the host: nothing is read at a path relative to the
    module's directory; the refusal says how to give the target's config.json (drafter_config)."""
    spec = {"method": "mtp", "num_speculative_tokens": 1}
    request, planned = planned_through_the_host(instance(model="Qwen/Qwen3-Next-80B", speculative_config=dict(spec)))
    assert request["drafters"] == [], request
    (problem,) = planned["problems"]
    assert "give drafter_config=<target>/config.json" in problem and "not found on this host" not in problem, problem


def test_environment_must_keep_what_the_speculative_config_needs():
    spec, drafters = SPEC, DRAFTERS
    needed = p.plan([instance(speculative_config=spec)], host(drafters=drafters), SETTINGS)["instances"]["a"]["cfg"][
        "environment"
    ]
    extra = {key: value for key, value in needed.items() if not key.startswith("CUDA_")}
    assert extra, needed  # the V2 model runner DFlash needs in vLLM 0.33
    key, value = sorted(extra.items())[0]
    planned = p.plan(
        [instance(speculative_config=spec, environment={key: value + "0"})], host(drafters=drafters), SETTINGS
    )
    assert (
        "environment sets %s=%s0, but the speculative config needs %s=%s" % (key, value, key, value)
        in planned["problems"][0]
    )


def test_systemd_unit_quotes_and_ends_the_whole_tree():
    settings = dict(SETTINGS, service_manager="auto", stop_timeout=10)
    planned = p.plan(
        [instance(environment={"NOTE": "100% $HOME"}, extra_args=["--chat-template", 'say "$x"'], api_key="k")],
        host(systemd=True),
        settings,
    )
    assert planned["manager"] == "systemd"
    unit = planned["instances"]["a"]["unit"]
    assert 'Environment="NOTE=100%% $HOME"' in unit and "EnvironmentFile=/etc/vllm/a.env" in unit
    assert "KillMode=control-group" in unit and "TimeoutStopSec=10" in unit and "User=vllm" in unit
    exec_start = [line for line in unit.splitlines() if line.startswith("ExecStart=")][0][len("ExecStart=") :]
    words = [word.replace("$$", "$").replace("%%", "%") for word in shlex.split(exec_start)]
    assert words == planned["instances"]["a"]["cfg"]["argv"]


def test_plan_without_driver_warns_and_resolves_indices_only():
    answers = host(
        nvidia={"driver": {"available": False, "error": "libnvidia-ml.so.1 not found"}, "gpus": [], "holders": []}
    )
    planned = p.plan([instance()], answers, SETTINGS)
    assert planned["problems"] == [] and planned["instances"]["a"]["cfg"]["gpus"] == [0, 1]
    assert planned["warnings"] == [
        "gpu07: the NVIDIA driver library did not answer (libnvidia-ml.so.1 not found): GPU "
        "indices are not checked and GPU UUIDs cannot be used"
    ]


def test_files_are_compared_with_the_states_the_host_read():
    from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_files

    first = p.plan([instance(api_key="sk-1")], host(), SETTINGS)["instances"]["a"]
    assert first["changed"] == ["configuration", "API key"] and first["reasons"] == [
        "configuration changed",
        "API key changed",
        "not running",
    ]
    same = {
        "configuration": {"sha256": _vllm_files.digest(_vllm_files.config_text(first["cfg"])), "mode": 0o600},
        "API key": {"sha256": _vllm_files.digest("VLLM_API_KEY=sk-1\n"), "mode": 0o600},
    }
    running = {"a": {"ready": True, "process_exited": False, "last_error": None, "pid": 7}}
    entry = p.plan([instance(api_key="sk-1")], host(files={"a": same}, running=running), SETTINGS)["instances"]["a"]
    assert entry["changed"] == [] and entry["reasons"] == []
    entry = p.plan([instance(api_key="sk-2")], host(files={"a": same}, running=running), SETTINGS)["instances"]["a"]
    assert entry["reasons"] == ["API key changed"]
    loose = dict(same, configuration=dict(same["configuration"], mode=0o666))
    assert p.plan([instance(api_key="sk-1")], host(files={"a": loose}, running=running), SETTINGS)["instances"]["a"][
        "changed"
    ] == ["configuration"]


def test_the_running_servers_manager_is_the_one_stopped():
    old = dict(
        p.plan([instance()], host(systemd=True), dict(SETTINGS, service_manager="systemd"))["instances"]["a"]["cfg"]
    )
    entry = p.plan([instance()], host(systemd=True, deployed={"a": old}), SETTINGS)["instances"]["a"]
    assert entry["cfg"]["service_manager"] == "detached" and entry["unit"] is None
    assert (
        entry["old_manager"] == "systemd" and "ExecStart=" in entry["old_unit"]
    )  # a rollback starts the old unit again
    first = p.plan([instance()], host(), SETTINGS)["instances"]["a"]
    assert first["old_manager"] == "detached" and first["old_unit"] is None


def test_an_instance_with_a_refused_port_is_not_probed():
    request = p.host_request(
        [instance(port=-1), instance(name="b", port=70000), instance(name="c", port=8001)], SETTINGS
    )
    assert [entry["name"] for entry in request["instances"]] == ["c"]


def test_host_request_passes_on_a_max_used_mib_only_where_it_stands():
    assert p.host_request([instance()], dict(SETTINGS, numbers={"gpu_max_used_mib": 512}))["max_used_mib"] == 512
    # Refused by the plan: the host is read with the module's default, and the plan says why.
    assert "max_used_mib" not in p.host_request([instance()], dict(SETTINGS, numbers={"gpu_max_used_mib": -5}))


def test_a_newline_never_reaches_the_systemd_unit():
    # Issue 33 item 8: the plan refuses it before anything stops, and unit_text refuses to write such a line anyway.
    settings = dict(SETTINGS, service_manager="systemd")
    injected = "x\nExecStartPre=/bin/touch /tmp/PWN"
    planned = p.plan([instance(environment={"FOO": injected})], host(systemd=True), settings)
    assert planned["instances"] == {} and len(planned["problems"]) == 1, planned
    assert planned["problems"][0].startswith("instance a: environment.FOO has a control character (U+000A)"), planned
    cfg = p.plan([instance()], host(systemd=True), settings)["instances"]["a"]["cfg"]
    for bad in (dict(cfg, environment={"FOO": injected}), dict(cfg, argv=cfg["argv"] + [injected])):
        try:
            unit = p.unit_text(bad, settings)
        except ValueError as exc:
            assert "control character" in str(exc) and "PWN" not in str(exc), exc
        else:
            raise AssertionError("a unit with a newline in a value was written:\n" + unit)


def test_a_renamed_instance_names_the_deployed_one_on_its_port():
    # Issue 33: instance a renamed b, same port and key: the port is held by a, deployed by this role. It was refused
    # as "(wrong or missing API key)", from a look that sends no key.
    old = {"name": "a", "port": 8000, "gpus": [0, 1], "service_manager": "detached"}
    answers = host(
        deployed={"a": old}, ports={"b": "GET /v1/models: HTTP 401 {} (the server asks for an API key; none was sent)"}
    )
    planned = p.plan([instance(name="b")], answers, SETTINGS)
    (problem,) = planned["problems"]
    assert problem.startswith(
        "instance b: port 8000 is used by instance a, deployed by this role (/etc/vllm/a.json) and not in "
        "vllm_server_instances (renamed?): stop it first (the session of the PID in /var/lib/vllm/a.pid) and remove "
        "its files, or choose another port"
    ), problem
    assert "API key" not in problem, problem


# --- the token budget with vLLM's defaults for the class of the instance's first GPU ---------------------------------

# The simulator's H100 (tests/sim: the name NVML gives an H100 80GB HBM3, and its memory)
H100 = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}


def nvidia(*gpus):
    return {"driver": {"available": True}, "gpus": list(gpus), "holders": []}


def test_the_budget_on_an_h100_names_its_class_and_not_the_users_value():
    on_h100 = host(drafters=DRAFTERS, nvidia=nvidia(H100))
    given = instance(gpus=[0], speculative_config=SPEC, extra_args=["--max-num-batched-tokens", "16"])
    planned = p.plan([given], on_h100, SETTINGS)
    assert "vLLM 0.33.0 expects at most 14 with max_num_batched_tokens 16: dflash takes" in planned["problems"][0]
    assert "default" not in planned["problems"][0]
    # vLLM's 8192 on an H100 leaves no slot for K + 1 = 8192 (a warning for some classes where the GPU is unknown)
    wide = instance(gpus=[0], speculative_config=dict(SPEC, num_speculative_tokens=8191))
    planned = p.plan([wide], on_h100, SETTINGS)
    assert "max_num_batched_tokens 8192 (vLLM's default for H100/H200 class (70-160 GiB))" in planned["problems"][0]


def test_the_gpu_class_is_the_first_gpus_and_none_for_a_mig_instance():
    a100 = {"index": 1, "uuid": "GPU-1", "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920}
    assert p._gpu_class([0, 1], nvidia(H100, a100)) == "H100/H200 class (70-160 GiB)"
    assert p._gpu_class([1, 0], nvidia(H100, a100)) == "GPUs under 70 GiB and A100"
    assert p._gpu_class(["MIG-6a1e0c4f"], nvidia(H100)) is None
    assert p._gpu_class([0], nvidia({"index": 0, "uuid": "GPU-0"})) is None
