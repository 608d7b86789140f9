# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The memory a run may expect back (_release): a dead creator's listed memory is held by the processes that hold its
context's handles, and stays with them where all of them are left alone (issue 47); the advice for what is left
(_advice): no GPU reset and no other PID namespace while a process here holds the GPU, the exited creator named on a
GPU without memory figures too (issue 40 item 10), memory no process explains worded by the driver in hand (item 11).

The views are merge's shape (test_select.make_view) after four trainers on GPU 1 forked DataLoader workers and were
SIGKILLed: the driver lists each dead trainer with its memory, the workers hold the handles (attribution device_file,
their own memory null: several share each context) and share the files of the trainer they came from
(context_groups, _shared_files).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_select import daemons, gpu, holder, make_view, selection  # noqa: F401 # pylint: disable=unused-import

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _release, _report, _shared_files, _wait

# Dead trainers (listed PIDs) and their workers: (trainer, MiB, workers).
A, B, C, D, E = 5000100, 5000200, 5000300, 5000400, 5000500
TRAINERS = {A: (9000, [5000101]), B: (10085, [5000201, 5000202]), C: (5813, [5000301, 5000302]), D: (5813, [5000401])}
SELECTED = {5000101, 5000201, 5000202}  # reset_gpus_pids: the workers of A and B
KEPT = 5813 + 5813


def worker(pid, trainers, user="svc-llm", comm="pt_data_worker"):
    return dict(
        holder(pid, {1: None}, attribution={1: "device_file"}, cmdline="python3 train.py", user=user, comm=comm),
        contexts_of={"1": sorted(trainers)},
    )


def dead(pid, mib):
    return {"pid": pid, "used_mib": mib, "type": "compute", "reason": "exited", "comm": None}


def view(trainers, workers, groups, stray_mib=0, cause=None, memory=True, suspects=()):
    """GPU 1 carrying the contexts of `trainers` ({PID: MiB}), held by `workers` in `groups`; `stray_mib` more that no
    list explains (`cause`); `memory` False: a GPU whose memory NVML does not report (a GB10)."""
    listed = sum(trainers.values())
    entry = gpu(1, listed + stray_mib, suspects=suspects)
    built = make_view([gpu(0), entry], workers)
    one = built["gpus"][1]
    one.update(
        exited=[dead(pid, mib) for pid, mib in sorted(trainers.items())],
        context_groups=groups,
        explained_mib=listed,
        unexplained_mib=stray_mib,
        memory_unexplained=stray_mib > 256,
        unexplained_cause=cause if stray_mib > 256 else None,
    )
    if not memory:
        one.update(memory_supported=False, memory_source="process_lists", memory_used_mib=listed)
    return built


def workers_of(*trainers, **kwargs):
    return [worker(pid, trainers, **kwargs) for trainer in trainers for pid in TRAINERS[trainer][1]]


def groups_of(*trainers):
    return [TRAINERS[trainer][1] for trainer in trainers]


def entry_of(chosen, built):
    return {g["index"]: g for g in _release.gpu_status(chosen, built, 256)}[1]


def advice(entry, driver_version="580.95.05"):
    """The next step a wait that ended with `entry` not released gives (_wait.conclude)."""
    driver = {"available": True, "error": None, "timed_out": False, "driver_version": driver_version}
    _wait.conclude({"released": False, "elapsed_s": 1.0, "polls": 2, "gpus": [entry], "driver": driver}, 10.0)
    return entry["next_step"]


# --- the rule --------------------------------------------------------------------------------------------------


def test_the_contexts_stay_with_the_groups_left_alone_once_no_target_holds_one():
    exited = [dead(C, 5813), dead(D, 5813)]
    kept = _release.kept_contexts(exited, [[5000301, 5000302], [5000401]], [], [5000301, 5000302, 5000401])
    assert kept == {"creators": [C, D], "mib": KEPT, "holders": [5000301, 5000302, 5000401], "shared": [], "unheld": 0}


def test_while_targets_hold_contexts_nothing_is_kept_yet():
    exited = [dead(pid, TRAINERS[pid][0]) for pid in (A, B, C, D)]
    kept = _release.kept_contexts(exited, groups_of(A, B, C, D), SELECTED, [5000301, 5000302, 5000401])
    assert kept is not None and (kept["creators"], kept["mib"], kept["unheld"]) == ([], 0, 0)


def test_contexts_beyond_the_groups_left_alone_are_being_released_and_waited_for():
    # Just after the targets' end: A's and B's contexts are still listed, no process holds them.
    exited = [dead(pid, TRAINERS[pid][0]) for pid in (A, B, C, D)]
    kept = _release.kept_contexts(exited, groups_of(C, D), [], [5000301, 5000302, 5000401])
    assert kept is not None and (kept["creators"], kept["mib"], kept["unheld"]) == ([], 0, 2)


