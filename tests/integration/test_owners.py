"""Owners of holders (issue 14) on a simulated node with real cgroups: each owner kind is reported, each owner
filter ends exactly its holders, a unit with Restart=always is named in check mode and stopped with stop_owners
(module and reset_gpus role), the role's summary, JSON report and textfile name owners, and a respawning agent is
named."""

from __future__ import annotations

import json
import re

import pytest

from ansible_run import REPO, module, only, playbook
from nodetools import CUDA_PROCESS, _await_ready, _ready_file, alive, cuda_spec, node_python, wait_for
from simnode import inventory_file

PLAYBOOK = REPO / "playbooks" / "reset_gpus.yml"
CONTAINER = "4f" * 32
POD_UID = "6b1f3c2e-8a4d-4c1e-9f2a-0d3b5e7a9c11"
CGROUPS = {
    "unit": "/system.slice/vllm@a.service",
    "docker": "/system.slice/docker-%s.scope" % CONTAINER,
    "pod": "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope"
    % (POD_UID.replace("-", "_"), "9a" * 32),
    "slurm": "/system.slice/slurmstepd.scope/job_42/step_0/user/task_0",
}

# A torchrun-like agent: restarts its CUDA child whenever it exits (as torch.distributed.elastic does). Installed
# as a script named torchrun, so its command line reads like the real one: `python .../torchrun --nproc-per-node 1 ...`.
AGENT = r"""
import json, subprocess, sys, time
spec, code = json.loads(sys.argv[-2]), sys.argv[-1]
for _ in range(5):
    subprocess.run([sys.executable, "-c", code, json.dumps(spec)])
time.sleep(3600)
"""


def start_in_cgroup(node, gpu, cgroup, title):
    path, host_path = _ready_file(node, "owner")
    spec = dict(cuda_spec([gpu], 2000, title=title), ready=path)
    node.exec(
        "sh",
        "-c",
        'exec "$@" </dev/null >/dev/null 2>&1',
        "sh",
        "setsid",
        "-f",
        node_python(),
        "-c",
        CUDA_PROCESS,
        json.dumps(spec),
        cgroup=cgroup,
    )
    return _await_ready(host_path, title)[0]


def unit_node(simnode, units, gpus=5):
    """A node with owner cgroups (skipped where this machine gives nodes none) and the unit table `units` of its
    simulated systemctl ({name: Restart= policy})."""
    node = simnode(gpus=gpus, release_latency=0.2)
    if node.cgroup_root is None:
        pytest.skip("this machine gives simulated nodes no owner cgroups: %s" % node.info.get("cgroup_unsupported"))
    node.set_units({name: {"Restart": restart, "TimeoutStopSec": 5} for name, restart in units.items()})
    return node


@pytest.fixture
def owned(simnode, tmp_path):
    node = unit_node(simnode, {"vllm@a.service": "always"})
    pids = {
        kind: start_in_cgroup(node, gpu, cgroup, "holder-%s" % kind)
        for gpu, (kind, cgroup) in enumerate(CGROUPS.items())
    }
    return node, pids, inventory_file(tmp_path, node)


def test_each_owner_kind_is_reported(owned):
    node, pids, inventory = owned
    status, result = only(module(inventory, "gpuops.nvidia.gpu_facts"))
    assert status == "SUCCESS", result
    owners = {h["pid"]: h["owner"] for h in result["ansible_facts"]["nvidia"]["holders"]}
    assert owners[pids["unit"]]["systemd_unit"] == "vllm@a.service" and owners[pids["unit"]]["unit_restart"] == "always"
    assert (owners[pids["docker"]]["container_id"], owners[pids["docker"]]["runtime"]) == (CONTAINER, "docker")
    assert owners[pids["pod"]]["pod_uid"] == POD_UID and owners[pids["pod"]]["runtime"] == "containerd"
    assert owners[pids["slurm"]]["slurm_job"] == "42"
    # Missing pieces are null, never guessed.
    assert owners[pids["docker"]]["pod_uid"] is None and owners[pids["slurm"]]["container_id"] is None


