# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_stop_owners on a fake /proc: what stopping a unit ends, and when stop_owners refuses (issue 33 item 1).

Each process of a fake tree has the files the code reads: stat (comm, state, parent, start time), cmdline and cgroup
(a cgroup v2 line, as systemd writes it)."""

from __future__ import annotations

import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owner_lines, _select, _stop_owners

OWN_CHAIN = {1, 900}


def fake_proc(tmp_path, processes):
    """A /proc with `processes`: {pid: (ppid, comm, cmdline, cgroup path)}."""
    root = tmp_path / "proc"
    for pid, (ppid, comm, cmdline, cgroup) in processes.items():
        directory = root / str(pid)
        directory.mkdir(parents=True)
        fields = ["S", str(ppid), str(pid), str(pid)] + ["0"] * 15 + [str(pid * 100)] + ["0"] * 30
        (directory / "stat").write_text("%d (%s) %s\n" % (pid, comm, " ".join(fields)))
        (directory / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
        (directory / "cgroup").write_text("0::%s\n" % cgroup)
    return str(root)


def target(pid, gpus, unit, agent=None, comm="python3"):
    """A selected holder (as _select.split returns it) owned by `unit` (Restart=always)."""
    return {
        "pid": pid,
        "comm": comm,
        "cmdline": comm,
        "start_ticks": pid * 100,
        "gpus": list(gpus),
        "memory_mib": {str(g): 1000 for g in gpus},
        "attribution": {str(g): "driver" for g in gpus},
        "owner": {
            "systemd_unit": unit,
            "unit_restart": "always",
            "container_id": None,
            "pod_uid": None,
            "agent": agent,
        },
    }


def plan(proc, targets, holders=None, gpus=(4,)):
    selection = _select.Selection(list(gpus), own_chain=OWN_CHAIN)
    return _stop_owners.plan(targets, {"holders": holders or list(targets)}, selection, proc)


CRON = "/system.slice/cron.service"


def test_a_unit_that_runs_processes_holding_no_gpu_is_refused_naming_each(tmp_path):
    # The case: cron.service runs cron, a backup job and one GPU holder; a reset of GPU 4 with stop_owners.
    proc = fake_proc(
        tmp_path,
        {
            10: (1, "cron", "/usr/sbin/cron -f", CRON),
            11: (10, "backup.sh", "/bin/sh /usr/local/bin/backup.sh", CRON),
            12: (10, "python3", "python3 train.py", CRON),
            13: (1, "sshd", "sshd: /usr/sbin/sshd", "/system.slice/ssh.service"),
        },
    )
    job = target(12, [4], "cron.service")
    found = plan(proc, [job])
    assert found["units"] == ["cron.service"]
    assert [(p["pid"], p["why"], p["beyond"]) for p in found["unit_processes"]["cron.service"]] == [
        (12, "selected", False),
        (10, "holds no GPU", True),
        (11, "holds no GPU", True),
    ]
    (beyond,) = found["beyond"]
    assert [p["pid"] for p in beyond["processes"]] == [10, 11]
    why = _stop_owners.refusal(found["beyond"], spanning_allowed=False)
    assert why.startswith(
        "stop_owners would stop systemd unit cron.service, whose PID 10 (cron) holds no GPU, PID 11 (backup.sh) holds "
        "no GPU; stopping a unit ends all its processes. Set stop_spanning_owners=true"
    ), why
    # The operator may say so; the run then names every process the stop ends.
    assert _stop_owners.refusal(found["beyond"], spanning_allowed=True) is None
    kill = {"would_stop_units": found["units"], "unit_processes": found["unit_processes"]}
    assert _owner_lines.unit_lines(kill, check_mode=True) == [
        "  would stop systemd unit cron.service first (stop_owners), ending PID 12 python3 (holds GPU 4, selected), "
        "PID 10 cron (holds no GPU, beyond the selection), PID 11 backup.sh (holds no GPU, beyond the selection)"
    ]


def test_a_vllm_unit_is_stopped_with_its_api_server_and_helpers(tmp_path):
    """The API server and its EngineCore (TP > 1) hold no GPU; the API server's helpers neither (a multiprocessing
    resource tracker). They are the selection's own work: vLLM shuts down with its engine."""
    unit = "/system.slice/vllm@a.service"
    proc = fake_proc(
        tmp_path,
        {
            20: (1, "vllm", "/opt/venv/bin/python /opt/venv/bin/vllm serve /models/m", unit),
            21: (20, "VLLM::EngineCor", "VLLM::EngineCore", unit),
            22: (21, "VLLM::Worker_TP", "VLLM::Worker_TP0", unit),
            23: (21, "VLLM::Worker_TP", "VLLM::Worker_TP1", unit),
            24: (20, "python3", "python3 -c from multiprocessing.resource_tracker import main;main(9)", unit),
        },
    )
    agent = {"pid": 20, "comm": "vllm", "cmdline": "vllm serve", "kind": "vllm"}
    targets = [target(22, [0], "vllm@a.service", agent), target(23, [1], "vllm@a.service", agent)]
    found = plan(proc, targets, gpus=(0, 1))
    assert found["beyond"] == [] and _stop_owners.refusal(found["beyond"], False) is None
    assert [(p["pid"], p["why"]) for p in found["unit_processes"]["vllm@a.service"]] == [
        (22, "selected"),
        (23, "selected"),
        (20, "part of the selected work"),
        (21, "part of the selected work"),
        (24, "part of the selected work"),
    ]


