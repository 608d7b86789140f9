# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Container instances of the vllm_server role (issue 43): what is refused before anything stops, the command that
runs the container (podman and docker alike), the configuration's digest, paths through volumes, and the plan."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_host
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_container as c
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_plan, _vllm_run

SETTINGS = {"stop_timeout": 60, "unit_prefix": "vllm-", "container_options": []}


def instance(**extra):
    return dict(
        {
            "name": "qwen",
            "model": "/models/Qwen3.6-27B",
            "port": 8000,
            "gpus": [0, 1],
            "service_manager": "podman",
            "image": "vllm/vllm-openai:v0.33.0",
            "vllm_version": "0.33.0",
            "volumes": ["/srv/models:/models", "/srv/cache:/root/.cache/huggingface:rw"],
        },
        **extra,
    )


@pytest.mark.parametrize(
    "extra, problem",
    [
        ({"image": "-it"}, "image '-it' starts with -: the runtime would read it as an option"),
        ({"image": "vllm/vllm-openai --privileged"}, "image 'vllm/vllm-openai --privileged' has a space"),
        ({"image": ""}, "image is required with service_manager podman"),
        ({"volumes": ["models:/models"]}, "volumes[0] src 'models' is not an absolute path"),
        ({"volumes": ["-v:/models"]}, "volumes[0] src '-v' starts with -: the runtime would read it as an option"),
        ({"volumes": ["/srv:/models:rx"]}, "volumes[0] mode 'rx' is not ro or rw"),
        ({"volumes": ["/srv"]}, "volumes[0] must be SRC:DEST or SRC:DEST:ro|rw"),
        ({"volumes": [{"src": "/a,b", "dest": "/m"}]}, "volumes[0] src '/a,b' has a , or :"),
        ({"shm_size": "lots"}, "shm_size 'lots' is not a size such as 16g"),
        ({"container_options": ["--privileged"]}, "container_options has --privileged: it gives the container every"),
        ({"container_options": ["--pid=host"]}, "container_options has --pid: --pid=host puts the container's"),
        ({"container_options": ["--pid", "host"]}, "container_options has --pid: --pid=host puts the container's"),
        ({"container_options": ["--network=bridge"]}, "container_options has --network: the role runs the container"),
        ({"container_options": ["-e", "HF_TOKEN=x"]}, "container_options has -e: use environment"),
        ({"container_options": "--privileged"}, "container_options must be a list of strings"),
    ],
)
def test_refused_before_anything_stops(extra, problem):
    found = c.container_problems(instance(**extra), "podman", SETTINGS)
    assert any(text.startswith(problem) for text in found), found


def test_the_role_wide_options_are_checked_and_a_good_instance_passes():
    assert c.container_problems(instance(), "docker", SETTINGS) == []
    settings = dict(SETTINGS, container_options=["--ulimit", "nofile=4096:4096", "--security-opt", "label=disable"])
    assert c.container_problems(instance(), "podman", settings) == []
    control = dict(SETTINGS, container_options=["--ulimit", "nofile=1\nExecStartPre=/bin/sh"])
    assert c.container_problems(instance(), "podman", control)[0].startswith(
        "vllm_server_container_options[1] has a control character (U+000A) at character 9"
    )
    refused = dict(SETTINGS, container_options=["--privileged"])
    assert c.container_problems(instance(), "podman", refused)[0].startswith(
        "vllm_server_container_options has --privi"
    )


def test_container_keys_on_an_instance_without_a_runtime_are_refused():
    assert c.container_problems(instance(), "detached", SETTINGS) == [
        "image, volumes are for instances run by podman or docker (service_manager)"
    ]
    assert c.container_problems({"name": "a"}, "systemd", SETTINGS) == []


def cfg_of(runtime="podman", api_key=True, cdi=(), shm=None):
    cfg = {
        "name": "qwen",
        "argv": ["vllm", "serve", "/models/Qwen3.6-27B", "--port", "8000"],
        "environment": {"CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": "hf_secret_value"},
        "api_key_file": "/etc/vllm/qwen.env" if api_key else None,
        "log_file": "/var/log/vllm/qwen.log",
        "service_manager": runtime,
    }
    nvidia = {"gpus": [{"index": 0, "minor": 0}, {"index": 1, "minor": 3}]}
    container = {
        "runtime": runtime,
        "name": "vllm-qwen",
        "image": "vllm/vllm-openai:v0.33.0",
        "volumes": c.volumes_of(instance()),
        "shm_size": shm,
        "gpu_args": c.gpu_args([0, 1], nvidia, list(cdi)),
        "options": ["--ulimit", "nofile=4096:4096"],
    }
    cfg["container"] = container
    container["digest"] = c.config_digest(cfg)
    return cfg


