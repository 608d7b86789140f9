"""A vLLM server in a real podman container on a simulated node (issue 43): its API server killed, what it left on
the GPU freed from the host by the reset, the container stopped through podman (containertools.py: how podman runs
in a node here).

The image's entrypoint is a shell that starts `vllm serve` and keeps running (a keep-alive entrypoint). Measured here
with podman 4.3.1: under `--init` (catatonit as the container's PID 1), a SIGKILLed API server ends the whole container:
catatonit exits with its child's status (137) and the kernel then ends every process of the PID namespace
(pid_namespaces(7)). Only a PID 1 that outlives the API server leaves EngineCore and workers holding the GPUs.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest

import containertools
from ansible_run import REPO, module, only, playbook
from containertools import IMAGE, RUN_OPTIONS, PodmanHost, require_podman
from nodetools import gpu_memory, health, processes
from polling import wait_for
from ports import free_ports
from simnode import inventory_file

PLAYBOOK = REPO / "playbooks" / "reset_gpus.yml"
MODEL = str(REPO / "tests" / "fixtures" / "models" / "Qwen3.6-27B")
# The entrypoint: vllm serve in the background, then `sleep infinity` as the container's PID 1 (it keeps the
# container up, and what the API server leaves is reparented to it).
KEEP_ALIVE = ["/bin/sh", "-c", 'vllm serve "$@" & exec sleep infinity', "sh"]


@pytest.fixture
def podman_node(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.2)
    require_podman(node)
    host = PodmanHost(node, tmp_path)
    try:
        yield node, host
    finally:
        host.clean()


def start_server(node, host, gpu):
    """The simulated vLLM on `gpu` in a container of the keep-alive image; returns (container id, port, API server
    and EngineCore as node PIDs) once /health answers."""
    (port,) = free_ports(1)
    vllm = os.path.join(node.info["state_dir"], "bin", "vllm")
    env = ["-e", "CUDA_VISIBLE_DEVICES=%d" % gpu, "-e", "PATH=%s:/usr/bin:/bin" % os.path.dirname(vllm)]
    args = ["run", "-d", "--name", "vllm-a", "--network", "host", *RUN_OPTIONS, *host.volumes([gpu]), *env, IMAGE]
    container_id = host.podman(*args, MODEL, "--port", str(port), "--host", "127.0.0.1").stdout.strip()
    host.remember(container_id)
    wait_for(
        lambda: health(port) == 200,
        60,
        0.2,
        "the container's /health",
        log=lambda: host.podman("logs", "vllm-a").stderr,
    )
    procs = processes(node)
    (api,) = [pid for pid, v in procs.items() if v[2] == "vllm" and "serve" in v[3]]
    (engine,) = [pid for pid, v in procs.items() if v[0] == api and v[3] == "VLLM::EngineCore"]
    return container_id, port, api, engine


def test_a_killed_api_servers_engine_is_freed_and_its_container_stopped_through_podman(podman_node, tmp_path):
    node, host = podman_node
    host.build(entrypoint=KEEP_ALIVE)
    container_id, port, api, engine = start_server(node, host, 0)
    short = container_id[:12]
    cgroup = node.exec("cat", "/proc/%d/cgroup" % engine).stdout
    assert "name=systemd:/libpod_parent/libpod-%s\n" % container_id in cgroup, cgroup
    node.exec("kill", "-9", str(api))
    wait_for(lambda: health(port) is None, 10, 0.1, "the API server's end")
    init = processes(node)[engine][0]  # the entrypoint's `sleep infinity`, PID 1 of the container, inherited it
    assert processes(node)[init][2] == "sleep"
    inventory = inventory_file(tmp_path, node)

    # Check mode names the container, its command and what the stop would end; nothing is stopped.
    status, result = only(
        module(inventory, "gpuops.nvidia.gpu_kill", {"gpus": [0], "stop_owners": True, "grace_period": 2}, check=True)
    )
    command = "podman stop -t 2 %s" % short
    assert status == "CHANGED" and result["would_stop_containers"] == [
        {"id": container_id, "runtime": "podman", "command": command}
    ], result
    assert [(p["pid"], p["why"]) for p in result["container_processes"][container_id]] == [
        (engine, "selected"),
        (init, "the container's init"),
    ], result
    assert host.inspect("vllm-a", "{{.State.Status}}") == "running"

    # The reset from the host: the container stopped through podman, the memory back, then nothing to do.
    extra = {"reset_gpus_gpus": [0], "reset_gpus_stop_owners": True, "reset_gpus_grace_period": 2}
    rc, out, recap = playbook(inventory, PLAYBOOK, "-e", json.dumps(extra))
    assert rc == 0 and recap[node.name]["failed"] == 0, out
    assert "stopped podman container %s first (stop_owners: %s), which ended PID %d" % (short, command, engine) in out
    assert host.inspect("vllm-a", "{{.State.Status}}") == "exited"
    assert gpu_memory(node)[0][0] == 0
    rc, out, recap = playbook(inventory, PLAYBOOK, "-e", json.dumps(extra))
    assert rc == 0 and recap[node.name]["changed"] == 0, out


@pytest.mark.parametrize("ci", [None, "true"])
def test_a_node_without_cgroups_of_its_own_skips_the_podman_tests_or_fails_them_in_ci(monkeypatch, ci):
    """Podman and root are there, the node has no cgroups of its own: skipped, or failed where CI is set."""
    for name in ("PODMAN", "CONMON", "CATATONIT"):
        monkeypatch.setattr(containertools, name, sys.executable)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    if ci:
        monkeypatch.setenv("CI", ci)
    else:
        monkeypatch.delenv("CI", raising=False)
    why = "no cgroup v1 name=systemd hierarchy at /sys/fs/cgroup/systemd"
    node = SimpleNamespace(name="n1", info={"cgroup": None, "cgroup_unsupported": why})
    with pytest.raises(pytest.fail.Exception if ci else pytest.skip.Exception) as stopped:
        require_podman(node)
    expected = "node n1 has no cgroups of its own, which simruntime needs for the containers' cgroups: " + why
    assert str(stopped.value) == expected
    require_podman(SimpleNamespace(name="n2", info={"cgroup": {"root": "/sys/fs/cgroup/systemd/n2"}}))
