"""Stopping an owner never reaches beyond the selection unasked (issue 22 item 2): a unit with Restart=always whose
processes hold GPU 0 and GPU 4, a reset of GPU 0 with stop_owners. Check mode and the real run refuse, name the
process on GPU 4 and signal nothing; with reset_gpus_stop_spanning_owners the unit is stopped and the run names
what it ended beyond the selection."""

from __future__ import annotations

import json

import pytest

from ansible_run import REPO, playbook
from nodetools import alive, wait_for
from simnode import inventory_file
from test_owners import start_in_cgroup

PLAYBOOK = REPO / "playbooks" / "reset_gpus.yml"
UNIT = "/system.slice/vllm@a.service"


@pytest.fixture
def spanning(simnode, tmp_path):
    node = simnode(gpus=5, release_latency=0.2)
    if node.cgroup_root is None:
        pytest.skip("this machine gives simulated nodes no owner cgroups: %s" % node.info.get("cgroup_unsupported"))
    node.set_units({"vllm@a.service": {"Restart": "always", "TimeoutStopSec": 5}})
    on0 = start_in_cgroup(node, 0, UNIT, "span-gpu0")
    on4 = start_in_cgroup(node, 4, UNIT, "span-gpu4")
    return node, on0, on4, inventory_file(tmp_path, node)


@pytest.mark.parametrize("check", [True, False])
def test_a_unit_that_also_holds_an_unselected_gpu_is_not_stopped(spanning, check):
    node, on0, on4, inventory = spanning
    args = ["--check"] if check else []
    rc, out, _recap = playbook(
        inventory, PLAYBOOK, *args, "-e", json.dumps({"reset_gpus_gpus": [0], "reset_gpus_stop_owners": True})
    )
    assert rc != 0, out
    assert "nothing was signalled: stop_owners would stop systemd unit vllm@a.service" in out, out
    assert "PID %d (" % on4 in out and "holds GPU 4, outside the selection" in out, out
    assert "reset_gpus_stop_spanning_owners: true" in out, out
    assert alive(node, on0) and alive(node, on4)


def test_stop_spanning_owners_stops_the_unit_and_names_what_it_ended(spanning):
    node, on0, on4, inventory = spanning
    extra = {"reset_gpus_gpus": [0], "reset_gpus_stop_owners": True, "reset_gpus_stop_spanning_owners": True}
    rc, out, _recap = playbook(inventory, PLAYBOOK, "--check", "-e", json.dumps(extra))
    assert (
        rc == 0 and "would stop systemd unit vllm@a.service, and with it, beyond the selection: PID %d" % on4 in out
    ), out
    assert alive(node, on0) and alive(node, on4)
    rc, out, _recap = playbook(inventory, PLAYBOOK, "-e", json.dumps(extra))
    assert rc == 0, out
    assert "stopped systemd unit vllm@a.service, and with it, beyond the selection: PID %d" % on4 in out, out
    wait_for(lambda: not alive(node, on0) and not alive(node, on4), 10, what="the unit's processes")