def test_a_group_split_between_a_target_and_a_process_left_alone_keeps_its_context():
    kept = _release.kept_contexts([dead(E, 3000)], [[5000501, 5000502]], [5000501], [5000502])
    assert kept is not None and kept["shared"] == [[5000501, 5000502]] and kept["creators"] == []
    after = _release.kept_contexts([dead(E, 3000)], [[5000502]], [], [5000502])
    assert after is not None and (after["creators"], after["mib"]) == ([E], 3000)


def test_without_groups_the_holders_count_as_one_group():
    assert _release.kept_contexts([dead(C, 5813)], None, [], [5000301, 5000302])["mib"] == 5813
    two = _release.kept_contexts([dead(C, 5813), dead(D, 5813)], None, [], [5000301, 5000401])
    assert two is not None and (two["mib"], two["unheld"]) == (0, 1)
    assert _release.kept_contexts([dead(C, 5813)], [[5000301]], [5000301], []) is None


# --- the release decision: the scenario and its variants ----------------------------------------------


@pytest.mark.parametrize(
    "chosen, kept_by, reason",
    [
        (selection(pids=SELECTED), {}, "not in pids"),
        (selection(exclude=["pt_keep_worker"]), {"comm": "pt_keep_worker"}, "excluded"),
        (selection(users=["svc-llm"]), {"user": "nobody"}, "user nobody not in users"),
    ],
    ids=["pids", "exclude", "users"],
)
def test_memory_of_dead_creators_whose_holders_are_all_left_alone_is_theirs(chosen, kept_by, reason):
    left = workers_of(C, D, **kept_by)
    entry = entry_of(chosen, view({C: 5813, D: 5813}, left, groups_of(C, D)))
    assert entry["released"] is True and entry["left_alone_mib"] == KEPT and entry["protected_mib"] == 0
    assert entry["kept"]["creators"] == [C, D] and entry["kept"]["holders"] == [5000301, 5000302, 5000401]
    assert all(h["reason"].startswith(reason) for h in entry["left_alone"])
    assert _release.rest_mib(entry) == 0


def test_one_worker_per_creator():
    left = [worker(5000301, [C, D]), worker(5000401, [C, D])]
    entry = entry_of(selection(pids=SELECTED), view({C: 5813, D: 5813}, left, [[5000301], [5000401]]))
    assert entry["released"] is True and entry["left_alone_mib"] == KEPT


def test_a_sole_holder_charged_the_creators_memory_is_not_counted_twice():
    # One worker left: the merge charges it the dead creator's listed memory (_holders._inherited_mib), which is what
    # it keeps; found by a tryout that read "40000 MiB with PID 4" beside "20000 -> 20000 MiB used".
    alone = dict(worker(5000401, [D]), memory_mib={"1": 5813})
    entry = entry_of(selection(pids=SELECTED), view({D: 5813}, [alone], [[5000401]]))
    assert entry["released"] is True and entry["left_alone_mib"] == 5813 and entry["kept"]["mib"] == 5813
    assert _release.rest_mib(entry) == 0


def test_the_wait_goes_on_while_freed_contexts_are_still_listed():
    built = view({pid: TRAINERS[pid][0] for pid in (A, B, C, D)}, workers_of(C, D), groups_of(C, D))
    entry = entry_of(selection(pids=SELECTED), built)
    assert entry["released"] is False and entry["left_alone_mib"] == 0 and entry["kept"]["unheld"] == 2
    text = advice(entry)
    assert "--gpu-reset" not in text and "another PID namespace" not in text and "no process explains" not in text
    assert "PID 5000301, 5000302, 5000401, left alone, hold some of these contexts" in text
    assert "no process in this PID namespace shows the other 2: the memory is being released" in text


def test_leaked_memory_beside_them_is_not_theirs_and_no_gpu_reset_is_advised_while_they_hold_the_gpu():
    built = view({C: 5813, D: 5813}, workers_of(C, D), groups_of(C, D), stray_mib=5000, cause="leaked")
    entry = entry_of(selection(pids=SELECTED), built)
    assert entry["released"] is False and entry["left_alone_mib"] == KEPT
    result = {"released": False, "elapsed_s": 1.0, "polls": 2, "gpus": [entry], "driver": dict(built["driver"])}
    msg = _wait.conclude(result, 10.0)
    assert "memory is used that no process explains (5000 MiB): leaked, or still being released" in msg
    assert "PID 5000301, 5000302, 5000401, left alone, still hold GPU 1" in msg
    assert "--gpu-reset" not in msg and "another PID namespace" not in msg


