# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Containers as owners (issue 43): the stop command of every cgroup form, the container's cgroup, and stop_owners
stopping a docker or podman container through its runtime, on a fake /proc.

The trees are what the host sees of a vLLM container run with an init wrapper (`podman run --init`, `docker run
--init`: catatonit or tini as PID 1 of the container's PID namespace, the API server its child, EngineCore and the
workers below): NSpid lines with the container's own numbers, the cgroup path of each form."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owner_lines, _owners, _select, _stop_owners

CID = "4f1c3a9e0b7d2c6e8a5f1b3d9c7e2a4b6d8f0e1c3a5b7d9f2e4c6a8b0d1f3e5a"
SHORT = CID[:12]
OWN_CHAIN = {1, 900}

FORMS = {
    "docker systemd": "/system.slice/docker-%s.scope" % CID,
    "docker cgroupfs": "/docker/%s" % CID,
    "podman systemd": "/machine.slice/libpod-%s.scope" % CID,
    "podman crun child": "/machine.slice/libpod-%s.scope/container" % CID,
    "podman cgroupfs": "/libpod_parent/libpod-%s" % CID,
    "podman rootless": "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-%s.scope" % CID,
    "quadlet": "/system.slice/vllm-a.service/libpod-payload-%s" % CID,
}


def owner_at(path, restart=None):
    found = _owners.parse_cgroup("0::%s\n" % path)
    block = _owners.empty_owner()
    block.update(found)
    block["unit_restart"] = restart
    return block


@pytest.mark.parametrize(
    "form, command",
    [
        ("docker systemd", "docker stop -t 30 " + SHORT),
        ("docker cgroupfs", "docker stop -t 30 " + SHORT),
        ("podman systemd", "podman stop -t 30 " + SHORT),
        ("podman crun child", "podman stop -t 30 " + SHORT),
        ("podman cgroupfs", "podman stop -t 30 " + SHORT),
        # A user's manager is no unit that runs the container: the runtime stops it.
        ("podman rootless", "podman stop -t 30 " + SHORT),
        # Quadlet: the unit runs the container; podman stop alone would leave the unit to start it again or fail.
        ("quadlet", "systemctl stop vllm-a.service"),
    ],
)
def test_every_container_form_gives_its_runtimes_stop_with_a_timeout(form, command):
    block = owner_at(FORMS[form], restart="always" if form == "quadlet" else None)
    assert block["container_id"] == CID and block["runtime"] == (
        "podman" if "podman" in form or form == "quadlet" else "docker"
    )
    assert _owners.stop_command(block, 30) == command


def test_the_timeout_is_whole_seconds_rounded_up_and_the_runtimes_default_without_one():
    block = owner_at(FORMS["podman systemd"])
    assert _owners.container_stop_argv(block, 2.5) == ["podman", "stop", "-t", "3", SHORT]
    assert _owners.container_stop_argv(block, 0) == ["podman", "stop", "-t", "0", SHORT]
    assert _owners.stop_command(block) == "podman stop -t 10 " + SHORT  # docker-stop(1), podman-stop(1): 10 s
    crio = dict(block, runtime="cri-o")
    assert _owners.stop_command(crio, 5) == "crictl stop --timeout 5 " + SHORT


def test_a_quadlet_containers_note_names_its_unit():
    block = owner_at(FORMS["quadlet"], restart="always")
    assert _owners.container_unit(block) == "vllm-a.service"
    assert _owners.restart_note(block) == (
        "it belongs to podman container %s, which systemd unit vllm-a.service runs" % SHORT
    )
    assert _owners.container_unit(owner_at(FORMS["podman rootless"])) is None
    assert _owners.container_unit(owner_at(FORMS["podman systemd"])) is None


@pytest.mark.parametrize("form", sorted(FORMS))
def test_container_cgroup_is_the_path_up_to_the_container(form):
    path = FORMS[form]
    expected = path[: -len("/container")] if path.endswith("/container") else path
    assert _owners.container_cgroup("12:name=systemd:%s/sub\n0::/\n" % path, CID) == expected
    assert _owners.container_cgroup("0::%s\n" % path, "0" * 64) is None