@pytest.mark.parametrize("kind, refused", [("torchrun", False), ("mpi", False), ("ray", True), ("supervisord", True)])
def test_only_agents_that_run_one_job_bring_what_they_started_into_the_selection(tmp_path, kind, refused):
    unit = "/system.slice/train.service"
    proc = fake_proc(
        tmp_path,
        {
            30: (1, kind, "%s --job" % kind, unit),
            31: (30, "python3", "python3 train.py", unit),
            32: (30, "python3", "python3 dataloader.py", unit),
        },
    )
    job = target(31, [4], "train.service", {"pid": 30, "comm": kind, "cmdline": kind, "kind": kind})
    found = plan(proc, [job])
    assert bool(_stop_owners.refusal(found["beyond"], False)) is refused, found


def test_a_shell_that_started_the_holder_is_beyond_the_selection(tmp_path):
    # No agent: a wrapper shell cannot be told from cron by what /proc shows. The operator says so, or not.
    unit = "/system.slice/train.service"
    proc = fake_proc(tmp_path, {40: (1, "bash", "/bin/bash run.sh", unit), 41: (40, "python3", "python3 t.py", unit)})
    found = plan(proc, [target(41, [4], "train.service")])
    assert [(p["pid"], p["reason"]) for p in found["beyond"][0]["processes"]] == [(40, "holds no GPU")]


def test_what_a_selected_holder_started_is_its_own_work(tmp_path):
    unit = "/system.slice/train.service"
    proc = fake_proc(
        tmp_path,
        {50: (1, "python3", "python3 t.py", unit), 51: (50, "python3", "python3 -c worker", unit + "/workers")},
    )
    found = plan(proc, [target(50, [4], "train.service")])
    assert found["beyond"] == [] and [p["pid"] for p in found["unit_processes"]["train.service"]] == [50, 51]


def test_processes_of_another_unit_of_that_name_are_not_members(tmp_path):
    # A user's cron.service runs under user@1000.service: another cgroup, which the system unit's stop leaves alone.
    proc = fake_proc(
        tmp_path,
        {
            60: (1, "python3", "python3 t.py", CRON),
            61: (1, "cron", "cron", "/user.slice/user-1000.slice/user@1000.service/app.slice/cron.service"),
        },
    )
    found = plan(proc, [target(60, [4], "cron.service")])
    assert found["beyond"] == [] and [p["pid"] for p in found["unit_processes"]["cron.service"]] == [60]


def test_a_unit_that_runs_this_module_is_never_stopped(tmp_path):
    proc = fake_proc(tmp_path, {900: (1, "python3", "ansible", CRON), 70: (1, "python3", "python3 t.py", CRON)})
    found = plan(proc, [target(70, [4], "cron.service")])
    why = _stop_owners.refusal(found["beyond"], spanning_allowed=True)
    assert why.startswith("stop_owners would stop systemd unit cron.service, whose PID 900 (python3) holds no GPU, ")
    assert "that would end this module's own process chain" in why


def test_holders_of_other_gpus_are_beyond_as_before(tmp_path):
    unit = "/system.slice/vllm@a.service"
    proc = fake_proc(tmp_path, {80: (1, "python3", "a", unit), 81: (1, "python3", "b", unit)})
    on0, on4 = target(80, [0], "vllm@a.service"), target(81, [4], "vllm@a.service")
    found = plan(proc, [on0], holders=[on0, on4], gpus=(0,))
    assert [(p["pid"], p["gpus"], p["reason"]) for p in found["beyond"][0]["processes"]] == [
        (81, [4], "outside the selection")
    ]
    assert "PID 81 (python3) holds GPU 4, outside the selection" in _stop_owners.refusal(found["beyond"], False)


def test_without_a_readable_cgroup_only_the_holders_are_known(tmp_path):
    # The target exited between the look and the plan: its unit's processes cannot be read.
    found = plan(fake_proc(tmp_path, {}), [target(90, [4], "cron.service")])
    assert found["unit_processes"] == {"cron.service": []} and found["beyond"] == []
    assert _owner_lines.unit_lines(
        {"stopped_units": ["cron.service"], "unit_processes": found["unit_processes"]}, False
    ) == ["  stopped systemd unit cron.service first (stop_owners); its processes could not be read before the stop"]


def test_a_command_past_its_timeout_is_killed_and_never_waited_for_without_a_bound():
    """At its timeout the command is killed; what keeps its output open (here a child of its own, as a command stuck
    in the driver would keep itself) is waited for at most _REAP_S seconds, not until it ends."""
    started = time.monotonic()
    rc, out, err = _stop_owners.run_bounded(["sh", "-c", "sleep 4 & exec sleep 30"], 0.2)
    elapsed = time.monotonic() - started
    assert (rc, out, err) == (None, "", "no answer within 0.2 s")
    assert elapsed < 0.2 + _stop_owners._REAP_S + 1, elapsed
    assert _stop_owners.run_bounded(["sh", "-c", "echo out; echo err >&2; exit 3"], 5, {"X": "1"}) == (
        3,
        "out\n",
        "err\n",
    )
    assert _stop_owners.run_bounded(["/nonexistent/command"], 5)[0] == 127


def test_a_failed_unit_stop_names_the_units_stopped_before_it():
    calls = []

    def run_command(argv):
        calls.append(argv[-1])
        return (0, "", "") if argv[-1] == "a.service" else (5, "", "Failed to stop b.service: Unit is masked.")

    found = _stop_owners.stop_units(["a.service", "b.service"], {}, run_command, lambda name: "/bin/" + name)
    assert calls == ["a.service", "b.service"] and found.units == ["a.service"]
    assert found.failure == (
        "systemctl stop b.service failed (rc 5): Failed to stop b.service: Unit is masked.; stopped before it: unit "
        "a.service; no process was signalled otherwise"
    )
    first = _stop_owners.stop_units(["b.service"], {}, run_command, lambda name: "/bin/" + name)
    assert first.failure.endswith("Unit is masked.; nothing was signalled")
