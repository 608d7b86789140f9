"""Which device files simulated processes open and map, and what the fake driver lists for them
(tests/sim/README.md, "Device files per process kind", "MPS clients", "CUDA IPC", "The H200 preset",
"/proc/driver/nvidia").

The expected fds and mappings are read from the records of a real NVIDIA H200 with driver 580.159.04
(tests/fixtures/hardware/h200-580.159.04/): each simulated process kind must open and map what the real one did,
the record's /dev/nvidia0 standing for the simulated GPU's file. Each test runs a simulated node; the helpers are
tests/integration/nodetools.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

from integration.nodetools import (
    Container,
    device_fds,
    device_maps,
    driver_lists,
    processes,
    start_cuda_init,
    start_cuda_process,
    start_holder,
    start_ipc_pair,
    start_mps,
    start_mps_client,
    start_nvidia_smi,
    start_nvml_monitor,
    start_vllm,
    vllm_instance,
    wait_for,
)

CTL, UVM = "/dev/nvidiactl", "/dev/nvidia-uvm"
CAP1, CAP2 = "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"
RECORDS = Path(__file__).resolve().parents[2] / "fixtures" / "hardware" / "h200-580.159.04"


def dev(minor):
    return "/dev/nvidia%d" % minor


def step(file, name):
    """The value of the step `name` of a record."""
    for entry in json.loads((RECORDS / file).read_text())["steps"]:
        if entry["name"] == name:
            return entry["value"]
    raise KeyError(name)


def recorded_fds(fds, gpu):
    """Counter {path: fds} of a recorded process, its /dev/nvidia0 renamed `gpu`."""
    return Counter({(gpu if path == "/dev/nvidia0" else path): count for path, count in fds.items()})


def recorded_maps(lines, gpu):
    """Counter {(path, permissions, KiB): mappings} of the /dev lines of a recorded maps list."""
    found = Counter()
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[5].startswith("/dev/nvidia"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            found[(gpu if fields[5] == "/dev/nvidia0" else fields[5], fields[1], (end - start) // 1024)] += 1
    return found


def fds_of(node, pid, gpus=None):
    """Counter {path: fds} of a simulated process (only `gpus`' files among the GPU files, when given)."""
    counts = Counter(path for path, _position in device_fds(node, pid))
    others = {path for path in counts if path[11:].isdigit() and gpus is not None and path not in gpus}
    return Counter({path: n for path, n in counts.items() if path not in others})


def maps_of(node, pid):
    return Counter((path, perms, kib) for path, perms, kib, _offset, _start in device_maps(node, pid))


def gpucheck_mappings(reading, name):
    result = json.loads((RECORDS / "gpucheck-result.json").read_text())
    return result["scenarios"]["attribution"]["readings"][reading][name]["record"]["device_mappings"]


PROBE2 = "probe2-bystanders.json"


def test_nvml_client_holds_uvm_twice_and_the_caps_and_maps_nothing(simnode):
    """Measured: pynvml nvmlInit opens nvidiactl, nvidia0, nvidia-uvm x2, nvidia-cap1, -cap2; no mapping. A non-root
    client opens cap2 alone (probe5-frameworks.json, nobody_nvml)."""
    node = simnode(gpus=3)
    pid = start_nvml_monitor(node, title="nvidia_gpu_exporter")

    record = step(PROBE2, "before_kill.procs")["nvml"]
    expected = recorded_fds(record["fds"], dev(0)) + Counter({dev(1): 1, dev(2): 1})  # every GPU: NVML opens all
    assert fds_of(node, pid) == expected
    assert all(position == 0 for _path, position in device_fds(node, pid))
    assert maps_of(node, pid) == recorded_maps(record["maps"], dev(0)) == Counter()
    assert "nvidia_gpu_exporter" in node.exec("cat", "/proc/%d/cmdline" % pid).stdout
    assert [gpu["used"] for gpu in driver_lists(node)] == [0, 0, 0]

    code = (
        "import ctypes, json, os\n"
        "assert ctypes.CDLL('libnvidia-ml.so.1').nvmlInit_v2() == 0\n"
        "paths = []\n"
        "for fd in os.listdir('/proc/self/fd'):\n"
        "    try:\n"
        "        paths.append(os.readlink('/proc/self/fd/' + fd))\n"
        "    except OSError:\n"
        "        pass  # the listing's own fd, closed by now\n"
        "print(json.dumps(paths))\n"
    )
    out = node.exec("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", code)
    nobody = step("probe5-frameworks.json", "rows")["nobody_nvml"]["fds"]
    opened = Counter(path for path in json.loads(out.stdout) if path.startswith("/dev/nvidia"))
    assert opened == recorded_fds(nobody, dev(0)) + Counter({dev(1): 1, dev(2): 1})


def test_nvidia_smi_loop_is_an_nvml_client_with_a_read_only_nvidiactl_mapping(simnode):
    node = simnode(gpus=1)
    pid = start_nvidia_smi(node)

    record = step(PROBE2, "before_kill.procs")["nvidia_smi_loop"]
    assert fds_of(node, pid) == recorded_fds(record["fds"], dev(0))
    assert maps_of(node, pid) == recorded_maps(record["maps"], dev(0)) == Counter({(CTL, "r--s", 4): 1})
    assert node.exec("cat", "/proc/%d/comm" % pid).stdout.strip() == "nvidia-smi"
    assert driver_lists(node)[0]["compute"] == {}


def test_cuda_initialized_process_maps_its_gpus_write_only_and_has_no_context(simnode):
    """cuInit only (torch.cuda.is_available()): probe2's fds, the GPU check's mappings (gpucheck-result.json)."""
    node = simnode(gpus=3, minors=[4, 1, 6])
    pid = start_cuda_init(node, visible=[2])
    both = start_cuda_init(node, visible=[0, 2])

    record = step(PROBE2, "before_kill.procs")["is_available"]
    assert fds_of(node, pid) == recorded_fds(record["fds"], dev(6))
    expected_maps = recorded_maps(gpucheck_mappings("explained", "cuda_init"), dev(6))
    assert maps_of(node, pid) == expected_maps and expected_maps[(dev(6), "-w-s", 64)] == 2
    # Every visible GPU is initialized alike (an assumption: the records have one GPU).
    assert fds_of(node, both) == recorded_fds(record["fds"], dev(6)) + Counter({dev(4): 4})
    assert maps_of(node, both) == expected_maps + Counter({(dev(4), "-w-s", 64): 2})
    assert all(offset == 0 and perms != "rw-s" for _p, perms, _k, offset, _s in device_maps(node, both))
    assert [gpu["compute"] for gpu in driver_lists(node)] == [{}, {}, {}]


def test_context_creator_opens_and_maps_what_a_real_context_does(simnode):
    node = simnode(gpus=2, minors=[3, 5])
    pid = start_cuda_process(node, [1], mib=1024, visible=[1])

    record = step(PROBE2, "before_kill.procs")["ctx"]
    assert fds_of(node, pid) == recorded_fds(record["fds"], dev(5))
    assert maps_of(node, pid) == recorded_maps(gpucheck_mappings("explained", "context"), dev(5))
    # Offsets 0 (nv-mmap.c nvidia_mmap_helper refuses any other), but nvidia-uvm's: its own address (uvm.c uvm_mmap).
    for path, perms, kib, offset, start in device_maps(node, pid):
        assert offset == (start if path == UVM else 0), (path, perms, kib, offset, start)
    # The token (the simulator's bookkeeping) is one fd position of the GPU's file, nothing the maps show.
    assert sorted(position for path, position in device_fds(node, pid) if position) == [pid]
    assert [gpu["compute"] for gpu in driver_lists(node)] == [{}, {pid: 1024}]


def test_forked_child_inherits_the_fds_and_every_mapping_but_nvidia_uvm(simnode):
    node = simnode(gpus=1)
    child = start_cuda_process(node, [0], mib=2048, visible=[0], mode="inherit")

    record = step(PROBE2, "after_kill.inherited_child")
    assert fds_of(node, child) == recorded_fds(record["fds"], dev(0))
    expected = recorded_maps(gpucheck_mappings("unexplained", "inherited_child"), dev(0))
    assert maps_of(node, child) == expected and (UVM, "rw-s", 2048) not in expected
    lists = driver_lists(node)[0]
    ((parent, mib),) = lists["compute"].items()  # the dead creator stays listed while the child holds its handles
    assert mib == 2048 and parent != child and lists["used"] == 2048
    assert node.exec("sh", "-c", "test -d /proc/%d && echo alive || echo gone" % parent).stdout.strip() == "gone"


def test_several_visible_gpus_and_nccl_open_every_file_but_map_rw_only_the_computing_gpu(simnode):
    node = simnode(gpus=4, minors=[3, 1, 7, 0])
    pid = start_cuda_process(node, [2], mib=500, visible=[1, 2])
    nccl = start_cuda_process(node, [3], mib=700, visible=[2, 3], nvml=True)
    holder = start_holder(node, [1], mib=100, title="trainer")

    counts = fds_of(node, pid)
    assert counts[dev(1)] == 4 and counts[dev(7)] == 23 and dev(3) not in counts and dev(0) not in counts
    read_write = {path for path, perms, _kib, _o, _s in device_maps(node, pid) if perms == "rw-s"}
    assert read_write == {dev(7), CTL, UVM}
    # NCCL keeps NVML initialized: every GPU's file (once more on the visible ones), nvidia-uvm and the caps again.
    counts = fds_of(node, nccl)
    assert (counts[dev(3)], counts[dev(1)], counts[dev(7)], counts[dev(0)]) == (1, 1, 5, 24)
    assert (counts[CTL], counts[UVM], counts[CAP1], counts[CAP2]) == (3, 6, 2, 2)
    read_write = {path for path, perms, _kib, _o, _s in device_maps(node, nccl) if perms == "rw-s"}
    assert read_write == {dev(0), CTL, UVM}
    assert "trainer" in node.exec("cat", "/proc/%d/cmdline" % holder).stdout
    assert fds_of(node, holder)[dev(1)] == 23 and {p for p in fds_of(node, holder) if p[11:].isdigit()} == {dev(1)}
    assert [gpu["compute"] for gpu in driver_lists(node)] == [{}, {holder: 100}, {pid: 500}, {nccl: 700}]


def test_vllm_ranks_open_visible_gpus_and_tp_workers_keep_nvml_initialized(simnode):
    node = simnode(gpus=4, release_latency=0.1)
    common = ("/models/m", "--host", "127.0.0.1", "--port", "0", "--gpu-memory-utilization", "0.4")
    tp2 = start_vllm(node, *common, "-tp", "2", env={"CUDA_VISIBLE_DEVICES": "2,3"})
    tp1 = start_vllm(node, *common, env={"CUDA_VISIBLE_DEVICES": "1"})
    (engine,), workers = vllm_instance(node, tp2)
    (engine1,), no_workers = vllm_instance(node, tp1)

    assert device_fds(node, engine) == [] and device_fds(node, tp2) == [] and no_workers == []
    lists = driver_lists(node)
    for rank, pid in enumerate(workers):
        counts = fds_of(node, pid)
        assert {path for path in counts if path.startswith("/dev/nvidia") and path[11:].isdigit()} == {
            dev(0),
            dev(1),
            dev(2),
            dev(3),
        }
        assert (dev(2 + rank), pid) in device_fds(node, pid)
        assert {p for p, perms, _k, _o, _s in device_maps(node, pid) if perms == "rw-s"} == {dev(2 + rank), CTL, UVM}
        assert lists[2 + rank]["compute"] == {pid: int(0.4 * 81559)}
    # TP=1: EngineCore is the CUDA process; no NCCL, so no NVML handles on GPUs it cannot see.
    assert {p for p in fds_of(node, engine1) if p[11:].isdigit()} == {dev(1)}
    assert maps_of(node, engine1) == maps_of(node, start_cuda_process(node, [1], mib=1, visible=[1]))
    assert lists[1]["compute"] == {engine1: int(0.4 * 81559)} and lists[0]["compute"] == {}


def test_mps_daemon_server_and_client_open_map_and_are_listed_as_measured(simnode):
    """probe4-ipc-mps.json: the control daemon is CUDA-initialized, the server has a context (compute list), the
    client a CUDA context's files and mappings, listed in the compute AND the MPS list with the same memory."""
    node = simnode(gpus=2, preset="h200")
    control, server = start_mps(node, [0], server_mib=66)
    client = start_mps_client(node, [0], mib=1024)
    other = start_mps_client(node, [0], mib=100)

    procs = step("probe4-ipc-mps.json", "mps.procs")
    for pid, recorded in ((control, procs["550"]), (server, procs["573"])):
        assert fds_of(node, pid) == recorded_fds(recorded["fds"], dev(0)), pid
        assert maps_of(node, pid) == recorded_maps(recorded["maps"], dev(0)), pid
    assert fds_of(node, client, gpus={dev(0)}) == recorded_fds(procs["556"]["fds"], dev(0))
    # The record keeps the first 40 "nvidia" lines of the client's maps; the 3 left out (119 lines against a torch
    # context's 124, 26 device lines against 31) are cuInit's, which every CUDA process has.
    cuinit = Counter({(dev(0), "-w-s", 64): 2, (CTL, "r--s", 4): 1})
    assert (
        maps_of(node, client) - Counter({(dev(1), "-w-s", 64): 2})
        == recorded_maps(procs["556"]["maps"], dev(0)) + cuinit
    )
    lists = driver_lists(node)[0]
    assert lists["compute"] == {server: 66, client: 1542, other: 618} and control not in lists["compute"]
    assert lists["mps"] == {client: 1542, other: 618}
    assert lists["used"] == 66 + 1542 + 618  # each client counted once

    node.exec("kill", "-9", str(client))
    wait_for(lambda: client not in driver_lists(node)[0]["mps"], 10, 0.02, "client unlisted")
    assert driver_lists(node)[0] == {"used": 66 + 618, "compute": {server: 66, other: 618}, "mps": {other: 618}}


# Inside the node: every entry of GPU 0's compute list, as [[pid, MiB]...] (duplicates kept), and its used memory.
_RAW_LIST = r"""
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
print(json.dumps([[[p.pid, p.usedGpuMemory >> 20] for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
                  n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used >> 20]))
"""


def test_a_reused_number_with_its_own_context_keeps_the_dead_creators_context(simnode):
    """A dead creator's context lives on in its forked child; a new process gets the creator's number and makes a
    context of its own on the same GPU. Both driver clients live; the list gives the number once with the memory of
    both (open-gpu-kernel-modules gpu_rmapi.c: gpuGetProcWithObject_IMPL skips a client whose number is already in
    the list, gpuFindClientInfoWithPidIterator_IMPL adds up the memory of every client with that number). Each
    context is freed when its own holders are gone."""
    node = simnode(gpus=1)
    # The creator runs under a launcher, as a trainer under torchrun: its number is free once it is reaped.
    child = start_cuda_process(node, [0], mib=2000, visible=[0], mode="inherit", launcher=True)
    ((creator, _mib),) = driver_lists(node)[0]["compute"].items()
    wait_for(lambda: creator not in processes(node), 10, 0.02, "the creator reaped")
    reuser = start_cuda_process(node, [0], mib=5000, visible=[0], pid=creator)
    assert reuser == creator != child
    contexts = sorted(path.name for path in (node.run_dir / "contexts").iterdir())
    assert contexts == [str(creator), "%d.1" % creator]
    assert json.loads(node.py(_RAW_LIST)) == [[[creator, 7000]], 7000]

    node.exec("kill", "-9", str(child))
    wait_for(lambda: json.loads(node.py(_RAW_LIST))[1] == 5000, 10, 0.05, "the dead creator's context freed")
    assert json.loads(node.py(_RAW_LIST)) == [[[creator, 5000]], 5000]
    node.exec("kill", "-9", str(reuser))
    wait_for(lambda: json.loads(node.py(_RAW_LIST)) == [[], 0], 10, 0.05, "the reuser's context freed")


def test_ipc_importer_is_charged_the_imported_memory_once_the_exporter_is_gone(simnode):
    """probe4-ipc-mps.json: exporter 1542 MiB and importer 518 MiB; after the exporter's SIGKILL the importer is
    listed with 1542 MiB and the memory stays."""
    node = simnode(gpus=1, preset="h200")
    exporter, importer = start_ipc_pair(node, 0, mib=1024)

    both = step("probe4-ipc-mps.json", "ipc.lists_both")["mputeRunningProcesses"]
    after = step("probe4-ipc-mps.json", "ipc.lists_after_exporter_kill")["mputeRunningProcesses"]
    assert (
        driver_lists(node)[0]["compute"]
        == {exporter: both[0][1], importer: both[1][1]}
        == {exporter: 1542, importer: 518}
    )
    node.exec("kill", "-9", str(exporter))
    wait_for(lambda: exporter not in driver_lists(node)[0]["compute"], 10, 0.02, "exporter unlisted")
    assert driver_lists(node)[0] == {"used": after[0][1], "compute": {importer: after[0][1]}, "mps": {}}
    assert fds_of(node, importer)[dev(0)] == 23


# Inside the node: SIGKILL argv[1], then poll GPU argv[2] every few ms until the PID is unlisted and its memory back;
# print each poll [seconds since the kill, used MiB, the PID's listed MiB or None, the process still running].
WATCH_RELEASE = r"""
import json, os, signal, sys, time
import pynvml as n
pid, index = int(sys.argv[1]), int(sys.argv[2])
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(index)
def look():
    listed = {p.pid: p.usedGpuMemory >> 20 for p in n.nvmlDeviceGetComputeRunningProcesses(h)}
    return n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used >> 20, listed.get(pid)
def running():
    try:
        return open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
before = look()
os.kill(pid, signal.SIGKILL)
start, seen = time.monotonic(), []
while time.monotonic() - start < 20:
    used, mib = look()
    seen.append([time.monotonic() - start, used, mib, running()])
    if mib is None and used < before[0]:
        break
    time.sleep(0.003)
print(json.dumps({"before": before, "seen": seen}))
"""


def watch_release(node, pid, index=0):
    """(seconds to exit, seconds to released, [the PID's listed MiB at every poll before the release]), each the
    first poll that saw it. The poll reads the list, then the memory: the poll that sees the memory back may still
    list the PID (the release fell between its two calls); the next one must not."""
    result = json.loads(node.py(WATCH_RELEASE, str(pid), str(index)))
    seen = result["seen"]
    exited = next(t for t, _used, _mib, running in seen if not running)
    released = next(k for k, (_t, used, _mib, _running) in enumerate(seen) if used < result["before"][0])
    unlisted = next(k for k, (_t, _used, mib, _running) in enumerate(seen) if mib is None)
    assert unlisted in (released, released + 1), seen
    return exited, seen[released][0], [mib for _t, _used, mib, _running in seen[:released]]


def test_a_sigkilled_holder_stays_listed_until_its_memory_is_released_h200_preset(simnode):
    """Measured: 1, 10, 50 GiB released 0.151, 0.153, 0.194 s after SIGKILL, unlisted at the same moment, the exit
    within 11 ms (gpucheck-result.json, release_latency); idle: 0 MiB used, 615 reserved; a context 518 MiB over."""
    node = simnode(gpus=1, preset="h200")
    info = node.py(
        "import json, pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); "
        "m = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2); "
        "print(json.dumps([n.nvmlDeviceGetName(h), m.total >> 20, m.reserved >> 20, m.used >> 20, "
        "n.nvmlSystemGetDriverVersion()]))"
    )
    assert json.loads(info) == ["NVIDIA H200", 143771, 615, 0, "580.159.04"]
    pid = start_cuda_process(node, [0], mib=10 * 1024)
    sizes = json.loads((RECORDS / "gpucheck-result.json").read_text())["scenarios"]["release_latency"]["sizes"]
    assert driver_lists(node)[0]["compute"] == {pid: sizes["10"]["listed_mib"]} == {pid: 10758}

    exited, released, before = watch_release(node, pid)
    assert before and all(mib == 10758 for mib in before)  # listed with its memory until the release
    assert exited <= released and 0.15 <= released < 0.15 + 2.0  # the upper bound: polls on 2 busy cores


def test_pinned_host_memory_slows_the_release(simnode):
    """probe3-reuse-pinned.json: with 8 GiB on the GPU, the memory was back 0.178 s after SIGKILL with 1 GiB of
    pinned host memory, 2.467 s with 32 GiB (gpucheck-result.json: 0.151 s without)."""
    node = simnode(gpus=1, preset="h200")
    one = start_cuda_process(node, [0], mib=8192, pinned_gib=1)
    big = start_cuda_process(node, [0], mib=8192, pinned_gib=32)

    for pid, name in ((one, "pinned.1gib"), (big, "pinned.32gib")):
        measured = step("probe3-reuse-pinned.json", name)["released"]
        _exited, released, before = watch_release(node, pid)
        assert before and all(mib == 8192 + 518 for mib in before)
        assert measured - 0.01 <= released < measured + 2.0, (name, released)


def test_every_node_has_the_mig_capability_files_of_a_580_host(simnode):
    node = simnode(gpus=1)
    out = node.exec("stat", "-c", "%n %a %s", CAP1, CAP2).stdout.split("\n")
    assert out[:2] == [CAP1 + " 400 0", CAP2 + " 444 0"]
    config = node.exec("cat", "/proc/driver/nvidia/capabilities/mig/config").stdout
    assert "DeviceFileMinor: 1\nDeviceFileMode: 256\n" in config


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
