"""Stopping an owner never reaches beyond the selection unasked (issue 22 item 2): a unit with Restart=always whose
processes hold GPU 0 and GPU 4, a reset of GPU 0 with stop_owners. Check mode and the real run refuse, name the
process on GPU 4 and signal nothing; with reset_gpus_stop_spanning_owners the unit is stopped and the run names
what it ended beyond the selection. Issue 33 item 1: a unit that runs processes holding no GPU (cron, a backup job
beside a cron job on a GPU) is not stopped unasked either, and every process a stop ends is named."""

from __future__ import annotations

import json
import re

import pytest

from ansible_run import REPO, playbook
from nodetools import alive, gpu_memory, processes, vllm_instance, wait_for
from ports import free_ports
from simnode import inventory_file
from test_owners import start_in_cgroup, unit_node

PLAYBOOK = REPO / "playbooks" / "reset_gpus.yml"
UNIT = "/system.slice/vllm@a.service"


@pytest.fixture
def spanning(simnode, tmp_path):
    node = unit_node(simnode, {"vllm@a.service": "always"})
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
    # The unit's line names every process the stop ends: the selected holder and the one beyond the selection.
    assert rc == 0 and re.search(
        r"would stop systemd unit vllm@a\.service first \(stop_owners\), ending PID %d .{1,15} \(holds GPU 0, "
        r"selected\), PID %d .{1,15} \(holds GPU 4, outside the selection\)" % (on0, on4),
        out,
    ), out
    assert alive(node, on0) and alive(node, on4)
    rc, out, _recap = playbook(inventory, PLAYBOOK, "-e", json.dumps(extra))
    assert rc == 0 and re.search(
        r"stopped systemd unit vllm@a\.service first \(stop_owners\), which ended PID %d .{1,15} \(holds GPU 0, "
        r"selected\), PID %d .{1,15} \(holds GPU 4, outside the selection\)" % (on0, on4),
        out,
    ), out
    wait_for(lambda: not alive(node, on0) and not alive(node, on4), 10, what="the unit's processes")


CRON = "/system.slice/cron.service"


def spawn_titled(node, title, cgroup):
    """A process that holds no GPU, titled `title`, in `cgroup`; its PID."""
    return node.spawn("import setproctitle, time\nsetproctitle.setproctitle(%r)\ntime.sleep(3600)\n" % title, cgroup)


@pytest.fixture
def cron(simnode, tmp_path):
    """Issue 33 item 1: cron.service runs cron, a backup job and one GPU holder (a cron job) on GPU 4."""
    node = unit_node(simnode, {"cron.service": "on-failure"})
    pids = {
        "cron": spawn_titled(node, "/usr/sbin/cron -f", CRON),
        "backup": spawn_titled(node, "/bin/sh /usr/local/bin/backup.sh", CRON),
        "job": start_in_cgroup(node, 4, CRON, "gpu-job"),
    }
    return node, pids, inventory_file(tmp_path, node)


@pytest.mark.parametrize("check", [True, False])
def test_a_unit_that_runs_processes_holding_no_gpu_is_not_stopped(cron, check):
    node, pids, inventory = cron
    args = ["--check"] if check else []
    rc, out, _recap = playbook(
        inventory, PLAYBOOK, *args, "-e", json.dumps({"reset_gpus_gpus": [4], "reset_gpus_stop_owners": True})
    )
    assert rc != 0 and "nothing was signalled: stop_owners would stop systemd unit cron.service, whose " in out, out
    for name in ("cron", "backup"):
        assert "PID %d (" % pids[name] in out and "holds no GPU" in out, (name, out)
    assert "reset_gpus_stop_spanning_owners: true" in out, out
    assert all(alive(node, pid) for pid in pids.values())
    assert node.exec("systemctl", "is-active", "cron.service", check=False).stdout.strip() == "active"


def test_stop_spanning_owners_names_every_process_the_stop_ends(cron):
    node, pids, inventory = cron
    extra = {"reset_gpus_gpus": [4], "reset_gpus_stop_owners": True, "reset_gpus_stop_spanning_owners": True}
    rc, out, _recap = playbook(inventory, PLAYBOOK, "--check", "-e", json.dumps(extra))
    assert rc == 0 and "would stop systemd unit cron.service first (stop_owners), ending PID %d " % pids["job"] in out
    assert "(holds GPU 4, selected)" in out, out
    for name in ("cron", "backup"):
        assert re.search(r"PID %d .{1,15} \(holds no GPU, beyond the selection\)" % pids[name], out), (name, out)
    assert all(alive(node, pid) for pid in pids.values())

    rc, out, _recap = playbook(inventory, PLAYBOOK, "-e", json.dumps(extra))
    assert rc == 0 and "stopped systemd unit cron.service first (stop_owners), which ended PID %d " % pids["job"] in out
    for name in ("cron", "backup"):
        assert re.search(r"PID %d .{1,15} \(holds no GPU, beyond the selection\)" % pids[name], out), (name, out)
    assert "[still running after the stop]" not in out, out
    wait_for(lambda: not any(alive(node, pid) for pid in pids.values()), 10, what="the unit's processes")


def test_a_vllm_unit_is_stopped_with_its_api_server_unasked(simnode, tmp_path):
    """The API server of a vLLM unit holds no GPU: it is the holders' own agent (they end together), so stop_owners
    stops the unit without stop_spanning_owners, and names the API server as part of the selected work."""
    node = unit_node(simnode, {"vllm@a.service": "always"}, gpus=2)
    port = free_ports(1)[0]
    serve = "setsid -f vllm serve /models/m --port %d --host 127.0.0.1 >/dev/null 2>&1" % port
    node.exec("sh", "-c", serve, cgroup=UNIT)
    api = wait_for(
        lambda: next((pid for pid, v in processes(node).items() if "bin/vllm serve" in v[3] and v[1] != "Z"), None),
        30,
        what="the API server",
    )
    wait_for(lambda: vllm_instance(node, api)[0] and gpu_memory(node)[0][1], 60, what="the engine on GPU 0")
    extra = {"reset_gpus_units": ["vllm@a"], "reset_gpus_stop_owners": True}
    rc, out, _recap = playbook(inventory_file(tmp_path, node), PLAYBOOK, "-e", json.dumps(extra))
    assert rc == 0 and "stopped systemd unit vllm@a.service first (stop_owners), which ended PID " in out, out
    assert re.search(r"PID %d .{1,15} \(holds no GPU, part of the selected work\)" % api, out), out
    wait_for(lambda: not alive(node, api), 10, what="the API server")
