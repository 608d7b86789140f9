# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_report: owners in the reset summary, its lines and its outcome sentence."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owner_lines, _owners, _report

CID = "4f1c3a9e0b7d2c6e8a5f1b3d9c7e2a4b6d8f0e1c3a5b7d9f2e4c6a8b0d1f3e5a"
UID = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


def owner(**pieces):
    return dict(_owners.empty_owner(), **pieces)


UNIT = owner(systemd_unit="vllm@a.service", unit_restart="always")
QUIET_UNIT = owner(systemd_unit="session-3.scope")
DOCKER = owner(systemd_unit="docker-%s.scope" % CID, container_id=CID, runtime="docker")
POD = owner(
    systemd_unit="cri-containerd-%s.scope" % CID,
    container_id=CID,
    runtime="containerd",
    pod_uid=UID,
    pod_namespace="ml",
    pod_name="vllm-0",
)
SLURM = owner(systemd_unit="slurmstepd.scope", slurm_job="42")
AGENT = owner(agent={"pid": 7, "comm": "torchrun", "cmdline": "python3 /usr/bin/torchrun train.py", "kind": "torchrun"})


@pytest.mark.parametrize(
    "block, words",
    [
        (UNIT, "unit vllm@a.service"),
        (DOCKER, "docker container 4f1c3a9e0b7d"),
        (owner(container_id=CID), "container 4f1c3a9e0b7d"),  # cgroupfs containerd: the path does not name the runtime
        (POD, "pod ml/vllm-0"),
        (owner(pod_uid=UID), "pod %s" % UID),
        (SLURM, "Slurm job 42"),
        (AGENT, ""),
        (_owners.empty_owner(), ""),
        (None, ""),
    ],
)
def test_owner_words_follow_the_label_order(block, words):
    assert _owners.owner_words(block) == words


def holder(pid, owner_block, **extra):
    return _report.annotate(
        dict(
            {"pid": pid, "comm": "VLLM::Worker_TP", "cmdline": "VLLM::Worker_TP0", "gpus": [0], "owner": owner_block},
            **extra,
        )
    )


def test_annotate_adds_note_command_and_label():
    unit, docker, quiet = holder(9, UNIT), holder(10, DOCKER), holder(11, QUIET_UNIT)
    assert unit["owner_note"] == "systemd unit vllm@a.service restarts it (Restart=always)"
    assert (unit["owner_command"], unit["owner_label"]) == ("systemctl stop vllm@a.service", "unit:vllm@a.service")
    assert docker["owner_command"] == "docker stop -t 10 4f1c3a9e0b7d"
    assert docker["owner_label"] == "container:4f1c3a9e0b7d"
    assert (quiet["owner_note"], quiet["owner_command"], quiet["owner_label"]) == (None, None, "unit:session-3.scope")
    assert holder(12, None)["owner_label"] == ""


def test_place_and_owner_line():
    unit = holder(9, UNIT)
    assert _report.place(unit) == "GPUs 0, unit vllm@a.service"
    assert _report.place(holder(12, None)) == "GPUs 0"
    assert _owner_lines.owner_line(unit) == (
        "    ending it alone will not last: systemd unit vllm@a.service restarts it "
        "(Restart=always); stop the owner: systemctl stop vllm@a.service"
    )
    # The unit this run stopped (stop_owners) needs no word; an agent has a note and no command.
    assert _owner_lines.owner_line(unit, ["vllm@a.service"]) is None
    assert _owner_lines.owner_line(holder(13, AGENT)) == (
        "    ending it alone will not last: its parent agent PID 7 (torchrun, torchrun) may start it again"
    )
    assert _owner_lines.owner_line(holder(11, QUIET_UNIT)) is None


