"""Holder attribution (docs/attribution.md, issue 10) end to end on simulated nodes whose processes
open device files as real ones do (tests/sim/README.md, "Device files per process kind"): a process
with /dev/nvidiaN open does not necessarily hold GPU N's memory.

Each test asserts what an operator sees: which processes are alive afterwards, the memory per GPU,
the module results and the play output.
"""

from __future__ import annotations

import json

import pytest

from ansible_run import REPO, module, only, playbook
from nodetools import (
    Container,
    alive,
    driver_lists,
    processes,
    start_cuda_process,
    start_holder,
    start_mps,
    start_mps_client,
    start_nvml_monitor,
    start_vllm,
    vllm_instance,
    wait_for,
)
from simnode import inventory_file

RESET = REPO / "playbooks" / "reset_gpus.yml"
CHECK = REPO / "playbooks" / "check_gpus.yml"
POOL_MIB = int(0.5 * 81559)  # simulated vLLM's pool at --gpu-memory-utilization 0.5


def extra(**variables):
    return ["-e", json.dumps(variables)]


def test_reset_of_one_tp2_instance_leaves_the_other_instance_running(simnode, tmp_path):
    """Defects 1 and 3: NCCL keeps NVML initialized in every TP worker, so instance A's workers have
    /dev/nvidia2 and /dev/nvidia3 open while holding nothing there."""
    node = simnode(gpus=4, release_latency=0.2)
    serve = (
        "/models/m",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--tensor-parallel-size",
        "2",
        "--gpu-memory-utilization",
        "0.5",
    )
    api_a = start_vllm(node, *serve, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    api_b = start_vllm(node, *serve, env={"CUDA_VISIBLE_DEVICES": "2,3"})
    (engine_a,), workers_a = vllm_instance(node, api_a)
    (engine_b,), workers_b = vllm_instance(node, api_b)

    rc, out, _recap = playbook(
        inventory_file(tmp_path, node), RESET, *extra(reset_gpus_gpus=[2, 3], reset_gpus_timeout=20)
    )

    assert rc == 0, out
    assert not any(alive(node, pid) for pid in workers_b + [engine_b])
    assert all(alive(node, pid) for pid in [api_a, engine_a] + workers_a), out
    lists = driver_lists(node)
    assert [lists[i]["compute"] for i in (0, 1)] == [{workers_a[0]: POOL_MIB}, {workers_a[1]: POOL_MIB}]
    assert [lists[i]["used"] for i in range(4)] == [POOL_MIB, POOL_MIB, 0, 0]


def test_nvml_exporter_is_no_holder_for_check_gpus_or_check_mode(simnode, tmp_path):
    """Defect 2: an NVML exporter holds /dev/nvidiactl and every /dev/nvidiaN, and no memory."""
    node = simnode(gpus=2, release_latency=0.1)
    exporter = start_nvml_monitor(node, title="nvidia_gpu_exporter")
    inventory = inventory_file(tmp_path, node)

    rc, out, _recap = playbook(inventory, CHECK)
    assert rc == 0, out

    holder = start_holder(node, [1], mib=2048)
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", check=True))
    assert status == "CHANGED", result
    assert [entry["pid"] for entry in result["would_signal"]] == [holder], result
    assert alive(node, exporter) and alive(node, holder)


def test_nvml_exporter_survives_a_full_reset(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.1)
    exporter = start_nvml_monitor(node, title="nvidia_gpu_exporter")
    holders = [start_holder(node, [0], mib=4096), start_holder(node, [1], mib=1024, title="VLLM::EngineCore")]

    rc, out, _recap = playbook(inventory_file(tmp_path, node), RESET, *extra(reset_gpus_timeout=15))

    assert rc == 0, out
    assert alive(node, exporter), out
    assert not any(alive(node, pid) for pid in holders)
    assert [gpu["used"] for gpu in driver_lists(node)] == [0, 0]

    # Named in reset_gpus_pids, it is still no holder: not signalled, and the summary says so.
    rc, out, _recap = playbook(inventory_file(tmp_path, node), RESET, *extra(reset_gpus_pids=[exporter]))
    assert rc == 0 and alive(node, exporter), out
    assert "PID(s) %d from pids hold none of the selected GPUs (or do not exist): not signalled" % exporter in out, out


def test_a_dry_run_names_the_child_of_a_dead_creator_whose_number_has_a_context_of_its_own(simnode, tmp_path):
    """Issue 40, item 8: a trainer under a launcher forked a worker and died; its number went to a new process with a
    context of its own on the same GPU. The driver lists that number once with both contexts (7000 MiB). The worker
    holds the dead trainer's context: the look names it (contexts_of), the new process is not charged the worker's
    memory, and check mode (what reset_gpus --check reports) names both processes that the run then ends; the
    exporter stays."""
    node = simnode(gpus=1, release_latency=0.1)
    exporter = start_nvml_monitor(node)
    worker = start_cuda_process(node, [0], mib=2000, visible=[0], mode="inherit", launcher=True)
    ((trainer, _mib),) = driver_lists(node)[0]["compute"].items()
    wait_for(lambda: trainer not in processes(node), 10, 0.02, "the trainer reaped")
    reuser = start_cuda_process(node, [0], mib=5000, visible=[0], pid=trainer)
    assert reuser == trainer and driver_lists(node)[0] == {"used": 7000, "compute": {trainer: 7000}, "mps": {}}
    inventory = inventory_file(tmp_path, node)

    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", {"wait": True}, check=True))
    assert status == "CHANGED" and result["msg"].startswith("would signal 2 process(es)"), result
    assert sorted(entry["pid"] for entry in result["would_signal"]) == sorted([worker, reuser]), result
    holders = {h["pid"]: h for h in result["before"]["holders"]}
    assert holders[reuser]["memory_mib"] == {"0": None} and holders[reuser]["attribution"] == {"0": "driver"}
    assert holders[worker]["contexts_of"] == {"0": [reuser]} and holders[worker]["memory_mib"] == {"0": None}
    exited = result["before"]["gpus"][0]["exited"]
    assert [(e["pid"], e["used_mib"], e["reason"]) for e in exited] == [(reuser, 7000, "reused")], result
    assert all(alive(node, pid) for pid in (worker, reuser, exporter))

    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", {"wait": True, "wait_timeout": 15}))
    assert status == "CHANGED" and sorted(entry["pid"] for entry in result["signalled"]) == sorted([worker, reuser])
    assert result["released"] is True and len(result["signalled"]) == 2, result
    assert not alive(node, worker) and not alive(node, reuser) and alive(node, exporter)
    assert driver_lists(node)[0]["used"] == 0


@pytest.mark.parametrize("selection", ["match", "pids", "users", "exclude"])
def test_filtered_reset_does_not_wait_for_what_it_leaves_alone(simnode, tmp_path, selection):
    """README's "only vLLM processes" example: another process with its own context on the same
    GPU is left alone; the reset must succeed at once and say what it left."""
    node = simnode(gpus=2, release_latency=0.1)
    target = start_holder(node, [0], mib=2048, title="VLLM::EngineCore")
    if selection == "users":
        left = start_cuda_process(node, [0], mib=3072, visible=[0], user="nobody")
    else:
        left = start_holder(node, [0], mib=3072, title="trainer")
    choice = {
        "match": {"reset_gpus_match": "VLLM::"},
        "pids": {"reset_gpus_pids": [target]},
        "users": {"reset_gpus_users": ["root"]},
        "exclude": {"reset_gpus_exclude": ["trainer"]},
    }[selection]

    rc, out, _recap = playbook(
        inventory_file(tmp_path, node), RESET, *extra(reset_gpus_gpus=[0], reset_gpus_timeout=6, **choice)
    )

    assert rc == 0, out
    assert not alive(node, target) and alive(node, left)
    assert str(left) in out, out
    assert "besides 3072 MiB that left-alone processes hold" in out, out
    assert driver_lists(node)[0] == {"used": 3072, "compute": {left: 3072}, "mps": {}}


@pytest.mark.parametrize("visible", [[1], [0, 1]], ids=["sees-gpu1", "sees-both"])
@pytest.mark.parametrize("driver_version", ["580.95.05", "535.104.05"])
def test_reset_inside_a_container_spares_its_job_whose_pid_the_driver_lists_elsewhere(
    simnode, tmp_path, driver_version, visible
):
    """Defect 4: inside a container PID N is another process than the node's PID N. 580.95.05: the container sees
    its own numbers and not the node's job (gpu_rmapi.c _gpuConvertPid); 535.104.05: it sees the node's numbers.
    "sees-both" (issue 33 item 3): the container's job also sees GPU 0, so it holds GPU 0's file and maps it
    write-only as cuInit does, but has no context there (no rw-s mapping): still not the listed holder of GPU 0."""
    node = simnode(gpus=2, release_latency=0.1)
    node.set(driver_version=driver_version)
    host_job = start_holder(node, [0], mib=5000)
    container = Container(node, tmp_path)
    job = start_cuda_process(node, [1], mib=4000, visible=visible, container=container, pid=host_job)
    assert job == host_job  # container PID == the node PID of the job on GPU 0

    status, result = only(
        module(container.inventory(tmp_path), "gpuops.nvidia.gpu_kill", {"gpus": [0], "grace_period": 2})
    )

    inside = container.processes()
    assert job in inside and inside[job][1] != "Z", (status, result)
    assert alive(node, host_job)
    assert job not in [entry.get("pid") for entry in result.get("signalled", [])], result
    assert [gpu["used"] for gpu in driver_lists(node)] == [5000, 4000]


def test_other_namespaces_memory_is_named_in_a_container_on_a_translating_driver(simnode, tmp_path):
    """580.95.05 lists only the caller's namespace: from the container, the node's 6000 MiB on GPU 1 are listed
    nowhere. The check names another PID namespace (or a leak) and ends nothing of the container for it."""
    node = simnode(gpus=2, release_latency=0.1)
    container = Container(node, tmp_path)
    bystander = container.launch(["sleep", "600"])
    holder = start_cuda_process(node, [1], mib=6000, visible=[1], pid=4242)
    assert holder == 4242 and holder not in container.processes()

    rc, out, _recap = playbook(container.inventory(tmp_path), CHECK)

    assert rc != 0, out
    assert "6000 MiB that no listed process explains" in out, out
    assert "another PID namespace" in out and "run the check there" in out and "leaked" in out, out
    assert "the driver lists PID" not in out, out
    assert alive(node, holder) and bystander in container.processes()


def test_driver_listed_pid_absent_here_is_named_and_no_gpu_reset_is_advised_before_535_113(simnode, tmp_path):
    """Defect 5, on a driver before 535.113.01 (init-namespace numbers): a listed PID with 6000 MiB that does not exist
    in the container's PID namespace is a host process: named, the next step is the host, never a GPU reset."""
    node = simnode(gpus=2, release_latency=0.1)
    node.set(driver_version="535.104.05")
    container = Container(node, tmp_path)
    holder = start_cuda_process(node, [1], mib=6000, visible=[1], pid=4242)
    assert holder == 4242 and holder not in container.processes()

    rc, out, _recap = playbook(container.inventory(tmp_path), CHECK)

    assert rc != 0, out
    assert "the driver lists PID %d (6000 MiB) on GPU 1" % holder in out, out
    assert "reset the GPU" not in out and "--gpu-reset" not in out, out
    assert alive(node, holder)


def test_mps_clients_of_a_dead_owner_are_ended_and_the_mps_daemons_untouched(simnode, tmp_path):
    """MPS clients hold only /dev/nvidiactl and /dev/nvidia-uvm; the driver lists them in the MPS
    list. Their owner (the job that started them) is gone: they are orphans of the node's init."""
    node = simnode(gpus=2, release_latency=0.2)
    control, server = start_mps(node, [0])
    clients = [start_mps_client(node, [0], mib=3000), start_mps_client(node, [0], mib=2000)]
    assert driver_lists(node)[0]["mps"] == {clients[0]: 3000, clients[1]: 2000}

    rc, out, _recap = playbook(
        inventory_file(tmp_path, node), RESET, *extra(reset_gpus_gpus=[0], reset_gpus_timeout=15)
    )

    assert rc == 0, out
    assert not any(alive(node, pid) for pid in clients), out
    assert alive(node, control) and alive(node, server)
    wait_for(
        lambda: driver_lists(node)[0] == {"used": 32, "compute": {server: 32}, "mps": {}},
        5,
        0.1,
        "only the MPS server's context on GPU 0",
    )
