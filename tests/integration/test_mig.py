"""MIG instances and the range of drivers (issue 13) end to end on simulated nodes.

A process on a MIG instance holds the parent GPU's /dev/nvidiaN and the two capability files of its GPU and
compute instance (/dev/nvidia-caps/nvidia-capN; docs/mig.md, tests/sim/README.md "MIG"); the driver lists it on the
parent with the instance's ids. Each test asserts what an operator sees: which processes are alive afterwards,
the memory per instance, the module results and the play's outcome.
"""

from __future__ import annotations

import json

from ansible_run import REPO, module, only, playbook
from nodetools import PROCESS_TAIL, SIM_DIR, _await_ready, _launch, _ready_file, alive, node_python, start_holder
from simnode import inventory_file

RESET = REPO / "playbooks" / "reset_gpus.yml"
CHECK = REPO / "playbooks" / "check_gpus.yml"

# A CUDA process on one MIG instance (argv[1]: JSON spec): /dev/nvidiactl, /dev/nvidia-uvm, the parent's
# /dev/nvidia<minor> mapped as a context maps it (simcuda.map_context) and seeked to its token (its context), the
# GPU instance's and compute instance's capability
# files (the driver installs both in a CUDA process on a MIG device: nv-caps.c nv_cap_validate_and_dup_fd), and
# the context line "<index> <MiB> compute gi=<G> ci=<C>". mode "inherit": a forked child keeps every handle and the
# parent exits; the driver still lists the parent's PID with the memory (its context lives in the child).
MIG_PROCESS = (
    r"""
import json, os, signal, sys, time
spec = json.loads(sys.argv[1])
def node_pid():
    for line in open("/run/gpusim/proc/self/status"):
        if line.startswith("NSpid:"):
            return int(line.split()[1])
token = node_pid()
sys.path.insert(0, spec["sim_dir"])
import simcuda
fds = [os.open("/dev/nvidiactl", os.O_RDWR), os.open("/dev/nvidia-uvm", os.O_RDWR)]
device = os.open("/dev/nvidia%d" % spec["minor"], os.O_RDWR)
simcuda.map_context(device, fds[0], fds[1])  # what a context maps: the parent GPU's file rw-s, nvidiactl, nvidia-uvm
os.lseek(device, token, os.SEEK_SET)
fds += [device] + [os.open("/dev/nvidia-caps/nvidia-cap%d" % cap, os.O_RDONLY) for cap in spec["caps"]]
tmp = "/run/gpusim/contexts/.%d.tmp" % token
with open(tmp, "w") as f:
    f.write("%d %d compute gi=%d ci=%d\n" % (spec["index"], spec["mib"], spec["gi"], spec["ci"]))
os.rename(tmp, "/run/gpusim/contexts/%d" % token)
"""
    + PROCESS_TAIL
)


def start_on_instance(node, instance, mib, mode="hold", index=0):
    """Start a process with a context of `mib` MiB on MIG instance `instance` (an entry of node.json's "mig" list)
    of GPU `index`; return its PID in the node (mode inherit: the orphaned child's)."""
    path, host_path = _ready_file(node, "mig")
    minor = node.info["gpus"][index]["minor"]
    spec = {
        "index": index,
        "minor": minor,
        "gi": instance["gi"],
        "ci": instance["ci"],
        "caps": instance["caps"],
        "mib": mib,
        "mode": mode,
        "ready": path,
        "sim_dir": SIM_DIR,
    }
    _launch(node, [node_python(), "-c", MIG_PROCESS, json.dumps(spec)])
    return _await_ready(host_path, "MIG process %s" % spec)[0]


def facts(inventory):
    status, result = only(module(inventory, "gpuops.nvidia.gpu_facts"))
    assert status == "SUCCESS", result
    return result["ansible_facts"]["nvidia"]


def instances_by_gi(view, index=0):
    return {device["gpu_instance_id"]: device for device in view["gpus"][index]["mig_devices"]}


