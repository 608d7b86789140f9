"""Which device files simulated processes open, and what the fake driver lists for them
(tests/sim/README.md, "Device files per process kind", "MPS clients", "/proc/driver/nvidia").

Each test runs a simulated node; the helpers are tests/integration/nodetools.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from integration.nodetools import (
    Container,
    device_fds,
    driver_lists,
    start_cuda_process,
    start_holder,
    start_mps,
    start_mps_client,
    start_nvml_monitor,
    start_vllm,
    vllm_instance,
    wait_for,
)

CTL, UVM = "/dev/nvidiactl", "/dev/nvidia-uvm"


def dev(minor):
    return "/dev/nvidia%d" % minor


def test_cuda_process_opens_every_visible_gpu_with_a_context_only_where_it_computes(simnode):
    node = simnode(gpus=4, minors=[3, 1, 7, 0])
    pid = start_cuda_process(node, [2], mib=500, visible=[1, 2])
    everywhere = start_cuda_process(node, [0], mib=300)  # CUDA_VISIBLE_DEVICES unset: all four

    assert device_fds(node, pid) == sorted([(CTL, 0), (UVM, 0), (dev(1), 0), (dev(7), pid)])
    assert device_fds(node, everywhere) == sorted(
        [(CTL, 0), (UVM, 0), (dev(3), everywhere), (dev(1), 0), (dev(7), 0), (dev(0), 0)]
    )
    lists = driver_lists(node)
    assert [gpu["compute"] for gpu in lists] == [{everywhere: 300}, {}, {pid: 500}, {}]
    assert [gpu["used"] for gpu in lists] == [300, 0, 500, 0]


def test_start_holder_keeps_its_signature_and_sees_only_its_gpus(simnode):
    node = simnode(gpus=2)
    pid = start_holder(node, [1], mib=100, title="trainer")
    child = start_holder(node, [0], mib=200, mode="inherit")

    assert device_fds(node, pid) == sorted([(CTL, 0), (UVM, 0), (dev(1), pid)])
    assert "trainer" in node.exec("cat", "/proc/%d/cmdline" % pid).stdout
    lists = driver_lists(node)
    # The forked child holds its dead parent's handle: memory kept, listed under the parent's PID (its token).
    ((parent, mib),) = lists[0]["compute"].items()
    assert lists[0]["used"] == 200 and mib == 200 and lists[1]["compute"] == {pid: 100}
    assert parent != child
    assert node.exec("sh", "-c", "test -d /proc/%d && echo alive || echo gone" % parent).stdout.strip() == "gone"
    assert device_fds(node, child) == sorted([(CTL, 0), (UVM, 0), (dev(0), parent)])


def test_nccl_like_process_holds_every_device_file_and_is_listed_on_its_gpu_only(simnode):
    node = simnode(gpus=4)
    pid = start_cuda_process(node, [2], mib=700, visible=[2, 3], nvml=True)

    paths = [path for path, _pos in device_fds(node, pid)]
    assert set(paths) == {CTL, UVM, dev(0), dev(1), dev(2), dev(3)}
    assert (dev(2), pid) in device_fds(node, pid)
    assert [gpu["compute"] for gpu in driver_lists(node)] == [{}, {}, {pid: 700}, {}]


def test_nvml_monitor_holds_control_and_every_gpu_without_uvm_or_context(simnode):
    node = simnode(gpus=3)
    pid = start_nvml_monitor(node, title="nvidia_gpu_exporter")

    assert device_fds(node, pid) == sorted([(CTL, 0), (dev(0), 0), (dev(1), 0), (dev(2), 0)])
    assert "nvidia_gpu_exporter" in node.exec("cat", "/proc/%d/cmdline" % pid).stdout
    assert [gpu["used"] for gpu in driver_lists(node)] == [0, 0, 0]


def test_vllm_ranks_open_visible_gpus_and_tp_workers_keep_nvml_initialized(simnode):
    node = simnode(gpus=4, release_latency=0.1)
    tp2 = start_vllm(
        node,
        "/models/m",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "-tp",
        "2",
        "--gpu-memory-utilization",
        "0.4",
        env={"CUDA_VISIBLE_DEVICES": "2,3"},
    )
    tp1 = start_vllm(
        node,
        "/models/m",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--gpu-memory-utilization",
        "0.4",
        env={"CUDA_VISIBLE_DEVICES": "1"},
    )
    (engine,), workers = vllm_instance(node, tp2)
    (engine1,), no_workers = vllm_instance(node, tp1)

    assert device_fds(node, engine) == [] and device_fds(node, tp2) == [] and no_workers == []
    lists = driver_lists(node)
    for rank, pid in enumerate(workers):
        fds = device_fds(node, pid)
        assert {path for path, _pos in fds} == {CTL, UVM, dev(0), dev(1), dev(2), dev(3)}, fds
        assert (dev(2 + rank), pid) in fds
        assert lists[2 + rank]["compute"] == {pid: int(0.4 * 81559)}
    # TP=1: EngineCore is the CUDA process; no NCCL, so no NVML handles on GPUs it cannot see.
    assert device_fds(node, engine1) == sorted([(CTL, 0), (UVM, 0), (dev(1), engine1)])
    assert lists[1]["compute"] == {engine1: int(0.4 * 81559)} and lists[0]["compute"] == {}


def test_mps_clients_are_listed_with_their_memory_and_released_after_exit(simnode):
    node = simnode(gpus=2, release_latency=0.3)
    control, server = start_mps(node, [0])
    client = start_mps_client(node, [0], mib=3000)
    other = start_mps_client(node, [0], mib=1000)

    assert device_fds(node, control) == []
    assert device_fds(node, server) == sorted([(CTL, 0), (UVM, 0), (dev(0), server)])
    assert device_fds(node, client) == sorted([(CTL, client), (UVM, 0)])
    assert driver_lists(node)[0] == {"used": 4032, "compute": {server: 32}, "mps": {client: 3000, other: 1000}}

    node.exec("kill", "-9", str(client))
    wait_for(lambda: client not in driver_lists(node)[0]["mps"], 5, 0.02, "client unlisted")
    started = time.monotonic()
    # Unlisted at once, memory counted for release_latency more, then freed.
    assert driver_lists(node)[0]["used"] == 4032
    wait_for(lambda: driver_lists(node)[0]["used"] == 1032, 5, 0.02, "client memory freed")
    assert time.monotonic() - started > 0.15
    assert driver_lists(node)[0]["mps"] == {other: 1000}


def test_proc_driver_nvidia_describes_each_gpu_inside_the_node_only(simnode):
    node = simnode(gpus=2, minors=[4, 6], no_driver=True)
    listing = node.exec("sh", "-c", "cd /proc/driver/nvidia/gpus && ls").stdout.split()
    assert listing == ["0000:18:00.0", "0000:2a:00.0"]
    text = node.exec("cat", "/proc/driver/nvidia/gpus/0000:2a:00.0/information").stdout
    fields = {key.strip(): value.strip() for key, _sep, value in (line.partition(":") for line in text.splitlines())}
    gpu = node.info["gpus"][1]
    assert fields["Model"] == gpu["name"] and fields["GPU UUID"] == gpu["uuid"]
    assert fields["Device Minor"] == "6" and fields["Bus Location"] == "0000:2a:00.0"
    assert "\t" in text.splitlines()[0]
    assert "NVRM version:" in node.exec("cat", "/proc/driver/nvidia/version").stdout
    assert not os.path.exists("/proc/driver/nvidia")  # the host's /proc is untouched


CONTAINER_LISTS = r"""
import json, pynvml as n
n.nvmlInit()
print(json.dumps([sorted(p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(n.nvmlDeviceGetHandleByIndex(i)))
                  for i in range(n.nvmlDeviceGetCount())]))