def fake_proc(tmp_path, processes):
    """A /proc with `processes`: {pid: (ppid, comm, cmdline, cgroup path, NSpid list)}."""
    root = tmp_path / "proc"
    for pid, (ppid, comm, cmdline, cgroup, nspids) in processes.items():
        directory = root / str(pid)
        directory.mkdir(parents=True)
        fields = ["S", str(ppid), str(pid), str(pid)] + ["0"] * 15 + [str(pid * 100)] + ["0"] * 30
        (directory / "stat").write_text("%d (%s) %s\n" % (pid, comm, " ".join(fields)))
        (directory / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
        (directory / "cgroup").write_text("0::%s\n" % cgroup)
        (directory / "status").write_text("Name:\t%s\nNSpid:\t%s\n" % (comm, "\t".join(str(n) for n in nspids)))
    return str(root)


def holder(pid, gpus, path, agent=None, comm="VLLM::Worker_TP"):
    return {
        "pid": pid,
        "comm": comm,
        "cmdline": comm,
        "start_ticks": pid * 100,
        "gpus": list(gpus),
        "memory_mib": {str(g): 1000 for g in gpus},
        "attribution": {str(g): "driver" for g in gpus},
        "owner": owner_at(path) if agent is None else dict(owner_at(path), agent=agent),
    }


def vllm_tree(path, conmon_path=None, sidecar=False):
    """catatonit (container PID 1), the API server (2), EngineCore (3), two workers (4, 5) holding GPUs 0 and 1;
    conmon (their monitor, PID 9 on the host) where conmon_path is given; a sidecar that holds no GPU."""
    processes = {
        20: (9 if conmon_path else 1, "catatonit", "/usr/bin/catatonit -- vllm serve /models/m", path, [20, 1]),
        21: (20, "vllm", "/usr/bin/python3 /usr/local/bin/vllm serve /models/m", path, [21, 2]),
        22: (21, "VLLM::EngineCor", "VLLM::EngineCore", path, [22, 3]),
        23: (22, "VLLM::Worker_TP", "VLLM::Worker_TP0", path, [23, 4]),
        24: (22, "VLLM::Worker_TP", "VLLM::Worker_TP1", path, [24, 5]),
    }
    if conmon_path:
        processes[9] = (1, "conmon", "/usr/bin/conmon --api-version 1 -c %s" % CID, conmon_path, [9])
    if sidecar:
        processes[25] = (20, "sh", "/bin/sh -c while sleep 60; do backup; done", path, [25, 6])
    return processes


API = {"pid": 21, "comm": "vllm", "cmdline": "/usr/bin/python3 /usr/local/bin/vllm serve /models/m", "kind": "vllm"}


def stop_plan(proc, targets, timeout_s=30):
    selection = _select.Selection([0, 1], own_chain=OWN_CHAIN)
    return _stop_owners.plan(targets, {"holders": list(targets)}, selection, proc, timeout_s=timeout_s)


@pytest.mark.parametrize("form", ["podman systemd", "podman cgroupfs", "docker systemd", "docker cgroupfs"])
def test_a_vllm_container_under_an_init_is_stopped_through_its_runtime(tmp_path, form):
    path = FORMS[form]
    proc = fake_proc(tmp_path, vllm_tree(path))
    workers = [holder(23, [0], path, API), holder(24, [1], path, API)]
    found = stop_plan(proc, workers)
    runtime = form.split()[0]
    assert found["units"] == [] and found["beyond"] == []
    assert found["containers"] == [{"id": CID, "runtime": runtime, "command": "%s stop -t 30 %s" % (runtime, SHORT)}]
    assert [(p["pid"], p["why"], p["beyond"]) for p in found["container_processes"][CID]] == [
        (23, "selected", False),
        (24, "selected", False),
        (20, "the container's init", False),
        (21, "part of the selected work", False),
        (22, "part of the selected work", False),
    ]
    assert _stop_owners.refusal(found["beyond"], spanning_allowed=False) is None


def test_a_container_that_also_runs_other_work_is_refused_naming_it(tmp_path):
    path = FORMS["podman systemd"]
    proc = fake_proc(tmp_path, vllm_tree(path, sidecar=True))
    found = stop_plan(proc, [holder(23, [0], path, API), holder(24, [1], path, API)])
    (beyond,) = found["beyond"]
    assert (beyond["kind"], beyond["stops"], beyond["command"]) == ("container", True, "podman stop -t 30 " + SHORT)
    assert [(p["pid"], p["reason"]) for p in beyond["processes"]] == [(25, "holds no GPU")]
    assert _stop_owners.refusal(found["beyond"], spanning_allowed=False) == (
        "stop_owners would stop podman container %s, whose PID 25 (sh) holds no GPU; stopping a container ends all "
        "its processes. Set stop_spanning_owners=true (role: reset_gpus_stop_spanning_owners: true) to stop it anyway, "
        "select those processes too, or leave stop_owners off to end only the selected PIDs" % SHORT
    )
    assert _stop_owners.refusal(found["beyond"], spanning_allowed=True) is None


def test_a_quadlet_container_is_stopped_with_its_unit_and_its_monitor_is_no_work(tmp_path):
    path = FORMS["quadlet"]
    proc = fake_proc(tmp_path, vllm_tree(path, conmon_path="/system.slice/vllm-a.service/runtime"))
    workers = [holder(23, [0], path, API), holder(24, [1], path, API)]
    for worker in workers:
        worker["owner"]["unit_restart"] = "always"
    found = stop_plan(proc, workers)
    assert found["containers"] == [] and found["units"] == ["vllm-a.service"] and found["beyond"] == []
    assert [(p["pid"], p["why"]) for p in found["unit_processes"]["vllm-a.service"]] == [
        (23, "selected"),
        (24, "selected"),
        (9, "the container's monitor"),
        (20, "the container's init"),
        (21, "part of the selected work"),
        (22, "part of the selected work"),
    ]


def test_a_rootless_container_is_only_reported_root_s_runtime_does_not_know_it(tmp_path):
    """A rootless podman container (under user@1000.service) is the user's: root's `podman stop` answers "no such
    container". Its processes are ended as any holders; its stop command is named, never run."""
    path = FORMS["podman rootless"]
    proc = fake_proc(tmp_path, vllm_tree(path))
    workers = [holder(23, [0], path, API), holder(24, [1], path, API)]
    assert _stop_owners.stoppable_container(workers[0]["owner"]) is None
    found = stop_plan(proc, workers)
    assert found["containers"] == [] and found["units"] == []


def test_pods_and_other_runtimes_are_still_only_reported(tmp_path):
    path = "/kubepods.slice/kubepods-pod0a1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/cri-containerd-%s.scope" % CID
    proc = fake_proc(tmp_path, vllm_tree(path))
    found = stop_plan(proc, [holder(23, [0], path, API)])
    assert found["containers"] == [] and found["units"] == []
    assert _stop_owners.owner_commands([holder(23, [0], path, API)]) == [
        "kubectl delete pod (the pod with UID 0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d)"
    ]


def test_stop_containers_runs_the_runtime_with_a_bound_and_says_what_ended(tmp_path):
    path = FORMS["podman cgroupfs"]
    proc = fake_proc(tmp_path, vllm_tree(path))
    found = stop_plan(proc, [holder(23, [0], path, API), holder(24, [1], path, API)], timeout_s=30)
    calls = []

    def run(argv, timeout_s):
        calls.append((argv, timeout_s))
        return 0, SHORT + "\n", ""

    stopped = _stop_owners.stop_containers(
        _stop_owners.Stopped([], {}, None),
        found["containers"],
        found["container_processes"],
        lambda name: "/usr/bin/" + name,
        30,
        run,
        proc,
    )
    assert calls == [(["/usr/bin/podman", "stop", "-t", "30", SHORT], 30 + _stop_owners.CONTAINER_STOP_MARGIN_S)]
    assert stopped.failure is None and [c["id"] for c in stopped.containers] == [CID]
    # The fake /proc keeps every process: none ended, and the run says so.
    assert [p["ended"] for p in stopped.container_processes[CID]] == [False] * 5
    kill = {"stopped_containers": stopped.containers, "container_processes": stopped.container_processes}
    (line,) = _owner_lines.container_lines(kill, check_mode=False)
    assert line.startswith(
        "  stopped podman container %s first (stop_owners: podman stop -t 30 %s), which ended PID 23 VLLM::Worker_TP "
        "(holds GPU 0, selected) [still running after the stop]" % (SHORT, SHORT)
    ), line
    assert _owner_lines.stopped_names(kill) == ["podman stop -t 30 " + SHORT]


def test_a_failed_or_hung_stop_says_so_and_nothing_is_signalled(tmp_path):
    path = FORMS["docker cgroupfs"]
    proc = fake_proc(tmp_path, vllm_tree(path))
    found = stop_plan(proc, [holder(23, [0], path, API), holder(24, [1], path, API)], timeout_s=5)
    base = _stop_owners.Stopped([], {}, None)
    args = (found["containers"], found["container_processes"], lambda name: "/usr/bin/" + name, 5)
    hung = _stop_owners.stop_containers(base, *args, run=lambda argv, timeout_s: (None, "", ""), proc=proc)
    assert hung.failure == (
        "docker stop -t 5 %s failed (no answer within 65 s): no error text; nothing was signalled" % SHORT
    )
    missing = _stop_owners.stop_containers(base, found["containers"], {}, lambda name: None, 5, proc=proc)
    assert (
        missing.failure
        == "docker stop -t 5 %s failed (rc 127): docker is not on this host; nothing was signalled" % (SHORT)
    )
    # After a unit was stopped (its stop signalled its processes), the failure says so rather than "nothing".
    after_unit = _stop_owners.Stopped(["vllm-a.service"], {}, None)
    failed = _stop_owners.stop_containers(after_unit, found["containers"], {}, lambda name: None, 5, proc=proc)
    assert failed.failure == (
        "docker stop -t 5 %s failed (rc 127): docker is not on this host; stopped before it: unit vllm-a.service; "
        "no process was signalled otherwise" % SHORT
    )


def test_the_owner_line_is_silent_for_a_container_this_run_stopped():
    block = owner_at(FORMS["podman systemd"])
    process = {"pid": 23, "comm": "VLLM::Worker_TP", "owner": block}
    process["owner_note"], process["owner_command"] = _owners.restart_note(block), _owners.stop_command(block, 30)
    assert _owner_lines.owner_line(process, []) == (
        "    ending it alone will not last: it belongs to podman container %s, whose runtime may restart it; "
        "stop the owner: podman stop -t 30 %s" % (SHORT, SHORT)
    )
    assert _owner_lines.owner_line(process, ["podman stop -t 30 " + SHORT]) is None
