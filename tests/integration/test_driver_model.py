"""The driver as its source says (tests/sim/README.md, "The driver model"; docs/attribution.md), end to end on
simulated nodes: dead creators stay listed while their handles live, PID numbers are reused, GPUs without memory
figures, device files bound outside /dev, the 32-byte _v3 layout of early R535, a slow first nvmlInit.

Each test asserts what an operator sees: which processes are alive afterwards, the memory per GPU, the module
results and the play output.
"""

from __future__ import annotations

import json
import re
import time

import ansible_api
from ansible_run import REPO, VENV_BIN, module, only, playbook
from nodetools import (
    NVML_MONITOR,
    SIM_DIR,
    _await_ready,
    _launch,
    _ready_file,
    alive,
    daemon_executable,
    device_maps,
    driver_lists,
    node_python,
    start_cuda_process,
    start_holder,
    start_nvml_monitor,
    wait_for,
)
from simnode import inventory_file

RESET = REPO / "playbooks" / "reset_gpus.yml"
CHECK = REPO / "playbooks" / "check_gpus.yml"

# A CUDA process that forks workers which inherit its handles (a trainer and its DataLoader workers), as the
# contract says (tests/sim/README.md, "Creating a CUDA context"). argv[1]: {"device" (the path it opens: the GPU's
# /dev/nvidiaN or a bind mount of it), "index", "mib", "kind" (compute | graphics), "workers", "title", "ready",
# "sim_dir"}. Reports "<its PID> <worker PIDs...>".
TRAINER = r"""
import json, mmap, os, sys, time
spec = json.loads(sys.argv[1])
if spec.get("title"):
    import setproctitle
    setproctitle.setproctitle(spec["title"])
sys.path.insert(0, spec["sim_dir"])
import simcuda
token = os.getpid()
files = [os.open("/dev/nvidiactl", os.O_RDWR), os.open("/dev/nvidia-uvm", os.O_RDWR)]
fd = os.open(spec["device"], os.O_RDWR)
# What a context maps (tests/sim/README.md, "Device files per process kind"): cuInit's two write-only 64 KiB
# mappings of its GPU's file, the GPU's file rw-s at offset 0 (on a zero-framebuffer GB10 node not that one),
# nvidiactl rw-s, nvidia-uvm (not inherited by the workers).
for _doorbell in range(2):
    simcuda.map_file(fd, 64 * simcuda.KIB, mmap.PROT_WRITE)
simcuda.map_context(fd, files[0], files[1])
os.lseek(fd, token, os.SEEK_SET)  # the simulator's bookkeeping: nothing on a real driver shows it
tmp = "/run/gpusim/contexts/.%d.tmp" % token
with open(tmp, "w") as f:
    f.write("%d %d %s\n" % (spec["index"], spec["mib"], spec.get("kind", "compute")))
os.rename(tmp, "/run/gpusim/contexts/%d" % token)
workers = []
for _ in range(spec["workers"]):
    pid = os.fork()
    if pid == 0:
        while True:
            time.sleep(1)
    workers.append(pid)
with open(spec["ready"] + ".tmp", "w") as f:
    f.write(" ".join(str(p) for p in [token] + workers) + "\n")
os.rename(spec["ready"] + ".tmp", spec["ready"])
while True:
    time.sleep(1)
"""


# Start argv[2:] detached with PID argv[1] in the node's PID namespace (ns_last_pid); other processes of the node
# may take the number between the write and the fork: retried, a started process with another number is ended.
# "PID:group" keeps the launcher's session and process group: the kernel keeps a number in use while it names a
# live process group or session, so a trainer whose workers share its own group could never be reused (a trainer
# started by torchrun or a job runner is no group leader).
LAUNCH_AS = r"""
import os, signal, subprocess, sys, time
number, _sep, mode = sys.argv[1].partition(":")
want = int(number)
for _attempt in range(50):
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(want - 1))
    child = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=mode != "group")
    if child.pid == want:
        break
    child.kill()
    child.wait()
    time.sleep(0.05)
print(child.pid)
"""


