"""playbooks/guard_remediate.yml never signals what the alert did not name as it is now: a holder whose owner is alive,
an NVML bystander, a live vLLM server in a container (its API server the init of its PID namespace, started by a
launcher that is not `vllm serve`), holders in units of a user manager and of a container's own systemd, and a PID
reused after the alert are refused (and logged); gpu_kill's pid_start_ticks leaves a
reused PID alone by itself too. Remediation is on (guard_remediate: true) so that a wrong target would die.
Every alert ends in exactly one line of the log: malformed ones each alone, those of a host that cannot be reached or
where gpu_guard fails as failures, while the rest of the call is decided."""

from __future__ import annotations

import json
import re
import time

from ansible_run import module, only, playbook
from nodetools import alive, free_ports, start_cuda_process, start_holder, start_nvml_monitor, wait_for
from nodetools import CUDA_PROCESS, _await_ready, _ready_file, cuda_spec, health, node_python, start_contained_server
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


def start_in_unit(node, gpu, cgroup):
    """A holder on GPU `gpu` in cgroup `cgroup` of the node; returns its PID."""
    path, host_path = _ready_file(node, "unit-holder")
    spec = dict(cuda_spec([gpu], 1000), ready=path)
    argv = ["setsid", "-f", node_python(), "-c", CUDA_PROCESS, json.dumps(spec)]
    node.exec("sh", "-c", 'exec "$@" </dev/null >/dev/null 2>&1', "sh", *argv, cgroup=cgroup)
    return _await_ready(host_path, "a holder in %s" % cgroup)[0]


def test_only_the_named_orphans_as_they_were(simnode, tmp_path):
    node = simnode(gpus=6)
    # Two orphans: forked children holding the contexts of creators that exited (reason exited_creator).
    reused = start_cuda_process(node, [0], 1000, mode="inherit")
    orphan = start_cuda_process(node, [1], 1000, mode="inherit")
    owned = start_holder(node, [2], 1000)  # its owner (this test's launcher) is alive: not orphaned
    bystander = start_nvml_monitor(node)
    # Live, never orphaned: a server in a container whose API server is its PID namespace's init (issue 40 item 1),
    # and holders in a user manager's unit and in an LXD container's own vllm.service, while the host's vllm.service
    # is stopped (item 2: not the host's units to judge).
    api, engine, port, server_log = start_contained_server(node, 4)
    if node.cgroup_root is None:  # no owner cgroups on this machine: the units are not modelled
        in_units = []
    else:
        node.set_units({"vllm.service": {}})
        user_unit, lxd_unit = "/user.slice/user-1000.slice/user@1000.service/app.slice/llm.service", "/lxc.payload.c1"
        in_units = [start_in_unit(node, 5, user_unit), start_in_unit(node, 5, lxd_unit + "/system.slice/vllm.service")]
    live = {pid: ticks(node, pid) for pid in [api, engine] + in_units}
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
    # As if an earlier look had named them:
    alerts += [dict(alert(node, pid, live[pid]), fingerprint="live-%d" % pid) for pid in [engine] + in_units]
    # Issue 40 items 3 and 4: a PID "²" (str.isdigit() true, int() fails), labels as a list; a host that cannot be
    # reached (SSH to a port nothing listens on) and one where gpu_guard cannot start (no such interpreter).
    bad = [alert(node, 7, 5), dict(alert(node, 8, 5), labels=["pid", "8"])]
    bad[0]["labels"]["pid"] = "²"
    (closed,) = free_ports(1)
    wider = tmp_path / "wider.ini"
    wider.write_text(
        inventory.read_text()
        + "gone ansible_connection=ssh ansible_host=127.0.0.1 ansible_port=%d\n" % closed
        + "broken ansible_connection=local ansible_python_interpreter=/nonexistent/python\n"
    )
    failing = [dict(alert(node, 9, 5), fingerprint="gone"), dict(alert(node, 9, 5), fingerprint="broken")]
    failing[0]["labels"] = dict(failing[0]["labels"], inventory_hostname="gone")
    failing[1]["labels"] = dict(failing[1]["labels"], inventory_hostname="broken")
    alerts += bad + failing
    log = tmp_path / "guard.jsonl"
    extra = {
        "guard_payload": {"alerts": alerts},
        "guard_remediate": True,
        "guard_state_dir": str(tmp_path / "state"),
        "guard_log": str(log),
    }
    rc, out, _recap = playbook(wider, "playbooks/guard_remediate.yml", "-e", json.dumps(extra))
    assert rc == 2 and "guard on broken: Look at the host's orphans now failed: " in out, out
    wait_for(lambda: not alive(node, orphan), 10, 0.05, "the named orphan to exit")
    assert alive(node, again) and alive(node, owned) and alive(node, bystander)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    logged = [a.get("fingerprint") for line in lines for a in line.get("alerts", [line.get("alert")])]
    assert sorted(logged) == sorted(a["fingerprint"] for a in alerts), lines
    failed = {line["host"]: line["why"] for line in lines if line.get("action") == "failed"}
    assert set(failed) == {"gone", "broken"} and failed["gone"].startswith("Reach the host failed: "), failed
    assert [line["why"] for line in lines if line.get("alert", {}).get("fingerprint") in ("f7", "f8")] == [
        "the alert does not name a process: labels pid and start_ticks must be positive whole numbers (ASCII digits)",
        "the alert's labels are not a mapping of names to values",
    ]
    whys = {line["pid"]: line["why"] for line in lines if "why" in line and "pid" in line}
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
    assert last["host"] == node.name and "remediation of %s" % node.name in last["why"], last
    assert last["alerts"][0]["fingerprint"] == "f%d" % again, last

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

    # The contained server and the holders in units were never signalled: alive with the same start, serving, and no
    # signal in the server's log.
    assert {pid: ticks(node, pid) for pid in live if alive(node, pid)} == live
    said = server_log.read_text()
    assert health(port) == 200 and not re.search(r"signal|Shutting down", said), said
