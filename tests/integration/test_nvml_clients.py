"""Real NVML clients as the bystanders of a reset: nvitop 1.7.2 and gpustat 1.1.1, through their own NVML code,
watch a simulated node while an orphaned tree is reset. They hold every device file and no memory (what an
exporter or a dashboard does on a real host): they must survive, and agree with gpu_facts on memory and processes.
"""

from __future__ import annotations

import json

from ansible_run import REPO, module, only, playbook
from nodetools import _await_ready, _launch, _ready_file, alive, driver_lists, node_python, start_holder, wait_for
from simnode import inventory_file

RESET = REPO / "playbooks" / "reset_gpus.yml"

# A long-running watch (argv[1]: nvitop | gpustat, argv[2]: ready file, argv[3]: view file): every 0.2 s it reads
# every GPU's used memory (MiB) and its processes with the client's own API, and writes the latest view as JSON.
WATCH = r"""
import json, os, sys, time
client, ready, out = sys.argv[1:4]
import setproctitle
setproctitle.setproctitle(client)

def look():
    if client == "nvitop":
        from nvitop import Device
        return [{"index": d.index, "used_mib": d.memory_used() >> 20, "pids": sorted(d.processes())}
                for d in Device.all()]
    import gpustat
    return [{"index": g.index, "used_mib": g.memory_used, "pids": sorted(p["pid"] for p in g.processes)}
            for g in gpustat.new_query().gpus]

n = 0
while True:
    view = {"n": n, "gpus": look()}
    with open(out + ".tmp", "w") as f:
        json.dump(view, f)
    os.rename(out + ".tmp", out)
    if n == 0:
        with open(ready + ".tmp", "w") as f:
            f.write("%d %d\n" % (os.getpid(), os.getpid()))
        os.rename(ready + ".tmp", ready)
    n += 1
    time.sleep(0.2)
"""


def start_watch(node, client):
    """Start WATCH for `client`; return (its PID, a function giving its latest view)."""
    ready, ready_here = _ready_file(node, client)
    view, view_here = _ready_file(node, client + "-view")
    _launch(node, [node_python(), "-c", WATCH, client, ready, view])
    pid = _await_ready(ready_here, "%s watch" % client, timeout=60)[0]
    return pid, lambda: json.loads(view_here.read_text())


def test_nvitop_and_gpustat_survive_a_full_reset_and_agree_with_gpu_facts(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.2)
    holders = [
        start_holder(node, [0], mib=4096, title="VLLM::Worker_TP0"),
        start_holder(node, [1], mib=2048, title="VLLM::Worker_TP1"),
    ]
    watches = {client: start_watch(node, client) for client in ("nvitop", "gpustat")}
    inventory = inventory_file(tmp_path, node)
    status, result = only(module(inventory, "gpuops.nvidia.gpu_facts"))
    assert status == "SUCCESS", result
    facts = result["ansible_facts"]["nvidia"]

    expected = [
        {"index": g["index"], "used_mib": g["memory_used_mib"], "pids": sorted(p["pid"] for p in g["driver_processes"])}
        for g in facts["gpus"]
    ]
    assert [g["pids"] for g in expected] == [[holders[0]], [holders[1]]]
    for client, (pid, view) in watches.items():
        # Each client's own reading agrees with gpu_facts (memory in MiB from NVML, PIDs from the driver's lists).
        latest = wait_for(
            lambda view=view: view() if view()["gpus"] == expected else None, 10, what="%s agrees" % client
        )
        assert latest["gpus"] == expected
        # nvitop keeps NVML initialized, so it holds every device file; gpustat initializes and shuts NVML down for
        # each query (gpustat's new_query), so it holds them only while it asks: where seen, it is an NVML client.
        device_user = next((u for u in facts["device_users"] if u["pid"] == pid), None)
        if client == "nvitop":
            assert device_user, (client, pid, [(u["pid"], u["comm"]) for u in facts["device_users"]])
        if device_user:
            assert device_user["kind"] == "nvml" and device_user["device_gpus"] == [0, 1]

    rc, out, recap = playbook(inventory, RESET, *json_extra(reset_gpus_timeout=20))
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert not any(alive(node, pid) for pid in holders)
    for client, (pid, view) in watches.items():
        assert alive(node, pid), "%s was ended by the reset:\n%s" % (client, out)
        seen = view()["n"]
        after = wait_for(
            lambda view=view, seen=seen: (
                view() if view()["n"] > seen and all(g["pids"] == [] for g in view()["gpus"]) else None
            ),
            10,
            what="%s still watching, seeing the GPUs free" % client,
        )
        assert [g["used_mib"] for g in after["gpus"]] == [0, 0]
    assert [gpu["used"] for gpu in driver_lists(node)] == [0, 0]


def json_extra(**variables):
    return ["-e", json.dumps(variables)]