"""


def container_lists(container):
    """The compute lists' PIDs per GPU as NVML answers a caller inside `container`."""
    return json.loads(
        subprocess.run(
            [str(container.python), "-c", CONTAINER_LISTS], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    )


def test_container_process_gets_the_asked_pid_and_the_driver_lists_in_the_callers_namespace(simnode, tmp_path):
    """535.113.01+: lists in the caller's PID namespace (gpu_rmapi.c _gpuConvertPid -> os_find_ns_pid -> pid_vnr);
    a creator with no number there is left out. Older drivers (pid_namespace=init): node-root numbers to all."""
    node = simnode(gpus=2)
    host_side = start_holder(node, [0], mib=600)
    container = Container(node, tmp_path)
    job = start_cuda_process(node, [1], mib=400, visible=[1], container=container, pid=host_side)

    assert job == host_side
    inside = container.processes()
    assert job in inside and "/run/gpusim/nodetools/cuda" in inside[job][3]
    lists = driver_lists(node)
    assert list(lists[0]["compute"]) == [host_side]
    (listed,) = lists[1]["compute"]
    assert listed != job and listed not in inside  # the node sees the container process by its node number
    assert container_lists(container) == [[], [job]]  # the container sees its own number, not the node's process
    node.set(pid_namespace="init")
    assert container_lists(container) == [[host_side], [listed]]
    node.set(driver_version="535.104.05", pid_namespace=None)  # auto: a driver before 535.113.01
    assert container_lists(container) == [[host_side], [listed]]
    node.set(driver_version="535.113.01")
    assert container_lists(container) == [[], [job]]
    # The wrapper runs Python inside the container: it sees the container's PIDs.
    out = subprocess.run(
        [
            str(container.python),
            "-c",
            "import json, os; print(json.dumps(sorted(int(p) for p in os.listdir('/proc') if p.isdigit())))",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert job in json.loads(out)