def test_facts_per_instance_with_listed_and_orphaned_holders(simnode, tmp_path):
    node = simnode(gpus=2, mig="0", release_latency=0.1)
    layout = {i["gi"]: i for i in node.info["mig"]["0"]}  # GIs 2 (3g.40gb), 4 (2g.20gb), 7 (1g.10gb)
    listed = start_on_instance(node, layout[7], 3000)
    orphan = start_on_instance(node, layout[4], 5000, mode="inherit")
    plain = start_holder(node, [1], mib=1024)

    view = facts(inventory_file(tmp_path, node))

    gpu = view["gpus"][0]
    assert gpu["mig_mode"] == {"current": True, "pending": True}
    assert (gpu["process_list_version"], gpu["memory_source"], gpu["memory_used_includes_reserved"]) == (
        "v3",
        "nvmlDeviceGetMemoryInfo_v2",
        False,
    )
    by_gi = instances_by_gi(view)
    assert {gi: (d["profile"], d["memory_used_mib"], d["listed_mib"], d["holder_pids"]) for gi, d in by_gi.items()} == {
        2: ("3g.40gb", 0, 0, []),
        4: ("2g.20gb", 5000, 5000, [orphan]),
        7: ("1g.10gb", 3000, 3000, [listed]),
    }
    # The orphan's parent exited: the driver still lists it on instance 4 (gpu_rmapi.c gpuGetProcWithObject_IMPL).
    assert [e["reason"] for e in by_gi[4]["exited"]] == ["exited"] and not by_gi[4]["memory_unexplained"]
    assert all(d["uuid"].startswith("MIG-") for d in by_gi.values())
    holders = {h["pid"]: h for h in view["holders"]}
    assert sorted(holders) == sorted([listed, orphan, plain])
    assert holders[listed]["mig"] == {"0": [by_gi[7]["uuid"]]} and holders[listed]["attribution"] == {"0": "driver"}
    assert holders[orphan]["mig"] == {"0": [by_gi[4]["uuid"]]} and holders[orphan]["attribution"] == {
        "0": "device_file"
    }
    assert holders[orphan]["contexts_of"] == {"0": [by_gi[4]["exited"][0]["pid"]]}
    assert (
        holders[plain]["mig"] == {}
        and view["gpus"][1]["mig_devices"] == []
        and view["gpus"][1]["mig_mode"] == {"current": False, "pending": False}
    )
    entry = next(p for p in gpu["driver_processes"] if p["pid"] == listed)
    assert (entry["gpu_instance_id"], entry["compute_instance_id"]) == (7, 0)


def test_reset_of_one_instance_ends_only_its_holder_check_mode_and_idempotence(simnode, tmp_path):
    node = simnode(gpus=1, mig="0", release_latency=0.1)
    layout = {i["gi"]: i for i in node.info["mig"]["0"]}
    # An orphaned holder on each instance: one the driver lists (its parent is gone), two that inherited the handles
    # of a creator that exited (the driver lists the dead creator's PID there).
    holders = {
        2: start_on_instance(node, layout[2], 7000),
        4: start_on_instance(node, layout[4], 5000, mode="inherit"),
        7: start_on_instance(node, layout[7], 3000, mode="inherit"),
    }
    inventory = inventory_file(tmp_path, node)
    uuids = {gi: d["uuid"] for gi, d in instances_by_gi(facts(inventory)).items()}

    status, plan = only(module(inventory, "gpuops.nvidia.gpu_kill", {"gpus": [uuids[4]]}, check=True))
    assert status == "CHANGED", plan
    assert [h["pid"] for h in plan["would_signal"]] == [holders[4]], plan
    assert plan["mig_instances"] == {"0": [uuids[4]]} and plan["gpus"] == [0]
    assert all(alive(node, pid) for pid in holders.values())

    textfile, reports = tmp_path / "gpuops_nvidia.prom", tmp_path / "reports"
    rc, out, recap = playbook(
        inventory,
        RESET,
        "-e",
        json.dumps(
            {
                "reset_gpus_gpus": [uuids[4]],
                "reset_gpus_timeout": 15,
                "reset_gpus_textfile": str(textfile),
                "reset_gpus_report_dir": str(reports),
            }
        ),
    )
    assert rc == 0, out
    assert recap[node.name]["changed"] > 0, out
    mig_lines = [line for line in textfile.read_text().splitlines() if line.startswith("gpuops_nvidia_mig_")]
    assert mig_lines == [
        'gpuops_nvidia_mig_%s{gpu="0",uuid="%s",mig_uuid="%s",profile="2g.20gb"} 0'
        % (name, node.info["gpus"][0]["uuid"], uuids[4])
        for name in ("memory_used_bytes", "holders", "unexplained_memory_bytes")
    ]
    (report,) = [json.loads(path.read_text()) for path in reports.iterdir()]
    assert {d["uuid"]: d["holder_pids"] for d in report["gpus_after"][0]["mig_devices"]} == {
        uuids[2]: [holders[2]],
        uuids[4]: [],
        uuids[7]: [holders[7]],
    }
    assert not alive(node, holders[4])
    assert alive(node, holders[2]) and alive(node, holders[7]), out
    after = instances_by_gi(facts(inventory))
    assert {gi: (d["memory_used_mib"], d["holder_pids"]) for gi, d in after.items()} == {
        2: (7000, [holders[2]]),
        4: (0, []),
        7: (3000, [holders[7]]),
    }

    rc, out, recap = playbook(
        inventory, RESET, "-e", json.dumps({"reset_gpus_gpus": [uuids[4]], "reset_gpus_timeout": 15})
    )
    assert rc == 0 and recap[node.name]["changed"] == 0, out

    status, result = only(module(inventory, "gpuops.nvidia.gpu_wait", {"gpus": [uuids[4]], "timeout": 0}))
    assert status == "SUCCESS", result
    assert [(g["index"], g["mig_uuid"], g["memory_used_mib"], g["released"]) for g in result["gpus"]] == [
        (0, uuids[4], 0, True)
    ]
    status, result = only(module(inventory, "gpuops.nvidia.gpu_wait", {"gpus": [uuids[7]], "timeout": 0}))
    assert status == "FAILED!" and [h["pid"] for h in result["gpus"][0]["holders"]] == [holders[7]], result
    rc, out, _recap = playbook(inventory, CHECK, "-e", json.dumps({"check_gpus_gpus": [uuids[4]]}))
    assert rc == 0, out
    rc, out, _recap = playbook(inventory, CHECK, "-e", json.dumps({"check_gpus_gpus": [0]}))
    assert rc != 0 and "not free" in out, out