def start_trainer(
    node,
    index=0,
    mib=6000,
    workers=2,
    device=None,
    kind="compute",
    title="python3 train.py",
    pid=0,
    executable=None,
    user=None,
):
    """Start TRAINER (with PID `pid` when given; under `executable`, nodetools.daemon_executable, instead of the node's
    Python, with no title then; as `user` under /usr/bin/python3, with no title either); return (its PID, [worker
    PIDs]) in the node."""
    path, host_path = _ready_file(node, "trainer")
    spec = {
        "device": device or "/dev/nvidia%d" % node.info["gpus"][index]["minor"],
        "index": index,
        "mib": mib,
        "kind": kind,
        "workers": workers,
        "title": title,
        "ready": path,
        "sim_dir": SIM_DIR,
    }
    if pid:
        node.exec(node_python(), "-c", LAUNCH_AS, "%d:group" % pid, node_python(), "-c", TRAINER, json.dumps(spec))
    else:
        python = "/usr/bin/python3" if user is not None else executable or node_python()
        _launch(node, [python, "-c", TRAINER, json.dumps(spec)], user=user)
    pids = _await_ready(host_path, "trainer %s" % spec)
    return pids[0], list(pids[1:])


def facts(inventory, **args):
    status, result = only(module(inventory, "gpuops.nvidia.gpu_facts", args))
    assert status == "SUCCESS", result
    return result["ansible_facts"]["nvidia"]


def kill_and_wait(node, pid):
    """SIGKILL `pid` and wait until the node's init has reaped it (its number is free)."""
    node.exec("kill", "-9", str(pid))
    wait_for(
        lambda: node.exec("sh", "-c", "test -e /proc/%d || echo gone" % pid).stdout.strip() == "gone",
        10,
        what="PID %d reaped" % pid,
    )


def extra(**variables):
    return ["-e", json.dumps(variables)]


def test_trainer_sigkilled_stays_listed_and_the_reset_ends_its_dataloader_workers(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.2)
    trainer, workers = start_trainer(node, 0, 6000, workers=2)
    exporter = start_nvml_monitor(node)
    assert driver_lists(node)[0]["compute"] == {trainer: 6000}  # the driver sees the creator alive once
    kill_and_wait(node, trainer)

    # The workers hold the trainer's context: the driver lists the dead PID with its memory.
    lists = driver_lists(node)
    assert lists[0] == {"used": 6000, "compute": {trainer: 6000}, "mps": {}}
    inventory = inventory_file(tmp_path, node)
    view = facts(inventory)
    gpu = view["gpus"][0]
    assert gpu["exited"] == [{"pid": trainer, "used_mib": 6000, "type": "compute", "reason": "exited", "comm": None}]
    assert gpu["foreign"] == [] and gpu["memory_unexplained"] is False and sorted(gpu["holder_pids"]) == sorted(workers)
    assert all(h["contexts_of"] == {"0": [trainer]} for h in view["holders"])
    run = ansible_api.run(
        inventory,
        REPO,
        module="gpuops.nvidia.gpu_facts",
        envvars=ansible_api.environment(VENV_BIN, REPO / "ansible.cfg"),
        timeout=120,
    )
    # The warning an operator reads: who holds the dead trainer's context.
    assert "GPU 0: PID %s hold the context of PID %d (6000 MiB), which has exited" % (
        ", ".join(str(p) for p in sorted(workers)),
        trainer,
    ) in " ".join(run.output.split()), run.output
    assert [u["pid"] for u in view["device_users"]] == [exporter]

    rc, out, recap = playbook(inventory, RESET, *extra(reset_gpus_timeout=15))
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert "run on the host" not in out and "--gpu-reset" not in out, out
    assert not any(alive(node, pid) for pid in workers) and alive(node, exporter)
    assert driver_lists(node)[0] == {"used": 0, "compute": {}, "mps": {}}