@pytest.mark.parametrize(
    "selection, kind",
    [
        ({"units": ["vllm@a"]}, "unit"),
        ({"containers": [CONTAINER[:12]]}, "docker"),
        ({"pods": [POD_UID]}, "pod"),
        ({"slurm_jobs": ["42"]}, "slurm"),
    ],
)
def test_each_owner_filter_ends_exactly_its_holders(owned, selection, kind):
    node, pids, inventory = owned
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", dict(selection, grace_period=2)))
    assert status == "CHANGED" and [p["pid"] for p in result["signalled"]] == [pids[kind]], result
    wait_for(lambda: not alive(node, pids[kind]), 10, what="the selected holder's exit")
    assert all(alive(node, pid) for other, pid in pids.items() if other != kind)
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", selection))
    assert status == "SUCCESS" and result["changed"] is False


def test_restarting_unit_is_named_in_check_mode_and_stopped_with_stop_owners(owned):
    node, pids, inventory = owned
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", {"units": ["vllm@a"]}, check=True))
    (planned,) = result["would_signal"]
    assert status == "CHANGED" and planned["pid"] == pids["unit"] and "Restart=always" in planned["owner_note"], result
    assert alive(node, pids["unit"])
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", {"units": ["vllm@a"], "stop_owners": True}))
    assert status == "CHANGED" and result["stopped_units"] == ["vllm@a.service"], result
    wait_for(lambda: not alive(node, pids["unit"]), 10, what="the unit's holder")
    assert alive(node, pids["docker"]) and alive(node, pids["pod"])


def test_role_names_the_restarting_unit_in_check_mode_and_stops_it_with_stop_owners(owned, tmp_path):
    node, pids, inventory = owned
    holder = r"PID %d \S+ \(GPUs 0, unit vllm@a\.service\)" % pids["unit"]
    note = (
        "    ending it alone will not last: systemd unit vllm@a.service restarts it (Restart=always); "
        "stop the owner: systemctl stop vllm@a.service"
    )
    rc, out, recap = playbook(inventory, PLAYBOOK, "--check", "-e", json.dumps({"reset_gpus_units": ["vllm@a"]}))
    assert rc == 0 and recap[node.name]["failed"] == 0, out
    assert re.search(r"would signal %s: " % holder, out) and note in out, out
    assert alive(node, pids["unit"])

    reports, textfile = tmp_path / "reports", tmp_path / "gpuops_nvidia.prom"
    extra = {
        "reset_gpus_units": ["vllm@a"],
        "reset_gpus_stop_owners": True,
        "reset_gpus_report_dir": str(reports),
        "reset_gpus_textfile": str(textfile),
    }
    rc, out, recap = playbook(inventory, PLAYBOOK, "-e", json.dumps(extra))
    assert rc == 0 and recap[node.name]["failed"] == 0, out
    # The simulated systemctl ended the unit's process: the summary names the unit, and the holder with its owner.
    assert "stopped systemd unit vllm@a.service first (stop_owners)" in out and re.search(holder, out), out
    assert "ending it alone will not last" not in out, out
    assert not alive(node, pids["unit"]) and all(alive(node, pids[kind]) for kind in ("docker", "pod", "slurm"))
    assert node.exec("systemctl", "is-active", "vllm@a.service", check=False).stdout.strip() == "inactive"
    report = json.loads((reports / ("%s.json" % node.name)).read_text())
    assert report["stopped_units"] == ["vllm@a.service"] and report["outcome"] == "released", report
    assert "gpuops_nvidia_reset_stopped_units 1\n" in textfile.read_text()