def test_the_run_command_never_carries_a_value_of_the_environment_or_the_key():
    cfg = cfg_of(cdi=["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all"])
    argv = c.run_argv(cfg, SETTINGS, cfg["container"])
    assert argv[:4] == ["run", "-d", "--name", "vllm-qwen"]
    assert "hf_secret_value" not in " ".join(argv)
    assert ["-e", "HF_TOKEN"] == argv[argv.index("HF_TOKEN") - 1 : argv.index("HF_TOKEN") + 1]
    assert argv[argv.index("--env-file") + 1] == "/etc/vllm/qwen.env"
    assert argv[argv.index("--network") + 1] == "host" and argv[argv.index("--ipc") + 1] == "host"
    assert argv[argv.index("--stop-timeout") + 1] == "60" and argv[argv.index("--restart") + 1] == "on-failure:3"
    assert ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"] == argv[
        argv.index("--device") : argv.index("--device") + 4
    ]
    assert "gpuops.nvidia.config-digest=%s" % cfg["container"]["digest"] in argv
    assert ["-v", "/srv/models:/models:ro", "-v", "/srv/cache:/root/.cache/huggingface:rw"] == argv[
        argv.index("-v") : argv.index("-v") + 4
    ]
    # The image, then vllm serve's arguments (the image's entrypoint is vllm serve).
    assert argv[-4:] == ["vllm/vllm-openai:v0.33.0", "/models/Qwen3.6-27B", "--port", "8000"]