def test_dead_trainers_number_reused_by_an_nvml_exporter_which_survives(simnode, tmp_path):
    node = simnode(gpus=1, release_latency=0.2)
    trainer, workers = start_trainer(node, 0, 5000, workers=1, pid=4321)
    assert trainer == 4321 and driver_lists(node)[0]["compute"] == {trainer: 5000}
    kill_and_wait(node, trainer)
    # An NVML exporter started later gets the dead trainer's number (ns_last_pid), while the driver still lists it.
    path, host_path = _ready_file(node, "exporter")
    node.exec(
        node_python(), "-c", LAUNCH_AS, str(trainer), node_python(), "-c", NVML_MONITOR, "nvidia_gpu_exporter", path
    )
    exporter = _await_ready(host_path, "exporter at PID %d" % trainer)[0]
    assert exporter == trainer and driver_lists(node)[0]["compute"] == {trainer: 5000}

    inventory = inventory_file(tmp_path, node)
    view = facts(inventory)
    gpu = view["gpus"][0]
    assert gpu["exited"][0]["reason"] == "reused" and gpu["exited"][0]["comm"].startswith("nvidia_gpu_expo")
    assert gpu["driver_processes"][0]["verified"] is False and gpu["holder_pids"] == workers
    assert [u["pid"] for u in view["device_users"]] == [exporter]

    rc, out, recap = playbook(inventory, RESET, *extra(reset_gpus_timeout=15))
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert alive(node, exporter) and not alive(node, workers[0])
    assert driver_lists(node)[0] == {"used": 0, "compute": {}, "mps": {}}


# A process that only initialized CUDA (cuInit, torch.cuda.is_available()): argv[1] the sim dir, argv[2] the GPU's
# minor, argv[3] the ready file. It opens and maps what one does on driver 580.159.04 (simcuda.CUDA_INIT).
CUDA_INIT = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
import simcuda
fds = simcuda.cuda_process("/dev", [int(sys.argv[2])], (), simcuda.CUDA_INIT)
with open(sys.argv[3] + ".tmp", "w") as f:
    f.write("%d\n" % os.getpid())
os.rename(sys.argv[3] + ".tmp", sys.argv[3])
while True:
    time.sleep(1)