def test_role_summary_report_and_textfile_name_the_owner_of_a_signalled_holder(owned, tmp_path):
    node, pids, inventory = owned
    # The memory is released 1.5 s after the exit, after gpu_kill's first slice of 0.5 s: the role goes on with
    # gpu_wait and its summary comes from the reset_gpus_result filter (plugins/filter/reports/reports.py), which calls
    # _report.summary_lines as gpu_kill does on the common path.
    node.set(release_latency=1.5)
    reports, textfile = tmp_path / "reports", tmp_path / "gpuops_nvidia.prom"
    extra = {
        "reset_gpus_containers": [CONTAINER[:12]],
        "reset_gpus_grace_period": 2,
        "reset_gpus_progress_interval": 0.5,
        "reset_gpus_report_dir": str(reports),
        "reset_gpus_textfile": str(textfile),
    }
    rc, out, recap = playbook(inventory, PLAYBOOK, "-e", json.dumps(extra))
    assert rc == 0 and recap[node.name]["failed"] == 0 and "still held after" in out, out
    assert re.search(
        r"PID %d \S+ \(GPUs 1, docker container %s\): SIGTERM, exited after" % (pids["docker"], CONTAINER[:12]), out
    ), out
    assert (
        "ending it alone will not last: it belongs to docker container %s, whose runtime may restart it; "
        "stop the owner: docker stop -t 2 %s" % (CONTAINER[:12], CONTAINER[:12])
    ) in out, out
    (signalled,) = json.loads((reports / ("%s.json" % node.name)).read_text())["signalled"]
    assert signalled["owner"]["container_id"] == CONTAINER and signalled["owner_label"] == "container:" + CONTAINER[:12]
    assert signalled["owner_command"] == "docker stop -t 2 " + CONTAINER[:12], signalled
    metrics = textfile.read_text()
    assert 'gpuops_nvidia_reset_signalled_processes_by_owner{owner="container:%s"} 1\n' % CONTAINER[:12] in metrics
    assert metrics.count("gpuops_nvidia_reset_signalled_processes_by_owner{") == 1, metrics


def test_container_holder_gets_the_command_that_stops_its_owner(owned):
    # Check mode: the docker container that stop_owners would stop, with its command and timeout, and what the stop
    # would end. (A real stop runs the runtime: tests/integration/test_vllm_podman.py, with a real podman.)
    node, pids, inventory = owned
    status, result = only(
        module(
            inventory,
            "gpuops.nvidia.gpu_kill",
            {"containers": [CONTAINER], "stop_owners": True, "grace_period": 2},
            check=True,
        )
    )
    command = "docker stop -t 2 %s" % CONTAINER[:12]
    assert status == "CHANGED" and result["would_stop_containers"] == [
        {"id": CONTAINER, "runtime": "docker", "command": command}
    ], result
    assert [(p["pid"], p["why"]) for p in result["container_processes"][CONTAINER]] == [(pids["docker"], "selected")]
    assert result["owner_commands"] == [] and result["stopped_units"] == [] and alive(node, pids["docker"])
    assert (
        "would stop docker container %s first (stop_owners: %s), ending PID %d"
        % (CONTAINER[:12], command, pids["docker"])
        in result["msg"]
    ), result["msg"]


def test_respawning_agent_is_named_with_its_parent(simnode, tmp_path):
    node = simnode(gpus=1, release_latency=0.1)
    path, host_path = _ready_file(node, "agent-child")
    spec = dict(cuda_spec([0], 1000, title="train-worker"), ready=path)
    script = host_path.parent / "torchrun"
    script.write_text(AGENT)
    node.exec(
        "sh",
        "-c",
        'exec "$@" </dev/null >/dev/null 2>&1',
        "sh",
        "setsid",
        "-f",
        node_python(),
        "/run/gpusim/nodetools/torchrun",
        "--nproc-per-node",
        "1",
        json.dumps(spec),
        CUDA_PROCESS,
    )
    first = _await_ready(host_path, "the agent's first child")[0]
    inventory = inventory_file(tmp_path, node)
    status, result = only(module(inventory, "gpuops.nvidia.gpu_facts"))
    (holder,) = result["ansible_facts"]["nvidia"]["holders"]
    assert holder["pid"] == first and holder["owner"]["agent"]["kind"] == "torchrun", holder
    agent = holder["owner"]["agent"]["pid"]
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", {"grace_period": 2}))
    assert status == "CHANGED" and [p["pid"] for p in result["signalled"]] == [first], result
    # The agent starts a new worker; the wait names it with its parent and says to stop that parent.
    second = wait_for(
        lambda: _await_ready(host_path, "the agent's next child")[0] != first and _await_ready(host_path, "")[0],
        20,
        what="the respawned child",
    )
    status, result = only(module(inventory, "gpuops.nvidia.gpu_wait", {"timeout": 1}))
    assert status == "FAILED!" and "PID %s" % second in result["msg"], result["msg"]
    assert "stop their parent (PID %s" % agent in result["msg"], result["msg"]