def test_the_summary_says_how_much_stays_with_whom_and_what_a_split_creator_keeps():
    entry = entry_of(selection(pids=SELECTED), view({C: 5813, D: 5813}, workers_of(C, D), groups_of(C, D)))
    wait = {"released": True, "memory_checked": True, "gpus": [entry]}
    assert _report.outcome({}, wait, False, 0.3) == (
        "memory released after 0.30 s more, besides 11626 MiB that left-alone processes hold (GPU 1: 11626 MiB with "
        "PID 5000301, 5000302, 5000401, which hold the contexts of PID %d, %d, exited)" % (C, D)
    )
    split = [worker(5000501, [E]), worker(5000502, [E])]
    before = view({E: 3000}, split, [[5000501, 5000502]])
    chosen = selection(pids={5000501})
    parts = chosen.split(before)
    kill = {"signalled": parts["targets"], "left_alone": parts["left_alone"]}
    assert _report.shared_lines(kill, before, False) == [
        "  GPU 1: PID 5000501 shared PID %d's context (exited) with PID 5000502, left alone: that context and its "
        "memory stay until PID 5000502 exits" % E
    ]
    kill = {"would_signal": parts["targets"], "left_alone": parts["left_alone"]}
    assert "PID 5000501 would share" in _report.shared_lines(kill, before, True)[0]


# --- the advice: GB10 (issue 40 item 10), the driver in hand (item 11) -----------------------------------------


@pytest.mark.parametrize("memory", [True, False], ids=["h100", "gb10"])
def test_an_exited_creator_whose_holder_the_scan_misses_is_named_with_or_without_memory_figures(memory):
    built = view({4321: 7000}, [], [], memory=memory, suspects=[5000042])
    entry = entry_of(selection(), built)
    assert entry["released"] is False and entry["memory_checked"] is memory
    text = advice(entry)
    assert text.startswith("the driver still lists PID 4321 on GPU 1 (7000 MiB in all), which has exited"), text
    assert "no process in this PID namespace shows their contexts" in text and "PIDs 5000042" in text
    assert "did not report memory" not in text and "--gpu-reset" not in text


@pytest.mark.parametrize(
    "cause, version, said, unsaid",
    [
        ("unlisted", "535.104.05", "driver 535.104.05, older than 535.113.01, lists every client", "only the caller"),
        ("leaked", "580.95.05", "lists every process of this PID namespace, the host's own", "another PID namespace"),
        ("other_namespace_or_leaked", "580.95.05", "drivers from 535.113.01 list only the caller's namespace", "older"),
    ],
)
def test_memory_no_process_explains_is_worded_by_the_driver_in_hand(cause, version, said, unsaid):
    built = view({}, [], [], stray_mib=30000, cause=cause)
    entry = entry_of(selection(), built)
    text = advice(entry, version)
    assert said in text and unsaid not in text and "(30000 MiB)" in text and "nvidia-smi --gpu-reset -i 1" in text


# --- the groups: processes that share a creator's open device files (kcmp) -------------------------------------

# argv[1]: a directory with files named like the driver's; opens them, forks argv[2] workers that keep them, prints
# the PIDs, then waits to be ended.
FAMILY = r"""
import os, sys, time
fds = [os.open(os.path.join(sys.argv[1], name), os.O_RDWR) for name in ("nvidiactl", "nvidia1")]
children = []
for _ in range(int(sys.argv[2])):
    pid = os.fork()
    if pid == 0:
        while True:
            time.sleep(1)
    children.append(pid)
print(" ".join(str(p) for p in [os.getpid()] + children), flush=True)
sys.stdin.read()
for pid in children:
    os.kill(pid, 9)
"""


def test_groups_are_the_processes_that_share_a_creators_device_files(tmp_path):
    for name in ("nvidiactl", "nvidia1"):
        (tmp_path / name).write_text("")
    started = [
        subprocess.Popen(
            [sys.executable, "-c", FAMILY, str(tmp_path), str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        for n in (2, 1)
    ]
    try:
        families = [[int(p) for p in process.stdout.readline().split()] for process in started]
        first, second = families[0][1:], families[1][1:]
        assert _shared_files.groups(first + second) == sorted([sorted(first), second])
        # A creator and its workers share them too; one PID needs no kcmp.
        assert _shared_files.groups(families[0]) == [sorted(families[0])]
        assert _shared_files.groups([second[0]]) == [second]
        # A process without NVIDIA device files open cannot be told: no groups at all.
        assert _shared_files.groups(first + [os.getpid()]) is None
    finally:
        for process in started:
            process.communicate(b"", timeout=10)
    time.sleep(0)
