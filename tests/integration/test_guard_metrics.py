"""The guard's metrics (playbooks/guard_metrics.yml, gpu_guard) on simulated nodes: the orphans of a killed API server
named exactly (PID and start time), a live instance and a bystander NVML client left out, vLLM states, and the
textfile accepted by `promtool check metrics`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from ansible_run import playbook
from nodetools import free_ports, processes, start_nvml_monitor, start_vllm, vllm_instance
from simnode import inventory_file

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def series(text, name):
    """[(labels dict, value)] of metric `name` in a textfile."""
    found = []
    for line in text.splitlines():
        match = re.match(r"^%s\{(.*)\} (\S+)$" % re.escape(name), line)
        if match:
            found.append((dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1))), float(match.group(2))))
    return found


def start_ticks(node, pid):
    stat = node.exec("cat", "/proc/%d/stat" % pid).stdout
    return int(stat[stat.rindex(")") + 2 :].split()[19])


@pytest.fixture
def promtool():
    if not shutil.which(PROMTOOL):
        pytest.fail("promtool is missing: scripts/setup.sh installs it (Debian package prometheus)")
    return PROMTOOL


def test_orphans_of_a_killed_server_only(simnode, tmp_path, promtool):
    node = simnode(gpus=4)
    dead = start_vllm(node, "/models/m", "--tensor-parallel-size", "2", env={"CUDA_VISIBLE_DEVICES": "0,1"})
    port = free_ports(1)[0]
    live = start_vllm(node, "/models/m", "--port", str(port), "--host", "127.0.0.1", env={"CUDA_VISIBLE_DEVICES": "2"})
    bystander = start_nvml_monitor(node)
    _engines, workers = vllm_instance(node, dead)
    node.exec("kill", "-9", str(dead))
    inventory = inventory_file(tmp_path, node)
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / ("%s.yml" % node.name)).write_text(
        json.dumps({"vllm_server_instances": [{"name": "live", "port": port, "model": "/models/m"}]})
    )
    textfile = tmp_path / "guard.prom"
    extra = json.dumps({"guard_textfile": str(textfile), "guard_stall_seconds": 2})
    rc, out, recap = playbook(inventory, "playbooks/guard_metrics.yml", "-e", extra)
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    text = textfile.read_text()
    orphans = series(text, "gpuops_nvidia_guard_orphan_memory_bytes")
    assert sorted((int(labels["pid"]), int(labels["start_ticks"])) for labels, _value in orphans) == [
        (pid, start_ticks(node, pid)) for pid in workers
    ], text
    assert {labels["reason"] for labels, _v in orphans} == {"vllm_server_exited"}
    assert {labels["inventory_hostname"] for labels, _v in orphans} == {node.name}
    assert all(value > 70000 * 2**20 for _labels, value in orphans)
    named = {int(labels["pid"]) for labels, _v in orphans}
    assert live not in named and bystander not in named and not named & set(processes(node)) - set(workers)
    counts = {labels["gpu"]: value for labels, value in series(text, "gpuops_nvidia_guard_gpu_orphaned_holders")}
    assert counts == {"0": 1, "1": 1, "2": 0, "3": 0}, text
    states = {labels["state"]: value for labels, value in series(text, "gpuops_nvidia_guard_vllm_state")}
    assert states == {"healthy": 1, "stalled": 0, "down": 0, "unknown": 0}, text
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # Nothing changed on the host: the figures are the same, only the time of the look moves.
    rc, out, recap = playbook(inventory, "playbooks/guard_metrics.yml", "-e", extra)
    assert rc == 0 and recap[node.name]["changed"] == 0, out
