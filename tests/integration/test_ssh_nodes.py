"""Nodes reached by Ansible over real SSH (gpunode up --ssh): one sshd per node, sessions inside the node."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ansible_run import REPO, playbook
from nodetools import alive, gpu_memory
from simnode import inventory_file

sys.path.insert(0, str(REPO / "scripts" / "bench"))
import nodeload  # noqa: E402

PLAYBOOK = REPO / "playbooks" / "reset_gpus.yml"
ENSURE_TOOLS = REPO / "scripts" / "bench" / "ensure_tools.sh"


@pytest.fixture
def ssh_nodes(simnode):
    """Factory `ssh_nodes(count, **knobs) -> [Node]` of SSH-reached nodes; skips where sshd cannot be installed."""
    result = subprocess.run([str(ENSURE_TOOLS), "sshd"], capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        pytest.skip(result.stderr.strip() or "ensure_tools.sh sshd failed")
    return lambda count, **knobs: [simnode(ssh=True, **knobs) for _number in range(count)]


def ssh(node, command: str) -> str:
    """Run `command` on `node` with plain ssh and the node's key; return its stdout."""
    return subprocess.run(node.ssh_argv(command), capture_output=True, text=True, timeout=60, check=True).stdout


def test_ssh_session_lands_inside_its_node(ssh_nodes):
    first, second = ssh_nodes(2, gpus=2)
    assert first.info["ssh"]["host"] != second.info["ssh"]["host"]
    for node in (first, second):
        # PID 1 of the session's PID namespace is the node's init, and the node's own /dev is there.
        assert ssh(node, "cat /proc/1/cmdline").split("\0")[2] == str(node.state_dir)
        assert ssh(node, "ls /dev/nvidia0 /dev/nvidiactl").split() == ["/dev/nvidia0", "/dev/nvidiactl"]


def test_reset_over_ssh_ends_the_orphaned_tree_on_every_node(ssh_nodes, tmp_path):
    nodes = ssh_nodes(3, gpus=4, release_latency=0.2)
    trees = [nodeload.orphaned_tree(node, tp=4) for node in nodes]
    inventory = inventory_file(tmp_path, *nodes)
    assert "ansible_connection" not in inventory.read_text()  # reached over SSH, not through nsenter
    assert all(used == 1024 for node in nodes for used, _pids in gpu_memory(node))

    rc, out, recap = playbook(inventory, PLAYBOOK)

    assert rc == 0, out
    assert out.count("memory released after") == 3, out
    for node, tree in zip(nodes, trees):
        assert recap[node.name]["changed"] == 1 and recap[node.name]["failed"] == 0, out
        assert not any(alive(node, pid) for pid in [tree["engine"]] + tree["workers"])
        assert all(used == 0 and not pids for used, pids in gpu_memory(node))
    rc, out, recap = playbook(inventory, PLAYBOOK)
    assert rc == 0 and all(recap[node.name]["changed"] == 0 for node in nodes), out