def test_device_files_without_a_cdi_spec_docker_and_shm_size():
    cfg = cfg_of(runtime="docker", api_key=False, shm="16g")
    argv = c.run_argv(cfg, SETTINGS, cfg["container"])
    devices = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--device"]
    assert devices == ["/dev/nvidia0", "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert "--ipc" not in argv and argv[argv.index("--shm-size") + 1] == "16g"
    assert "--env-file" not in argv and "--log-driver" not in argv  # docker keeps its own log driver
    # A CDI spec that names only some of the GPUs: the device files, by minor number (GPU 1 is /dev/nvidia3).
    nvidia = {"gpus": [{"index": 0, "minor": 0}, {"index": 1, "minor": 3}]}
    assert c.gpu_args([0, 1], nvidia, ["nvidia.com/gpu=0"])[:4] == [
        "--device",
        "/dev/nvidia0",
        "--device",
        "/dev/nvidia3",
    ]
    assert c.gpu_problems([0, 1], nvidia, ["nvidia.com/gpu=0"]) == []


@pytest.mark.parametrize(
    "gpus, nvidia, why",
    [
        ([0, 1], {"gpus": [{"index": 0, "minor": 0}, {"index": 1, "minor": None}]}, "device file of 1 is not known"),
        ([0], {}, "device file of 0 is not known (the NVIDIA driver library gave no minor number)"),
        (["MIG-0f1e"], {"gpus": [{"index": 0, "minor": 0}]}, "a MIG instance goes by its CDI name only"),
    ],
)
def test_a_gpu_without_cdi_name_or_minor_number_is_refused_never_guessed(gpus, nvidia, why):
    found = c.gpu_problems(gpus, nvidia, ["nvidia.com/gpu=all"])
    assert len(found) == 1 and why in found[0] and "nvidia-ctk cdi generate" in found[0], found
    assert ("look at the driver" in found[0]) is all(isinstance(gpu, int) for gpu in gpus), found
    # With a CDI spec that names them, nothing is needed from the driver library.
    assert c.gpu_problems(gpus, nvidia, ["nvidia.com/gpu=%s" % gpu for gpu in gpus]) == []


def test_the_digest_follows_the_configuration_and_not_itself():
    cfg = cfg_of()
    same = copy.deepcopy(cfg)
    same["container"]["digest"], same["container"]["run_argv"] = "x", ["y"]
    assert c.config_digest(same) == cfg["container"]["digest"]
    other = copy.deepcopy(cfg)
    other["argv"][-1] = "8001"
    assert c.config_digest(other) != cfg["container"]["digest"]


def test_paths_inside_the_container_are_found_on_the_host_through_its_volumes():
    found = instance(volumes=["/srv/models:/models", "/srv/q:/models/q"])
    assert c.host_path(found, "/models/Qwen3.6-27B", "podman") == "/srv/models/Qwen3.6-27B"
    assert c.host_path(found, "/models/q/drafter", "podman") == "/srv/q/drafter"  # the longest destination
    assert c.host_path(found, "/opt/elsewhere", "podman") is None
    assert c.host_path(found, "/opt/elsewhere", "detached") == "/opt/elsewhere"
    assert c.host_path(found, "Qwen/Qwen3-8B", "podman") == "Qwen/Qwen3-8B"  # a Hugging Face id


def host(**extra):
    return dict(
        {
            "name": "gpu01",
            "systemd": False,
            "nvidia": {
                "driver": {"available": True},
                "gpus": [{"index": 0, "minor": 0, "uuid": "GPU-a"}, {"index": 1, "minor": 1, "uuid": "GPU-b"}],
                "holders": [],
            },
            "paths": {"/srv/models": {"exists": True}, "/srv/models/Qwen3.6-27B": {"exists": True, "isdir": True}},
            "images": {"podman vllm/vllm-openai:v0.33.0": "a" * 64},
            "cdi": ["nvidia.com/gpu=0", "nvidia.com/gpu=1"],
            "deployed": {},
            "running": {},
            "files": {},
            "containers": {},
        },
        **extra,
    )


def plan_settings(**extra):
    return dict(
        {
            "service_manager": "detached",
            "vllm_executable": "/usr/local/bin/vllm",
            "stop_timeout": 60,
            "min_acceptance_rate": 0.1,
            "unit_prefix": "vllm-",
            "state_dir": "/var/lib/vllm",
            "config_dir": "/etc/vllm",
            "log_dir": "/var/log/vllm",
            "systemd_dir": "/etc/systemd/system",
            "user": "root",
            "adopt_unmanaged": False,
            "container_options": [],
            "numbers": {},
        },
        **extra,
    )


def test_the_plan_of_a_container_instance():
    one = instance(volumes=["/srv/models:/models"])
    request = _vllm_plan.host_request([one], plan_settings())
    assert request["images"] == [{"runtime": "podman", "image": "vllm/vllm-openai:v0.33.0"}]
    assert "/srv/models/Qwen3.6-27B" in request["paths"] and request["executables"] == []
    found = _vllm_plan.plan([one], host(), plan_settings())
    assert found["problems"] == [], found["problems"]
    entry = found["instances"]["qwen"]
    cfg = entry["cfg"]
    assert entry["unit"] is None and cfg["container"]["name"] == "vllm-qwen"
    assert cfg["container"]["gpu_args"] == ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"]
    assert cfg["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert cfg["container"]["run_argv"][-1] == "0.9" and "--tensor-parallel-size" in cfg["container"]["run_argv"]
    assert entry["reasons"] == ["configuration changed", "not running"]


def test_the_plan_refuses_a_missing_image_and_a_model_outside_the_volumes():
    images = {"podman vllm/vllm-openai:v0.33.0": None}
    found = _vllm_plan.plan([instance(volumes=["/srv/models:/models"])], host(images=images), plan_settings())
    assert any(
        "image vllm/vllm-openai:v0.33.0 is not on gpu01 (podman image inspect): the role pulls nothing" in problem
        for problem in found["problems"]
    ), found["problems"]
    found = _vllm_plan.plan([instance(volumes=["/srv/cache:/cache"])], host(), plan_settings())
    assert any("model /models/Qwen3.6-27B is in no volume of the container" in p for p in found["problems"])
    found = _vllm_plan.plan([instance(vllm_version=None, volumes=["/srv/models:/models"])], host(), plan_settings())
    assert any("vllm_version is required with service_manager podman" in p for p in found["problems"])


DRAFTERS = str(Path(__file__).parents[3] / "fixtures" / "drafters")  # on the host; /drafters in the container
DFLASH = {"method": "dflash", "model": "/drafters/dflash-qwen3", "num_speculative_tokens": 15}


def planned_through_the_host(one):
    """(request, plan) of container instance `one`, over the drafters vllm_server_host reads for it, from disk."""
    request = _vllm_plan.host_request([one], plan_settings())
    read = [_vllm_host.read_drafter(entry) for entry in request["drafters"]]
    paths = dict(host()["paths"], **{path: {"exists": True, "isdir": True} for path in request["paths"]})
    return request, _vllm_plan.plan([one], host(drafters=read, paths=paths), plan_settings())


def test_the_drafter_is_read_through_the_volume_that_holds_it():
    volumes = ["/srv/models:/models", DRAFTERS + ":/drafters"]
    request, found = planned_through_the_host(instance(volumes=volumes, speculative_config=dict(DFLASH)))
    assert request["drafters"] == [
        {"model": "/drafters/dflash-qwen3", "drafter_config": DRAFTERS + "/dflash-qwen3/config.json"}
    ]
    assert found["problems"] == [] and found["instances"]["qwen"]["cfg"]["speculative_config"] == DFLASH
    # MTP without a model: vLLM drafts with the target's own MTP layers, read through the target's volume
    one = instance(model="/drafters/mtp", volumes=volumes, speculative_config={"method": "mtp"})
    request, found = planned_through_the_host(one)
    assert request["drafters"] == [{"model": None, "drafter_config": DRAFTERS + "/mtp/config.json"}]
    assert found["problems"] == [], found["problems"]
    assert found["instances"]["qwen"]["cfg"]["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}


@pytest.mark.parametrize("extra", [{}, {"drafter_config": DRAFTERS + "/dflash-qwen3/config.json"}])
def test_a_drafter_in_no_volume_is_refused_and_not_read_at_its_host_path(extra):
    on_host = DRAFTERS + "/dflash-qwen3"  # exists on the host, but the container sees no such path
    one = instance(volumes=["/srv/models:/models"], speculative_config=dict(DFLASH, model=on_host), **extra)
    request, found = planned_through_the_host(one)
    assert request["drafters"] == [] and found["instances"] == {}
    assert found["problems"] == [
        "instance qwen: speculative_config model %s is in no volume of the container" % on_host
    ]


def test_the_plan_refuses_gpus_it_cannot_name_to_the_runtime():
    nvidia = dict(host()["nvidia"], gpus=[{"index": 0, "minor": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}])
    found = _vllm_plan.plan([instance(volumes=["/srv/models:/models"])], host(cdi=[], nvidia=nvidia), plan_settings())
    assert found["instances"] == {} and any(
        p.startswith("instance qwen: gpus 0, 1: the host has no CDI spec that names nvidia.com/gpu=0, nvidia.com/gpu=1")
        and "device file of 1 is not known" in p
        for p in found["problems"]
    ), found["problems"]
    found = _vllm_plan.plan([instance(volumes=["/srv/models:/models"])], host(cdi=[]), plan_settings())
    assert found["problems"] == [] and found["instances"]["qwen"]["cfg"]["container"]["gpu_args"][:4] == [
        "--device",
        "/dev/nvidia0",
        "--device",
        "/dev/nvidia1",
    ]


def test_the_stop_finds_the_container_by_the_name_its_deployment_recorded():
    one = instance(volumes=["/srv/models:/models"])
    first = _vllm_plan.plan([one], host(), plan_settings())["instances"]["qwen"]
    assert first["old_container"] == "vllm-qwen"  # nothing deployed yet: the name it gets
    # Deployed under another prefix: the stop (and a rollback's start) name the running container, not a new name.
    renamed = _vllm_plan.plan([one], host(deployed={"qwen": first["cfg"]}), plan_settings(unit_prefix="llm-"))
    entry = renamed["instances"]["qwen"]
    assert entry["old_container"] == "vllm-qwen" and entry["cfg"]["container"]["name"] == "llm-qwen"
    run = _vllm_run.step(entry, "compare", api_key=None, now=0.0)
    assert run["stop"]["container"] == "vllm-qwen"
    assert _vllm_run.step(run, "rollback_to", planned=entry, deployed_key=None)["stop"]["container"] == "llm-qwen"


def test_a_running_container_of_another_image_or_configuration_is_restarted():
    one = instance(volumes=["/srv/models:/models"])
    first = _vllm_plan.plan([one], host(), plan_settings())["instances"]["qwen"]["cfg"]
    digest = first["container"]["digest"]
    running = {"qwen": {"ready": True, "process_exited": False, "last_error": None, "pid": 42}}
    container = {"running": True, "pid": 42, "image_id": "a" * 64, "labels": {c.DIGEST_LABEL: digest}}
    look = host(deployed={"qwen": first}, running=running, containers={"qwen": container})
    entry = _vllm_plan.plan([one], look, plan_settings())["instances"]["qwen"]
    assert [r for r in entry["reasons"] if "image" in r or "container" in r] == []
    moved = dict(look, images={"podman vllm/vllm-openai:v0.33.0": "b" * 64})
    entry = _vllm_plan.plan([one], moved, plan_settings())["instances"]["qwen"]
    assert (
        "image vllm/vllm-openai:v0.33.0 is bbbbbbbbbbbb on the host, the container runs aaaaaaaaaaaa"
        in entry["reasons"]
    )
    edited = dict(look, containers={"qwen": dict(container, labels={})})
    entry = _vllm_plan.plan([one], edited, plan_settings())["instances"]["qwen"]
    assert "container vllm-qwen carries no configuration label, not the deployed configuration's" in entry["reasons"]
    # A changed configuration is its own reason: the running container's label is not named again.
    changed = _vllm_plan.plan([dict(one, port=8001)], look, plan_settings())["instances"]["qwen"]
    assert changed["reasons"] == ["configuration changed"]
