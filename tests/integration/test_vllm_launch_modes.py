"""A redeploy and a reset of an instance in each vLLM 0.33 launch mode end exactly that instance and free its GPUs;
the other instance on the node is untouched.

Launch modes (vllm/entrypoints/cli/serve.py ServeSubcommand.cmd; modelled by tests/sim/simvllm): several API
servers (--api-server-count: APIServer_<i>), data parallel (--data-parallel-size: DPCoordinator, EngineCore_DP<i>,
Worker_DP<i>), the Rust frontend (VLLM_USE_RUST_FRONTEND + VLLM_RUST_FRONTEND_PATH: a `vllm-rs frontend` child), and
the Ray executor, whose workers are actors of the node's raylet (vllm/v1/executor/ray_executor_v2.py), outside the
instance's session and process tree.
"""

from __future__ import annotations

import json
import time

import pytest

from ansible_run import REPO, playbook
from nodetools import gpu_memory, processes
from simnode import VENV_PYTHON, inventory_file
from test_vllm_server import SERVER_ENV, free_ports, instance, run, write_host_vars

RESET = REPO / "playbooks" / "reset_gpus.yml"
SIM_DIR = REPO / "tests" / "sim"
MODES = {
    "api_servers": {"extra_args": ["--api-server-count", "2"]},
    # Two engines of one GPU each: the role gives --tensor-parallel-size 1 --data-parallel-size 2.
    "data_parallel": {"data_parallel_size": 2},
    "rust_frontend": {
        "environment": dict(SERVER_ENV, VLLM_USE_RUST_FRONTEND="1", VLLM_RUST_FRONTEND_PATH="/opt/vllm/bin/vllm-rs")
    },
    "ray": {"extra_args": ["--distributed-executor-backend", "ray"]},
}
# What each mode adds to the instance's processes (besides the launcher, EngineCore(s) and workers).
EXPECTED = {
    "api_servers": ["VLLM::APIServer_0", "VLLM::APIServer_1"],
    "data_parallel": ["VLLM::APIServer_0", "VLLM::APIServer_1", "VLLM::DPCoordinator"],
    "rust_frontend": ["/opt/vllm/bin/vllm-rs frontend"],
    "ray": ["ray::RayWorkerProc.run"],
}


def start_raylet(node, tmp_path):
    """The simulated raylet (simvllm.raylet) in the node; returns (its PID, its socket)."""
    address = str(tmp_path / ("raylet-%s.sock" % node.name))
    code = "import sys; sys.path.insert(0, %r); from simvllm.raylet import main; sys.exit(main([%r]))" % (
        str(SIM_DIR),
        address,
    )
    command = "setsid -f %s -c %s >%s 2>&1" % (VENV_PYTHON, json.dumps(code), tmp_path / "raylet.log")
    node.exec("sh", "-c", command)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        raylets = [pid for pid, entry in processes(node).items() if entry[2] == "raylet" and entry[1] != "Z"]
        if raylets:
            return raylets[0], address
        time.sleep(0.2)
    raise AssertionError("no raylet: %s" % (tmp_path / "raylet.log").read_text())


_SIDS = r"""
import json, os
sids = {}
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            sids[name] = os.getsid(int(name))
        except OSError:
            pass
print(json.dumps(sids))
"""


def instance_processes(node, port, raylet=None):
    """{pid: cmdline} of the instance listening on `port`: its API server's session (launcher, API servers,
    frontend, coordinator, engines, workers) and, with the Ray executor, the raylet's actors."""
    procs = processes(node)
    sids = {int(pid): sid for pid, sid in json.loads(node.py(_SIDS)).items()}
    launcher = [
        pid
        for pid, entry in procs.items()
        if entry[1] != "Z" and " serve " in entry[3] and "--port %d " % port in entry[3] + " "
    ]
    assert len(launcher) == 1, (port, procs)
    return {
        pid: entry[3]
        for pid, entry in procs.items()
        if entry[1] != "Z" and (sids.get(pid) == sids[launcher[0]] or (raylet is not None and entry[0] == raylet))
    }


def held(node, gpus):
    memory = gpu_memory(node)
    return {pid for index in gpus for pid in memory[index][1]}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_redeploy_and_reset_end_exactly_that_instance(simnode, tmp_path, mode):
    node = simnode(gpus=4, release_latency=0.2)
    ports = free_ports(2)
    inventory = inventory_file(tmp_path, node)
    raylet = None
    keys = json.loads(json.dumps(MODES[mode]))
    if mode == "ray":
        raylet, address = start_raylet(node, tmp_path)
        keys["environment"] = dict(SERVER_ENV, RAY_ADDRESS=address)
    a = instance("a", ports[0], [0, 1], **keys)
    b = instance("b", ports[1], [2, 3])
    write_host_vars(tmp_path, node, [a, b])
    rc, out, _recap = run(inventory)
    assert rc == 0, out
    before_a = instance_processes(node, ports[0], raylet)
    before_b = instance_processes(node, ports[1])
    titles = sorted(cmd for cmd in before_a.values())
    for expected in EXPECTED[mode]:
        assert any(cmd.startswith(expected) for cmd in titles), (mode, titles)
    assert held(node, [0, 1]) <= set(before_a) and held(node, [0, 1])

    # Redeploy a (another gpu_memory_utilization): every process of the old a ends, b is untouched.
    write_host_vars(tmp_path, node, [dict(a, gpu_memory_utilization=0.85), b])
    rc, out, _recap = run(inventory)
    assert rc == 0, out
    after_a = instance_processes(node, ports[0], raylet)
    assert not set(before_a) & set(after_a), (before_a, after_a)
    assert not set(before_a) & set(processes(node)) - {pid for pid, e in processes(node).items() if e[1] == "Z"}
    assert instance_processes(node, ports[1]) == before_b
    assert held(node, [0, 1]) <= set(after_a) and held(node, [2, 3]) <= set(before_b)

    # Reset a's GPUs (reset_gpus.yml on GPUs 0 and 1): b is untouched whatever happens to a.
    holders_a = held(node, [0, 1])
    rc, out, recap = playbook(inventory, RESET, "-e", json.dumps({"reset_gpus_gpus": [0, 1]}))
    if mode == "ray":
        # The raylet starts the actors again while their job (a's EngineCore) lives: the reset names the raylet
        # as the owner and says what to do, instead of reporting the GPUs free.
        assert "raylet PID %d" % raylet in out and "ray stop" in out, out
    else:
        assert rc == 0, out
        live = {pid for pid, entry in processes(node).items() if entry[1] != "Z"}
        assert not holders_a & live, (holders_a, processes(node))
        assert not held(node, [0, 1]), gpu_memory(node)
    assert instance_processes(node, ports[1]) == before_b
    assert held(node, [2, 3]) <= set(before_b) and held(node, [2, 3])