"""


def test_dead_trainers_number_reused_by_a_cuda_initialized_process_which_survives(simnode, tmp_path):
    """Issue 33 item 3: the number goes to a process that initialized CUDA (nvidia-uvm, the GPU's file, write-only
    mappings) but has no context. The rule of uvm-or-mapping called it the listed holder and ended it; the workers
    that hold the context are the holders."""
    node = simnode(gpus=1, release_latency=0.2)
    trainer, workers = start_trainer(node, 0, 5000, workers=1, pid=4322)
    kill_and_wait(node, trainer)
    path, host_path = _ready_file(node, "cuinit")
    minor = str(node.info["gpus"][0]["minor"])
    node.exec(node_python(), "-c", LAUNCH_AS, str(trainer), node_python(), "-c", CUDA_INIT, SIM_DIR, minor, path)
    reuser = _await_ready(host_path, "CUDA-initialized process at PID %d" % trainer)[0]
    assert reuser == trainer and driver_lists(node)[0]["compute"] == {trainer: 5000}

    inventory = inventory_file(tmp_path, node)
    gpu = facts(inventory)["gpus"][0]
    assert gpu["exited"][0]["reason"] == "reused" and gpu["holder_pids"] == workers

    rc, out, recap = playbook(inventory, RESET, *extra(reset_gpus_timeout=15))
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert alive(node, reuser) and not any(alive(node, pid) for pid in workers), out
    assert driver_lists(node)[0] == {"used": 0, "compute": {}, "mps": {}}


def test_gb10_without_memory_figures_resets_the_orphan_only_and_spares_the_desktop(simnode, tmp_path):
    """NVIDIA GB10: memory info v1 and v2 answer NOT_SUPPORTED, the lists answer. The compositor's graphics context
    is protected, the CUDA tool without a context is a device user, the orphaned EngineCore is ended."""
    node = simnode(gpus=1, model_name="NVIDIA GB10", release_latency=0.2)
    node.set(memory_info="unsupported")
    # The compositor runs gnome-shell's executable: protected by what it is, not by a title (issue 33 item 2).
    shell = daemon_executable(node, "gnome-shell")
    compositor, _none = start_trainer(node, 0, 43, workers=0, kind="graphics", title=None, executable=shell)
    engine = start_holder(node, [0], mib=60000, title="VLLM::EngineCore")
    tool = start_cuda_process(node, [], mib=0, visible=[0])
    inventory = inventory_file(tmp_path, node)
    # Zero framebuffer: the contexts map nvidiactl rw-s and their GPU's file only write-only (docs/attribution.md).
    minor = node.info["gpus"][0]["minor"]
    engine_maps = {(entry[0], entry[1]) for entry in device_maps(node, engine)}
    assert ("/dev/nvidiactl", "rw-s") in engine_maps and ("/dev/nvidia%d" % minor, "rw-s") not in engine_maps

    view = facts(inventory)
    gpu = view["gpus"][0]
    assert gpu["memory_supported"] is False and gpu["error"] is None
    assert (gpu["memory_source"], gpu["memory_used_mib"]) == ("process_lists", 60043)  # what the lists charge
    assert gpu["memory_unexplained"] is False and sorted(gpu["holder_pids"]) == sorted([compositor, engine])
    assert [u["pid"] for u in view["device_users"]] == [tool]

    rc, out, recap = playbook(inventory, RESET, *extra(reset_gpus_timeout=15))
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert not alive(node, engine) and alive(node, compositor) and alive(node, tool), out
    assert "lost" not in out.lower(), out
    rc, out, recap = playbook(inventory, RESET, *extra(reset_gpus_timeout=15))
    assert rc == 0 and recap[node.name]["changed"] == 0, out
    # Its memory cannot be read: the check fails as "not checked" unless a check of the holders alone is accepted.
    rc, out, _recap = playbook(inventory, CHECK)
    assert rc != 0 and "not checked: used memory of GPU 0 not reported by the driver" in out, out
    rc, out, _recap = playbook(inventory, CHECK, *extra(check_gpus_allow_proc_only=True))
    assert rc == 0, out
    assert alive(node, compositor)


def test_device_file_bound_outside_dev_is_found(simnode, tmp_path):
    """The GPU Operator's driver container gives the host /run/nvidia/driver/dev/nvidia0: the same device."""
    node = simnode(gpus=2, release_latency=0.2)
    node.exec(
        "sh",
        "-c",
        "mkdir -p /run/nvidia/driver/dev && touch /run/nvidia/driver/dev/nvidia1 && "
        "mount --bind /dev/nvidia1 /run/nvidia/driver/dev/nvidia1",
    )
    trainer, _none = start_trainer(node, 1, 3000, workers=0, device="/run/nvidia/driver/dev/nvidia1")
    assert driver_lists(node)[1]["compute"] == {trainer: 3000}  # the fake driver knows the file, not the path
    inventory = inventory_file(tmp_path, node)

    view = facts(inventory)
    (holder,) = view["holders"]
    assert holder["pid"] == trainer and holder["attribution"] == {"1": "driver"} and holder["minors"] == [1]
    assert view["gpus"][1]["holder_pids"] == [trainer] and view["gpus"][1]["memory_unexplained"] is False

    rc, out, _recap = playbook(inventory, RESET, *extra(reset_gpus_timeout=15))
    assert rc == 0, out
    assert not alive(node, trainer)
    assert driver_lists(node)[1]["used"] == 0


def test_early_r535_32_byte_v3_entries_give_the_right_pids(simnode, tmp_path):
    node = simnode(gpus=1, v3_32=True, release_latency=0.2)
    node.set(driver_version="535.54.03")
    holders = {start_holder(node, [0], mib=1000 + 100 * k): 1000 + 100 * k for k in range(3)}
    view = facts(inventory_file(tmp_path, node))
    gpu = view["gpus"][0]
    assert gpu["process_list_version"] == "v3-32"
    assert {p["pid"]: p["used_mib"] for p in gpu["driver_processes"]} == holders
    assert all(p["verified"] for p in gpu["driver_processes"]) and sorted(gpu["holder_pids"]) == sorted(holders)
    assert gpu["memory_unexplained"] is False


def test_slow_first_init_without_persistence_mode_is_not_a_hung_driver(simnode, tmp_path):
    node = simnode(gpus=1, release_latency=0.2)
    node.set(persistence_mode=0, init_seconds=3)
    holder = start_holder(node, [0], mib=2000)
    started = time.monotonic()
    view = facts(inventory_file(tmp_path, node), driver_timeout=1)
    assert time.monotonic() - started >= 3
    assert view["driver"]["available"] is True and view["driver"]["timed_out"] is False, view["driver"]
    assert view["gpus"][0]["holder_pids"] == [holder]


