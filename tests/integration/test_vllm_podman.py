"""The vllm_server role with vLLM in real podman containers on a simulated node (issue 43; containertools.py says how
podman runs in a node here).

The image has the official image's shape (vllm-project/vllm docker/Dockerfile, stage vllm-openai: ENTRYPOINT
["vllm", "serve"], no init): the simulated vLLM's `vllm serve` is the container's PID 1. The host has a CDI spec
(/var/run/cdi/nvidia.yaml, where the toolkit's nvidia-cdi-refresh writes it), so the role gives the GPU by its CDI name;
the simulated device files are regular files, so the spec mounts them (a real spec lists device nodes).

One run after another on one node: a deploy; a redeploy to the corrected DFlash config (a new container, the gate
passes); a redeploy whose acceptance gate fails, rolled back to the previous container (its image and arguments); a
second run that changes nothing.
"""

from __future__ import annotations

import json

import pytest

from containertools import IMAGE, RUN_OPTIONS, PodmanHost, require_podman
from nodetools import processes
from ports import free_ports
from simnode import inventory_file
from test_vllm_server import CORRECTED, MODEL, SERVER_ENV, run, summary, write_host_vars

CDI_SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [
        {
            "name": str(index),
            "containerEdits": {
                "mounts": [
                    {"hostPath": "/dev/nvidia%d" % index, "containerPath": "/dev/nvidia%d" % index, "options": ["bind"]}
                ]
            },
        }
        for index in range(2)
    ],
    "containerEdits": {
        "mounts": [
            {"hostPath": path, "containerPath": path, "options": ["bind"]}
            for path in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
        ]
    },
}


@pytest.fixture
def podman_node(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.2)
    require_podman(node)
    host = PodmanHost(node, tmp_path)
    node.exec("sh", "-c", "mkdir -p /run/cdi && cat > /run/cdi/nvidia.json", input=json.dumps(CDI_SPEC))
    try:
        yield node, host
    finally:
        host.clean()


def container_instance(node, host, port, **extra):
    """An instance of the role run by podman: the volumes a simulated vLLM needs (no device files: CDI gives them)."""
    volumes = [
        volume if volume.count(":") == 2 else volume + ":rw"
        for volume in host.volumes([])
        if volume != "-v" and not volume.startswith("/dev/")
    ]
    return dict(
        {
            "name": "qwen",
            "model": MODEL,
            "served_model_name": "qwen-c",
            "host": "127.0.0.1",
            "port": port,
            "gpus": [0],
            "service_manager": "podman",
            "image": IMAGE,
            "vllm_version": "0.33.0",
            "volumes": volumes,
            "environment": dict(SERVER_ENV),
        },
        **extra,
    )


def test_deploy_redeploy_rollback_and_an_unchanged_run_in_podman_containers(podman_node, tmp_path):
    node, host = podman_node
    image_id = host.build(entrypoint=(str(node.state_dir / "bin" / "vllm"), "serve"))
    (port,) = free_ports(1)
    plain = container_instance(node, host, port)
    write_host_vars(tmp_path, node, [plain], vllm_server_container_options=RUN_OPTIONS)
    inventory = inventory_file(tmp_path, node)

    rc, out, recap = run(inventory)
    assert rc == 0 and recap[node.name]["failed"] == 0, out
    first = host.inspect("vllm-qwen", "{{.Id}} {{.State.Status}} {{.Image}}").split()
    assert first[1:] == ["running", image_id], first
    labels = json.loads(host.inspect("vllm-qwen", "{{json .Config.Labels}}"))
    assert labels["gpuops.nvidia.instance"] == "qwen" and len(labels["gpuops.nvidia.config-digest"]) == 64
    api = [pid for pid, v in processes(node).items() if v[2] == "vllm" and "--port %d" % port in v[3]]
    assert len(api) == 1, processes(node)

    # Check mode with --diff: says what would change and touches nothing.
    config = tmp_path / node.name / "etc" / "qwen.json"
    deployed = config.read_text()
    dflash = '{"test_override": {"speculative_config": %s}}' % json.dumps(CORRECTED)
    rc, out, recap = run(inventory, "--check", "--diff", "-e", dflash)
    assert rc == 0 and recap[node.name]["failed"] == 0, out
    assert any(line.endswith("would redeploy (configuration changed)") for line in summary(out, node)), out
    assert '+    "--speculative-config",' in out and '+      "gpuops.nvidia.config-digest=' in out, out  # the diff
    assert host.inspect("vllm-qwen", "{{.Id}}") == first[0] and config.read_text() == deployed

    # The corrected DFlash config: a new container, gated.
    rc, out, recap = run(inventory, "-e", dflash)
    assert rc == 0 and recap[node.name]["failed"] == 0, out
    lines = summary(out, node)
    assert any(line.startswith("qwen (GPUs 0, http://127.0.0.1:%d): redeployed" % port) for line in lines), lines
    assert any("acceptance rate" in line for line in lines), lines
    second = host.inspect("vllm-qwen", "{{.Id}}")
    assert second != first[0]
    gated = json.loads(host.inspect("vllm-qwen", "{{json .Config.Labels}}"))["gpuops.nvidia.config-digest"]

    # A gate that fails: rolled back to the previous container's configuration.
    failing = {"speculative_config": CORRECTED, "gpu_memory_utilization": 0.8, "min_acceptance_rate": 0.95}
    rc, out, recap = run(inventory, "-e", json.dumps({"test_override": failing}))
    assert rc != 0 and recap[node.name]["failed"] == 1, out
    lines = summary(out, node)
    assert any("rolled back to the previous configuration" in line for line in lines), lines
    assert json.loads(host.inspect("vllm-qwen", "{{json .Config.Labels}}"))["gpuops.nvidia.config-digest"] == gated
    assert host.inspect("vllm-qwen", "{{.State.Status}}") == "running"

    # Nothing changed since: nothing is restarted.
    rc, out, recap = run(inventory, "-e", '{"test_override": {"speculative_config": %s}}' % json.dumps(CORRECTED))
    assert rc == 0 and recap[node.name]["changed"] == 0, out
    assert json.loads(host.inspect("vllm-qwen", "{{json .Config.Labels}}"))["gpuops.nvidia.config-digest"] == gated
