"""playbooks/guard_remediate.yml never signals what the alert did not name as it is now: a holder whose owner is alive,
an NVML bystander, and a PID reused after the alert are refused (and logged); gpu_kill's pid_start_ticks leaves a
reused PID alone by itself too. Remediation is on (guard_remediate: true) so that a wrong target would die."""

from __future__ import annotations

import json
import time

from ansible_run import module, only, playbook
from nodetools import alive, start_cuda_process, start_holder, start_nvml_monitor, wait_for
from simnode import inventory_file


def ticks(node, pid):
    stat = node.exec("cat", "/proc/%d/stat" % pid).stdout
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def alert(node, pid, start_ticks):
    labels = {
        "alertname": "GpuopsNvidiaOrphanedGpuMemory",
        "inventory_hostname": node.name,
        "pid": str(pid),
        "start_ticks": str(start_ticks),
    }
    return {"status": "firing", "labels": labels, "fingerprint": "f%d" % pid, "startsAt": "2026-12-04T10:00:00Z"}


def test_only_the_named_orphans_as_they_were(simnode, tmp_path):
    node = simnode(gpus=4)
    # Two orphans: forked children holding the contexts of creators that exited (reason exited_creator).
    reused = start_cuda_process(node, [0], 1000, mode="inherit")
    orphan = start_cuda_process(node, [1], 1000, mode="inherit")
    owned = start_holder(node, [2], 1000)  # its owner (this test's launcher) is alive: not orphaned
    bystander = start_nvml_monitor(node)
    inventory = inventory_file(tmp_path, node)
    _status, look = only(module(inventory, "gpuops.nvidia.gpu_guard", {"inventory_hostname": node.name}))
    assert sorted(o["pid"] for o in look["orphans"]) == sorted([reused, orphan]), look["orphans"]
    named = {o["pid"]: o["start_ticks"] for o in look["orphans"]}

    # After the alert: the first orphan dies and its PID goes to a new orphan (a forked child again, whose parent
    # takes the PID just below, free since the first orphan's creator exited).
    node.exec("kill", "-9", str(reused))
    wait_for(lambda: not alive(node, reused), 10, 0.05, "the first orphan to exit")
    again = start_cuda_process(node, [3], 1000, mode="inherit", pid=reused - 1)
    assert again == reused, "the new orphan got PID %d, not %d" % (again, reused)
    assert ticks(node, again) != named[reused]

    alerts = [alert(node, pid, start) for pid, start in named.items()]
    alerts += [alert(node, owned, ticks(node, owned)), alert(node, bystander, ticks(node, bystander))]
    log = tmp_path / "guard.jsonl"
    extra = {
        "guard_payload": {"alerts": alerts},
        "guard_remediate": True,
        "guard_state_dir": str(tmp_path / "state"),
        "guard_log": str(log),
    }
    rc, out, _recap = playbook(inventory, "playbooks/guard_remediate.yml", "-e", json.dumps(extra))
    assert rc == 0, out
    wait_for(lambda: not alive(node, orphan), 10, 0.05, "the named orphan to exit")
    assert alive(node, again) and alive(node, owned) and alive(node, bystander)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    whys = {line["pid"]: line["why"] for line in lines if "why" in line}
    assert whys[reused] == "PID %d was reused: the process now started at tick %d, the alert named tick %d" % (
        reused,
        ticks(node, again),
        named[reused],
    )
    assert whys[owned].startswith("not an orphaned holder now") and whys[bystander].startswith("not an orphaned")
    (done,) = [line for line in lines if line.get("action") == "signalled"]
    assert done["result"] == [orphan] and [a["labels"]["pid"] for a in done["alerts"]] == [str(orphan)]

    # A second alert within guard_interval is refused for the host, and logged.
    extra["guard_payload"] = {"alerts": [alert(node, again, ticks(node, again))]}
    rc, out, _recap = playbook(inventory, "playbooks/guard_remediate.yml", "-e", json.dumps(extra))
    assert rc == 0 and alive(node, again), out
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["host"] == node.name and "remediation of %s" % node.name in last["refused"], last

    # While the vllm_server role redeploys the host (its marker in /run), nothing is ended, even with a fresh slot.
    marker = '{"started": %f, "instances": ["a"]}' % time.time()
    node.exec("sh", "-c", "mkdir -p /run/gpuops-nvidia && printf '%s' > /run/gpuops-nvidia/redeploy.json" % marker)
    extra["guard_state_dir"] = str(tmp_path / "state-2")
    rc, out, _recap = playbook(inventory, "playbooks/guard_remediate.yml", "-e", json.dumps(extra))
    assert rc == 0 and alive(node, again), out
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["pid"] == again and last["why"].startswith("a redeploy of this host is running (started "), last

    # gpu_kill alone: a PID pinned to another start time is left alone.
    status, result = only(
        module(inventory, "gpuops.nvidia.gpu_kill", {"pids": [again], "pid_start_ticks": {str(again): named[reused]}})
    )
    assert status != "FAILED!" and alive(node, again), result
    assert "pid_start_ticks" in json.dumps(result.get("left_alone", [])), result