def test_reset_leaves_dead_trainers_contexts_with_the_workers_it_leaves_alone(simnode, tmp_path):
    """Issue 47: trainers on GPU 1 forked DataLoader workers and were SIGKILLed; the driver lists each dead trainer's
    PID with its memory while the workers hold the handles. A reset by `pids` ends the workers of two of them and
    leaves the contexts the other workers hold with those: it does not wait on that memory, calls nothing unexplained,
    advises no GPU reset, and says how much stays with whom; one trainer's workers are split between selected and left
    alone, and its context stays. A second run changes nothing. Then `exclude` and a user filter leave workers alone
    the same way, and the check leaves out what `exclude` names."""
    node = simnode(gpus=2, release_latency=0.3)
    one, (one_w,) = start_trainer(node, 1, 9000, workers=1)
    two, two_ws = start_trainer(node, 1, 10085, workers=2)
    kept, (kept_w,) = start_trainer(node, 1, 5813, workers=1, title="pt_keep_worker")
    four, four_ws = start_trainer(node, 1, 5813, workers=2)
    split, (split_ended, split_kept) = start_trainer(node, 1, 3000, workers=2)
    for trainer in (one, two, kept, four, split):
        kill_and_wait(node, trainer)
    assert driver_lists(node)[1]["used"] == 33711
    inventory = inventory_file(tmp_path, node)
    selected = [one_w] + two_ws + [split_ended]
    left = [kept_w] + four_ws + [split_kept]
    pids = extra(reset_gpus_pids=selected, reset_gpus_timeout=10)

    rc, out, recap = playbook(inventory, RESET, *pids)
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    # Released once the two freed contexts are (release_latency 0.3 s): no wait on what the workers left alone keep.
    waited = re.search(r"memory released after ([0-9.]+) s more", out)
    assert waited and float(waited.group(1)) < 5 and "still held" not in out, out
    assert not any(alive(node, pid) for pid in selected) and all(alive(node, pid) for pid in left), out
    assert driver_lists(node)[1]["used"] == 14626
    for wrong in ("another PID namespace", "--gpu-reset", "no process explains"):
        assert wrong not in out, out
    text = " ".join(out.split())
    assert (
        "besides 14626 MiB that left-alone processes hold (GPU 1: 14626 MiB with PID %s, which hold the contexts "
        "of PID %d, %d, %d, exited)" % (", ".join(str(p) for p in sorted(left)), kept, four, split) in text
    ), out
    creators = ", ".join(str(p) for p in sorted([one, two, kept, four, split]))
    assert (
        "GPU 1: PID %d shared the context of an exited creator (one of PID %s) with PID %d, left alone: that context "
        "and its memory stay until PID %d exits" % (split_ended, creators, split_kept, split_kept) in text
    ), out

    rc, out, recap = playbook(inventory, RESET, *pids)
    assert rc == 0 and recap[node.name]["changed"] == 0 and "--gpu-reset" not in out, out

    stranger, (stranger_w,) = start_trainer(node, 1, 2000, workers=1, title=None, user="nobody")
    kill_and_wait(node, stranger)
    rc, out, recap = playbook(
        inventory,
        RESET,
        *extra(reset_gpus_exclude=["pt_keep_worker"], reset_gpus_users=["root"], reset_gpus_timeout=10),
    )
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert alive(node, kept_w) and alive(node, stranger_w) and not any(alive(node, p) for p in four_ws + [split_kept])
    assert driver_lists(node)[1]["used"] == 7813 and "--gpu-reset" not in out, out
    assert "GPU 1: 7813 MiB with PID %d, %d" % tuple(sorted([kept_w, stranger_w])) in " ".join(out.split()), out

    rc, out, _recap = playbook(inventory, CHECK, *extra(check_gpus_exclude=["pt_keep_worker", "python3"]))
    assert rc == 0 and "but for what was left out: GPU 1: 7813 MiB held by PID %d" % kept_w in out, out