def views(pids):
    before = {
        "driver": {"available": True},
        "gpus": [
            {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_used_mib": 75034, "holder_pids": pids, "error": None},
            {"index": 1, "name": "NVIDIA H100 80GB HBM3", "memory_used_mib": 2000, "holder_pids": [20], "error": None},
        ],
    }
    after = copy.deepcopy(before)
    after["gpus"][0].update(memory_used_mib=0, holder_pids=[])
    return before, after


def check_kill():
    return {
        "gpus": [0],
        "would_signal": [holder(9, UNIT), holder(10, POD), holder(11, QUIET_UNIT)],
        "left_alone": [{"pid": 20, "comm": "python3", "reason": "unit not in units"}],
    }


def run_kill():
    return {
        "gpus": [0],
        "elapsed_s": 0.31,
        "stopped_units": ["vllm@a.service"],
        "signalled": [
            dict(holder(10, DOCKER), signals=["SIGTERM"], exited_after_s=0.12),
            dict(holder(14, SLURM), signals=["SIGTERM", "SIGKILL"]),
        ],
        "not_signalled": [dict(holder(9, UNIT), reason="exited before any signal")],
        "left_alone": [],
    }


def test_check_mode_summary_names_each_owner_and_what_restarts_it():
    kill = check_kill()
    before, _after = views([9, 10, 11])
    message = _report.outcome(kill, {}, True, 0)
    assert _report.summary_lines(kill, before, before, True, message) == [
        "check mode: would signal 3 process(es), nothing was signalled",
        "  would signal PID 9 VLLM::Worker_TP (GPUs 0, unit vllm@a.service): VLLM::Worker_TP0",
        "    ending it alone will not last: systemd unit vllm@a.service restarts it (Restart=always); "
        "stop the owner: systemctl stop vllm@a.service",
        "  would signal PID 10 VLLM::Worker_TP (GPUs 0, pod ml/vllm-0): VLLM::Worker_TP0",
        "    ending it alone will not last: it belongs to Kubernetes pod ml/vllm-0, whose kubelet restarts its "
        "containers; stop the owner: kubectl delete pod -n ml vllm-0",
        "  would signal PID 11 VLLM::Worker_TP (GPUs 0, unit session-3.scope): VLLM::Worker_TP0",
        "  left alone PID 20 python3: unit not in units",
        "GPU 0 NVIDIA H100 80GB HBM3: 75034 -> 75034 MiB used, holders 3 -> 3",
    ]


def test_run_summary_names_stopped_units_and_holders_they_ended():
    kill = run_kill()
    before, after = views([9, 10, 14])
    lines = _report.summary_lines(kill, before, after, False, "memory released after 0.40 s more")
    assert lines == [
        "signalled 2 process(es) in 0.31 s",
        "  stopped systemd unit vllm@a.service first (stop_owners)",
        "  PID 10 VLLM::Worker_TP (GPUs 0, docker container 4f1c3a9e0b7d): SIGTERM, exited after 0.12 s",
        "    ending it alone will not last: it belongs to docker container 4f1c3a9e0b7d, whose runtime may restart it; "
        "stop the owner: docker stop -t 10 4f1c3a9e0b7d",
        "  PID 14 VLLM::Worker_TP (GPUs 0, Slurm job 42): SIGTERM then SIGKILL, did not exit",
        "  PID 9 VLLM::Worker_TP (GPUs 0, unit vllm@a.service): not signalled, exited before any signal",
        "memory released after 0.40 s more",
        "GPU 0 NVIDIA H100 80GB HBM3: 75034 -> 0 MiB used, holders 3 -> 0",
    ]


def test_pids_that_hold_no_selected_gpu_are_named_in_the_summary():
    # reset_gpus_pids: [1, 77]: neither holds GPU 0, so nothing is signalled; the summary says why.
    kill = {
        "gpus": [0],
        "elapsed_s": 0.01,
        "signalled": [],
        "not_signalled": [],
        "left_alone": [],
        "not_holding": [1, 77],
    }
    before, _after = views([])
    message = _report.outcome(kill, {}, False, 0)
    lines = _report.summary_lines(kill, before, before, False, message)
    assert "  PID(s) 1, 77 from pids hold none of the selected GPUs (or do not exist): not signalled" in lines, lines
    assert lines[0] == "signalled 0 process(es) in 0.01 s", lines


def test_a_release_names_the_memory_that_left_alone_holders_keep():
    # reset_gpus_pids: [1] where PID 1 holds no GPU and a trainer (left alone) holds 75034 MiB: "memory released"
    # alone would read as a free GPU.
    wait = {"released": True, "memory_checked": True, "gpus": [{"index": 0, "left_alone_mib": 75034}]}
    assert (
        _report.outcome({}, wait, False, 0.0)
        == "memory released after 0.00 s more, besides 75034 MiB that left-alone processes hold"
    )
    wait["gpus"][0]["left_alone_mib"] = 0
    assert _report.outcome({}, wait, False, 1.5) == "memory released after 1.50 s more"


def test_long_command_lines_are_cut_to_80_characters():
    kill = check_kill()
    kill["would_signal"][0]["cmdline"] = "python3 -m vllm.entrypoints.openai.api_server " + "x" * 80
    before, _after = views([9, 10, 11])
    line = _report.summary_lines(kill, before, before, True, "m")[1]
    assert line.endswith("...") and len(line.split("): ", 1)[1]) == 80, line
    assert _report.cut_cmdline("y" * 80) == "y" * 80 and _report.cut_cmdline(None) == ""


def test_failed_wait_counts_the_whole_time_waited():
    wait = {"released": False, "msg": "not released after 0.4 s: GPU 1: 5000 MiB used"}
    assert _report.outcome({}, wait, False, 12.34) == "FAILED: not released after 12.3 s: GPU 1: 5000 MiB used"
    assert _report.outcome({}, {"released": False}, False, 1) == "FAILED: the wait did not run"
    assert _report.outcome({}, {"released": True, "memory_checked": False}, False, 1.5) == (
        "no holder left after 1.50 s more; used memory not checked (NVIDIA driver library not usable)"
    )
    assert _report.outcome({"failed": True, "msg": "bad"}, {}, False, 0) == "FAILED to end the holders: bad"


def test_check_mode_outcome_of_a_failed_check_says_so():
    kill = dict(
        check_kill(), failed=True, msg="would signal 3 process(es); a real run would fail whatever it ended: ..."
    )
    assert _report.outcome(kill, {}, True, 0) == (
        "FAILED (check mode): would signal 3 process(es); a real run would fail whatever it ended: ..."
    )
    assert _report.outcome(dict(check_kill(), failed=False), {}, True, 0) == (
        "check mode: would signal 3 process(es), nothing was signalled"
    )
