# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_container (issue 43): a container through its runtime's command line, with a stand-in runtime that answers as
podman 4.3.1 and docker 20.10 do (their `inspect` JSON: the fields read), and the host's CDI specs."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _container

CID = "7d03ef5b34c7ba3c18c4d6125d8e686a93f08c75089be2b9ec086be2bcb9a9f4"
PODMAN_INSPECT = [
    {
        "Id": CID,
        "Image": "feba8bc06278d110ffea1cfa68fbf4311656769cc4200819a912846634479a06",
        "ImageName": "localhost/simvllm:test",
        "State": {"Status": "running", "Running": True, "Pid": 4242, "ExitCode": 0, "Healthcheck": {"Status": ""}},
        "Config": {"Labels": {"gpuops.nvidia.instance": "qwen"}},
    }
]
DOCKER_INSPECT = [
    {
        "Id": CID,
        "Image": "sha256:feba8bc06278d110ffea1cfa68fbf4311656769cc4200819a912846634479a06",
        "State": {"Status": "exited", "Running": False, "Pid": 0, "ExitCode": 137, "Health": {"Status": "unhealthy"}},
        "Config": {"Image": "vllm/vllm-openai:v0.33.0", "Labels": None},
    }
]


@pytest.fixture
def runtime(tmp_path):
    """A stand-in runtime: prints $RESPONSE_<verb> and exits $RC_<verb>; logs each call."""
    log = tmp_path / "calls"
    script = tmp_path / "podman"
    script.write_text(
        "#!/bin/sh\n"
        'echo "$@ ENV=${HF_TOKEN:-}" >> %s\n'
        'case "$1 $2" in\n'
        '  "container inspect") cat %s/inspect.json; exit $(cat %s/inspect.rc) ;;\n'
        '  "image inspect") cat %s/image.out; exit $(cat %s/image.rc) ;;\n'
        '  "stop -t") [ ! -e %s/stop.err ] || { cat %s/stop.err >&2; exit 125; } ;;\n'
        "esac\n"
        "exit 0\n" % ((log,) + (tmp_path,) * 6)
    )
    script.chmod(0o755)

    def answer(inspect=None, inspect_rc=0, image="", image_rc=0):
        (tmp_path / "inspect.json").write_text(json.dumps(inspect) if inspect is not None else "")
        (tmp_path / "inspect.rc").write_text(str(inspect_rc))
        (tmp_path / "image.out").write_text(image)
        (tmp_path / "image.rc").write_text(str(image_rc))

    answer()
    return str(script), answer, log


def test_inspect_reads_podman_and_docker(runtime):
    path, answer, _log = runtime
    answer(PODMAN_INSPECT)
    found = _container.inspect(path, "vllm-qwen")
    assert found == {
        "id": CID,
        "image_id": PODMAN_INSPECT[0]["Image"],
        "image": "localhost/simvllm:test",
        "status": "running",
        "running": True,
        "pid": 4242,
        "exit_code": 0,
        "health": None,
        "labels": {"gpuops.nvidia.instance": "qwen"},
    }
    answer(DOCKER_INSPECT)
    found = _container.inspect(path, "vllm-qwen")
    assert (found["image_id"], found["image"], found["running"], found["exit_code"], found["health"]) == (
        PODMAN_INSPECT[0]["Image"],
        "vllm/vllm-openai:v0.33.0",
        False,
        137,
        "unhealthy",
    )
    assert found["labels"] == {}


def test_no_such_container_is_none_and_another_failure_says_so(runtime):
    path, answer, _log = runtime
    answer(inspect_rc=125)
    with open(path.replace("podman", "inspect.json"), "w") as handle:
        handle.write("Error: no such container vllm-qwen\n")
    assert _container.inspect(path, "vllm-qwen") is None
    with open(path.replace("podman", "inspect.json"), "w") as handle:
        handle.write("Error: database is locked\n")
    with pytest.raises(_container.ContainerError, match="container inspect vllm-qwen failed \\(rc 125\\)"):
        _container.inspect(path, "vllm-qwen")


def test_image_id_and_a_missing_image(runtime):
    path, answer, _log = runtime
    answer(image="sha256:%s\n" % ("a" * 64))
    assert _container.image_id(path, "vllm/vllm-openai:v0.33.0") == "a" * 64
    answer(image="Error: vllm/vllm-openai:v0.99: image not known\n", image_rc=125)
    assert _container.image_id(path, "vllm/vllm-openai:v0.99") is None


def test_start_passes_the_environment_by_name_and_stop_has_a_timeout(runtime):
    path, answer, log = runtime
    answer(PODMAN_INSPECT)
    with pytest.raises(_container.ContainerError, match="runs already"):
        _container.start(path, "vllm-qwen", ["run", "-d", "-e", "HF_TOKEN", "img"], {"HF_TOKEN": "hf_x"})
    answer([dict(PODMAN_INSPECT[0], State={"Running": False, "Pid": 0, "Status": "exited"})])
    _container.start(path, "vllm-qwen", ["run", "-d", "-e", "HF_TOKEN", "img"], {"HF_TOKEN": "hf_x"})
    calls = log.read_text().splitlines()
    assert calls[-3:] == [
        "rm -f vllm-qwen ENV=",
        "run -d -e HF_TOKEN img ENV=hf_x",  # the value reaches the runtime's environment, not its command line
        "container inspect vllm-qwen ENV=",
    ]
    answer(PODMAN_INSPECT)
    assert _container.stop(path, "vllm-qwen", 2.5)["pid"] == 4242
    assert log.read_text().splitlines()[-2:] == ["stop -t 3 vllm-qwen ENV=", "rm -f vllm-qwen ENV="]


def test_a_failed_stop_says_the_command_and_the_next_step(runtime, tmp_path):
    path, answer, log = runtime
    answer(PODMAN_INSPECT)
    (tmp_path / "stop.err").write_text("Error: container state improper\n")
    with pytest.raises(_container.ContainerError) as raised:
        _container.stop(path, "vllm-qwen", 2)
    assert str(raised.value) == (
        "%s stop -t 2 vllm-qwen failed (rc 125): Error: container state improper; container vllm-qwen (ID %s) may "
        "still run on its GPUs: look with `%s ps -a --filter name=vllm-qwen`, stop it, then run again"
        % (path, CID[:12], path)
    )
    assert log.read_text().splitlines()[-1] == "stop -t 2 vllm-qwen ENV="  # not removed after a failed stop


def test_a_runtime_that_does_not_answer_is_bounded(tmp_path, monkeypatch):
    script = tmp_path / "docker"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    monkeypatch.setattr(_container, "RUNTIME_TIMEOUT_S", 0.2)
    with pytest.raises(
        _container.ContainerError, match=r"docker container inspect vllm-qwen failed: no answer within 0.2 s$"
    ):
        _container.inspect(str(script), "vllm-qwen")


def test_cdi_names_of_yaml_and_json_specs(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "run").mkdir()
    # The shape `nvidia-ctk cdi generate` writes (YAML), and a JSON spec.
    (tmp_path / "etc" / "nvidia.yaml").write_text(
        "---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n"
        "    - path: /dev/nvidia0\n- name: GPU-4f1c\n  containerEdits: {}\n- name: all\n"
    )
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "1"}]}
    (tmp_path / "run" / "nvidia.json").write_text(json.dumps(spec))
    (tmp_path / "run" / "broken.json").write_text("{")
    names = _container.cdi_names((str(tmp_path / "etc"), str(tmp_path / "run")))
    assert names == ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-4f1c", "nvidia.com/gpu=all"]