def test_node_without_v3_lists_resets_and_checks(simnode, tmp_path):
    node = simnode(gpus=2, mig="0", no_v3=True, release_latency=0.1)
    layout = {i["gi"]: i for i in node.info["mig"]["0"]}
    on_instance = start_on_instance(node, layout[7], 2000)
    plain = start_holder(node, [1], mib=4096)
    inventory = inventory_file(tmp_path, node)

    view = facts(inventory)
    assert [g["process_list_version"] for g in view["gpus"]] == ["v2", "v2"]
    assert instances_by_gi(view)[7]["holder_pids"] == [on_instance]
    assert view["gpus"][1]["holder_pids"] == [plain]

    rc, out, _recap = playbook(inventory, RESET, "-e", json.dumps({"reset_gpus_timeout": 15}))
    assert rc == 0, out
    assert not alive(node, on_instance) and not alive(node, plain)
    rc, out, _recap = playbook(inventory, CHECK)
    assert rc == 0, out


def test_memory_info_v1_node_resets_and_checks_with_the_default_threshold(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.1)
    node.set(memory_info_v2=0)
    holder = start_holder(node, [0], mib=30000)
    inventory = inventory_file(tmp_path, node)

    view = facts(inventory)
    gpu = view["gpus"][0]
    assert (gpu["memory_source"], gpu["memory_used_includes_reserved"], gpu["memory_reserved_mib"]) == (
        "nvmlDeviceGetMemoryInfo",
        True,
        None,
    )
    assert gpu["memory_used_mib"] == 30000 + 529 and gpu["holder_pids"] == [holder]
    assert view["gpus"][1]["memory_used_mib"] == 529 and view["gpus"][1]["holder_pids"] == []

    rc, out, _recap = playbook(inventory, RESET, "-e", json.dumps({"reset_gpus_timeout": 15}))
    assert rc == 0, out
    assert not alive(node, holder)
    rc, out, _recap = playbook(inventory, CHECK)
    assert rc == 0, out
    assert [g["memory_used_mib"] for g in facts(inventory)["gpus"]] == [529, 529]  # v1: reserved memory only

    # Memory no process explains beyond the allowance for reserved memory still fails the check on v1.
    node.set(stray_mib={1: 8000})
    status, result = only(module(inventory, "gpuops.nvidia.gpu_wait", {"timeout": 0}))
    assert status == "FAILED!", result
    assert [(g["index"], g["released"]) for g in result["gpus"]] == [(0, True), (1, False)]
    assert "NVML memory info v1" in result["gpus"][1]["memory_note"]
