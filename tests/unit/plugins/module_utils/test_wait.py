# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_wait.wait_released with a scripted inspector and a fake clock (no real sleeping), and _advice.next_step (the words of a wait that did not end free).

Views are synthetic dicts shaped like _holders.merge's output (see its docstring).
"""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _advice, _options, _select, _wait
from polling import FakeClock


@pytest.fixture(autouse=True)
def daemons(monkeypatch):
    """{PID: the protected executable it runs} (_select.daemon_name reads /proc/PID/exe, which fake PIDs lack)."""
    running = {}
    monkeypatch.setattr(_select, "daemon_name", lambda pid, start_ticks, proc="/proc", owner=0: running.get(pid))
    return running


DRIVER_OK = {"available": True, "error": None, "timed_out": False}
DRIVER_HUNG = {
    "available": False,
    "error": "an NVML call did not return within 1.0 s (driver hung?)",
    "timed_out": True,
}
NO_DRIVER = {
    "available": False,
    "error": "NVMLError_LibraryNotFound: NVML Shared Library Not Found",
    "timed_out": False,
}
OWN_CHAIN = {1, 700}


def holder(
    pid,
    memory,
    comm="VLLM::Worker_TP",
    cmdline="VLLM::Worker_TP0",
    state="S",
    control_only=False,
    attribution=None,
    ppid=4000,
    parent_comm="python3",
):
    """A holder as merge reports it; `memory` maps each GPU index it holds to MiB (None: not reported)."""
    gpus = sorted(memory)
    return {
        "pid": pid,
        "ppid": ppid,
        "comm": comm,
        "cmdline": cmdline,
        "state": state,
        "user": "svc-llm",
        "uid": 1001,
        "kernel_thread": False,
        "start_ticks": pid * 10,
        "gpus": gpus,
        "control_only": control_only,
        "memory_mib": {str(i): memory[i] for i in gpus},
        "attribution": {str(i): (attribution or {}).get(i, "driver") for i in gpus},
        "parent": {"pid": ppid, "comm": parent_comm} if ppid > 1 else None,
    }


def device_user(pid, device_gpus, kind="nvml", comm="nvtop"):
    return {
        "pid": pid,
        "ppid": 1,
        "comm": comm,
        "cmdline": comm,
        "state": "S",
        "user": "root",
        "uid": 0,
        "device_gpus": list(device_gpus),
        "kind": kind,
    }


def gpu(index, used_mib, unexplained_mib=0, reserved_mib=529, foreign=(), suspects=(), error=None):
    return {
        "index": index,
        "uuid": "GPU-%d" % index,
        "memory_used_mib": used_mib,
        "memory_reserved_mib": reserved_mib,
        "unexplained_mib": unexplained_mib,
        "memory_unexplained": unexplained_mib is None or unexplained_mib > 256,
        "foreign": list(foreign),
        "suspects": list(suspects),
        "error": error,
    }


def view(gpus, holders=(), driver=None, device_users=()):
    return {
        "gpus": list(gpus),
        "holders": list(holders),
        "device_users": list(device_users),
        "driver": dict(driver or DRIVER_OK),
    }


class Scripted:
    """An inspector whose snapshots follow a script; the last one repeats. Records the arguments it was given."""

    def __init__(self, *views):
        self.views = list(views)
        self.calls = []

    @property
    def timeouts(self):
        return [call["timeout"] for call in self.calls]

    def snapshot(self, timeout=None, scope="full", indices=None, tolerance_mib=256, **kwargs):  # pylint: disable=unused-argument
        self.calls.append({"timeout": timeout, "scope": scope, "indices": indices, "tolerance_mib": tolerance_mib})
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]


MAX_USED_MIB = _options.default("max_used_mib")


def wait(inspector, indices=None, timeout=10.0, max_used_mib=MAX_USED_MIB, **selection):
    clock = FakeClock(1000.0)
    chosen = _select.Selection(indices, own_chain=OWN_CHAIN, **selection)
    result = _wait.wait_released(
        inspector, chosen, timeout, max_used_mib, poll_interval=0.5, clock=clock, sleep=clock.sleep
    )
    return result, clock


def test_released_once_holders_are_gone_and_memory_is_back():
    engine = holder(5000001, {0: 70000})
    inspector = Scripted(
        view([gpu(0, 71000, unexplained_mib=1000), gpu(1, 3)], [engine]),
        view([gpu(0, 70500, unexplained_mib=70500), gpu(1, 3)]),  # holder gone, memory not yet freed
        view([gpu(0, 200), gpu(1, 3)]),
    )
    result, clock = wait(inspector)
    assert result["released"] is True and result["polls"] == 3
    assert clock.sleeps == [0.5, 0.5] and result["elapsed_s"] == 1.0
    assert [(g["index"], g["released"], g["memory_used_mib"]) for g in result["gpus"]] == [(0, True, 200), (1, True, 3)]
    # NVML is bounded by the time left (plus the fixed allowance for one last look).
    assert inspector.timeouts[:2] == [10.0 + _wait.NVML_SLACK_S, 9.5 + _wait.NVML_SLACK_S]
    assert result["snapshot"] is inspector.views[0] and result["driver"] == DRIVER_OK


def test_each_look_scans_the_listed_pids_of_the_selected_gpus_with_the_threshold_as_tolerance():
    inspector = Scripted(view([gpu(0, 3), gpu(1, 3)]))
    wait(inspector, indices=[1], max_used_mib=64)
    assert inspector.calls == [
        {"timeout": 10.0 + _wait.NVML_SLACK_S, "scope": "listed", "indices": [1], "tolerance_mib": 64}
    ]


def test_threshold_is_inclusive_and_configurable():
    result, _clock = wait(Scripted(view([gpu(0, 256)])))
    assert result["released"] is True and result["polls"] == 1
    result, _clock = wait(Scripted(view([gpu(0, 256)])), timeout=1.0, max_used_mib=100)
    assert result["released"] is False and result["gpus"][0]["holders"] == []


def test_only_the_selected_gpus_are_waited_for():
    busy = holder(5000001, {1: 9000})
    result, _clock = wait(Scripted(view([gpu(0, 3), gpu(1, 9003)], [busy])), indices=[0])
    assert result["released"] is True and [g["index"] for g in result["gpus"]] == [0]


def test_protected_daemons_without_memory_and_device_users_do_not_count_but_mps_clients_listed_by_the_driver_do(
    daemons,
):
    daemons.update({5000002: "nvidia-persistenced", 5000003: "nv-hostengine"})
    daemons = [
        holder(5000002, {0: 0, 1: 0}, comm="nvidia-persiste", cmdline="/usr/bin/nvidia-persistenced --verbose"),
        holder(5000003, {0: 0}, comm="nv-hostengine", cmdline="nv-hostengine -n"),
    ]
    users = [device_user(5000004, [0, 1]), device_user(5000006, [0, 1], kind="cuda", comm="VLLM::Worker_TP")]
    result, _clock = wait(Scripted(view([gpu(0, 3), gpu(1, 3)], daemons, device_users=users)))
    assert result["released"] is True
    assert all(g["holders"] == [] for g in result["gpus"])
    assert sorted((g["index"], h["pid"]) for g in result["gpus"] for h in g["left_alone"]) == [
        (0, 5000002),
        (0, 5000003),
        (1, 5000002),
    ]
    mps = holder(5000005, {1: 1200}, comm="python3", cmdline="python3 mps_job.py", control_only=True)
    result, _clock = wait(Scripted(view([gpu(0, 3), gpu(1, 1203)], daemons + [mps], device_users=users)), timeout=1.0)
    assert result["released"] is False
    assert [(g["index"], [h["pid"] for h in g["holders"]]) for g in result["gpus"]] == [(0, []), (1, [5000005])]


def test_excluded_and_included_protected_holders():
    daemon = holder(5000002, {0: 0}, comm="nvidia-persiste", cmdline="/usr/bin/nvidia-persistenced")
    result, _clock = wait(Scripted(view([gpu(0, 3)], [daemon])), timeout=1.0, include_protected=True)
    assert result["released"] is False and [h["pid"] for h in result["gpus"][0]["holders"]] == [5000002]
    mine = holder(5000005, {0: 0}, comm="my-exporter", cmdline="my-exporter")
    result, _clock = wait(Scripted(view([gpu(0, 3)], [mine])), exclude=["my-exporter"])
    assert result["released"] is True
    assert result["gpus"][0]["left_alone"][0]["reason"].startswith("excluded by the exclude option")


def test_left_alone_holders_memory_does_not_fail_the_wait():
    engine = holder(5000001, {0: 70000}, comm="VLLM::EngineCor", cmdline="VLLM::EngineCore")
    worker = holder(5000002, {1: 60000})
    inspector = Scripted(
        view([gpu(0, 70003), gpu(1, 60003)], [engine, worker]), view([gpu(0, 70003), gpu(1, 3)], [engine])
    )
    result, _clock = wait(inspector, pids={5000002})
    assert result["released"] is True and result["polls"] == 2
    by_index = {g["index"]: g for g in result["gpus"]}
    assert by_index[0]["left_alone_mib"] == 70000 and by_index[0]["left_alone"][0]["reason"] == "not in pids"


def test_foreign_memory_is_used_memory_and_is_reported():
    listed_elsewhere = {"pid": 812345, "used_mib": 40000, "type": "compute", "reason": "absent", "comm": None}
    result, _clock = wait(Scripted(view([gpu(0, 40003, unexplained_mib=3, foreign=[listed_elsewhere])])), timeout=1.0)
    assert result["released"] is False and result["polls"] == 3
    (entry,) = result["gpus"]
    assert entry["holders"] == [] and entry["foreign"] == [listed_elsewhere]


def test_timeout_reports_the_holders_per_gpu():
    engine = holder(5000001, {0: 500, 1: None}, comm="VLLM::EngineCor", cmdline="VLLM::EngineCore")
    inspector = Scripted(
        view([gpu(0, 70000, unexplained_mib=69500), gpu(1, 60000, unexplained_mib=None), gpu(2, 3)], [engine])
    )
    result, clock = wait(inspector, timeout=2.0)
    assert result["released"] is False
    assert result["elapsed_s"] == 2.0 and result["polls"] == 5 and sum(clock.sleeps) == 2.0
    by_index = {g["index"]: g for g in result["gpus"]}
    assert by_index[0]["holders"] == [
        {
            "pid": 5000001,
            "comm": "VLLM::EngineCor",
            "state": "S",
            "cmdline": "VLLM::EngineCore",
            "user": "svc-llm",
            "memory_mib": 500,
            "attribution": "driver",
            "parent": {"pid": 4000, "comm": "python3"},
        }
    ]
    assert by_index[1]["holders"][0]["memory_mib"] is None
    assert (by_index[0]["released"], by_index[1]["released"], by_index[2]["released"]) == (False, False, True)


def test_driver_timeout_ends_the_wait_at_once():
    inspector = Scripted(view([], driver=DRIVER_HUNG), view([gpu(0, 3)]))
    result, clock = wait(inspector, timeout=30.0)
    assert result["released"] is False and result["polls"] == 1 and clock.sleeps == []
    assert result["driver"]["timed_out"] is True


def test_driver_timeout_is_never_released_even_without_holders():
    # The GPUs mapped through /proc/driver/nvidia, memory unknown, no holder: still not released.
    inspector = Scripted(view([gpu(0, None, unexplained_mib=None, reserved_mib=None)], driver=DRIVER_HUNG))
    result, clock = wait(inspector, timeout=30.0)
    assert result["released"] is False and result["polls"] == 1 and clock.sleeps == []
    assert result["gpus"][0]["memory_checked"] is False and result["driver"]["timed_out"] is True


def test_a_hung_driver_message_names_the_holders_that_the_proc_scan_found():
    # The GPUs mapped through /proc/driver/nvidia, memory unknown; a CUDA user of GPU 0's device file is its holder.
    stuck = holder(5000001, {0: None}, comm="python3", cmdline="python3 train.py", attribution={0: "device_file"})
    hung = [
        gpu(0, None, unexplained_mib=None, reserved_mib=None),
        gpu(1, None, unexplained_mib=None, reserved_mib=None),
    ]
    result, _clock = wait(Scripted(view(hung, [stuck], driver=DRIVER_HUNG)), timeout=30.0)
    message = _wait.conclude(result, 1.0)
    assert message.startswith("NVML did not answer within driver_timeout (1.0 s): the driver may be hung; GPU memory")
    # Said once: not again in NVML's own words (driver.error, "did not return within 1.0 s (driver hung?)").
    assert "did not return" not in message and "hung?" not in message
    assert "holders found by the /proc scan alone: GPU 0: PID 5000001 python3 (state S). Next: " in message
    assert "GPU 1:" not in message
    result, _clock = wait(Scripted(view(hung, [], driver=DRIVER_HUNG)), timeout=30.0)
    assert "holders found" not in _wait.conclude(result, 1.0)


def test_a_selected_gpu_with_an_error_ends_the_wait_at_the_first_poll():
    lost = gpu(1, None, unexplained_mib=None, reserved_mib=None, error="GPU is lost")
    inspector = Scripted(view([gpu(0, 3), lost]), view([gpu(0, 3), gpu(1, 3)]))
    result, clock = wait(inspector, timeout=30.0)
    assert result["released"] is False and result["polls"] == 1 and clock.sleeps == []
    assert [(g["index"], g["released"], g["error"]) for g in result["gpus"]] == [
        (0, True, None),
        (1, False, "GPU is lost"),
    ]
    # The other GPUs are still waited for: GPU 0 releases at the second look, then only the lost GPU is left.
    releasing = Scripted(view([gpu(0, 3000, unexplained_mib=3000), lost]), view([gpu(0, 3), lost]))
    result, _clock = wait(releasing)
    assert result["released"] is False and result["polls"] == 2 and len(releasing.calls) == 2
    assert [(g["index"], g["released"], g["error"]) for g in result["gpus"]] == [
        (0, True, None),
        (1, False, "GPU is lost"),
    ]
    # A lost GPU that is not selected does not stop the wait for the others.
    result, _clock = wait(Scripted(view([gpu(0, 3), lost])), indices=[0])
    assert result["released"] is True


def test_without_any_map_there_is_one_entry_for_all_gpus():
    stray = holder(5000001, {}, comm="python3", cmdline="python3 train.py")
    inspector = Scripted(view([], [stray], driver=NO_DRIVER), view([], [], driver=NO_DRIVER))
    result, _clock = wait(inspector)
    assert result["released"] is True and result["polls"] == 2
    assert result["gpus"] == [
        {
            "index": None,
            "uuid": None,
            "memory_used_mib": None,
            "memory_reserved_mib": None,
            "unexplained_mib": None,
            "memory_unexplained": None,
            "unexplained_cause": None,
            "holders": [],
            "left_alone": [],
            "left_alone_mib": 0,
            "protected_mib": 0,
            "foreign": [],
            "exited": [],
            "kept": None,
            "suspects": [],
            "memory_checked": False,
            "error": None,
            "mig_uuid": None,
            "reserved_allowance_mib": 0,
            "memory_note": None,
            "released": True,
        }
    ]


def test_without_any_map_device_users_do_not_count():
    probe = device_user(5000004, [], comm="python3")
    result, _clock = wait(Scripted(view([], [], driver=NO_DRIVER, device_users=[probe])))
    assert result["released"] is True and result["polls"] == 1 and result["gpus"][0]["holders"] == []


def test_unchecked_memory_releases_on_holders_alone():
    result, _clock = wait(Scripted(view([gpu(0, None, unexplained_mib=None, reserved_mib=None)])))
    assert result["released"] is True and result["gpus"][0]["memory_checked"] is False


def test_describe_unread_names_the_gpus_and_the_driver_error():
    result, _clock = wait(
        Scripted(view([gpu(0, 100), gpu(1, None, unexplained_mib=None, reserved_mib=None)], driver=NO_DRIVER))
    )
    _wait.conclude(result, 10.0)
    text = _advice.describe_unread(result)
    assert text == (
        "used memory of GPU 1 not read (NVIDIA driver library not usable: NVMLError_LibraryNotFound: NVML Shared "
        "Library Not Found); no process holds it (/proc scan)"
    )
    whole, _clock = wait(Scripted(view([], [], driver=NO_DRIVER)))
    _wait.conclude(whole, 10.0)
    assert _advice.describe_unread(whole).startswith("used memory of every GPU not read")


# --- next_step -----------------------------------------------------------------------------------------------------


def status_of(
    holders=(), used_mib=70000, unexplained_mib=0, checked=True, index=3, error=None, foreign=(), suspects=()
):
    return {
        "index": index,
        "holders": list(holders),
        "memory_checked": checked,
        "memory_used_mib": used_mib,
        "unexplained_mib": unexplained_mib,
        "error": error,
        "foreign": list(foreign),
        "suspects": list(suspects),
    }


def brief(pid=5000001, state="S", comm="VLLM::Worker_TP", parent=None):
    return {"pid": pid, "state": state, "comm": comm, "parent": parent}


def test_next_step_texts():
    d_state = _advice.next_step(status_of([brief(state="D"), brief(state="S")]))
    assert "uninterruptible sleep (D)" in d_state and "nvidia-smi --gpu-reset -i 3" in d_state
    assert "gpuops.nvidia.gpu_kill" in _advice.next_step(status_of([brief()]))
    leaked = _advice.next_step(status_of([], unexplained_mib=70000))
    assert "no process explains" in leaked and "nvidia-smi --gpu-reset -i 3" in leaked
    assert "did not report memory" in _advice.next_step(status_of([], used_mib=None, checked=False))


def test_next_step_lost_gpu_mentions_xid_and_the_reset_of_that_gpu():
    text = _advice.next_step(status_of(error="GPU is lost", used_mib=None, checked=False, index=5))
    assert "GPU is lost" in text and "Xid" in text and "nvidia-smi --gpu-reset -i 5" in text
    assert "end PID" not in text
    # The error comes first, even with holders stuck on it; they are named, to be ended before the GPU reset.
    text = _advice.next_step(status_of([brief(pid=42, state="D"), brief(pid=43)], error="GPU is lost", index=5))
    assert "Xid" in text and "then end PID 42, 43, which still hold it (gpuops.nvidia.gpu_kill), then reset it" in text
    assert "end PID 42, which still holds it" in _advice.next_step(status_of([brief(pid=42)], error="GPU is lost"))


def test_next_step_d_state_names_the_gpu_or_says_reboot():
    text = _advice.next_step(status_of([brief(pid=42, state="D", comm="VLLM::EngineCor")], index=2))
    assert "PID 42 (VLLM::EngineCor)" in text and "nvidia-smi --gpu-reset -i 2" in text
    text = _advice.next_step(status_of([brief(state="D")], index=None, used_mib=None, checked=False))
    assert "reboot the host" in text and "--gpu-reset" not in text


def test_next_step_holders_with_a_parent_name_the_parent():
    torchrun = {"pid": 4000, "comm": "torchrun"}
    text = _advice.next_step(
        status_of([brief(5000001, parent=torchrun), brief(5000002, parent=torchrun), brief(5000003)], index=None)
    )
    assert (
        "processes still hold the GPUs" in text and "stop their parent (PID 4000 (torchrun): a torchrun agent)" in text
    )
    assert text.count("PID 4000") == 1
    assert "parent" not in _advice.next_step(status_of([brief()]))


def test_next_step_names_torchrun_or_ray_only_where_the_parent_is_one():
    """Issue 46 item 9: an orphaned vLLM server's workers (their parent EngineCore starts nothing again) got "stop their
    parent (for example a torchrun or Ray agent)". The parent is named only where its command line makes it one."""
    engine = {"pid": 5, "comm": "VLLM::EngineCor", "cmdline": "VLLM::EngineCore"}
    text = _advice.next_step(status_of([brief(6, parent=engine), brief(7, parent=engine)]))
    assert text == "processes still hold GPU 3: end them with gpuops.nvidia.gpu_kill", text
    launcher = {"pid": 40, "comm": "python3", "cmdline": "/usr/bin/python3 -m torch.distributed.run --nproc-per-node 8"}
    raylet = {"pid": 41, "comm": "raylet", "cmdline": "/opt/ray/core/src/ray/raylet/raylet --node-id x"}
    bash = {"pid": 42, "comm": "bash", "cmdline": "bash run.sh"}
    text = _advice.next_step(status_of([brief(6, parent=launcher), brief(7, parent=raylet), brief(8, parent=bash)]))
    assert text.endswith(
        "if they come back after being ended, stop their parent (PID 40 (python3): a torchrun agent, "
        "PID 41 (raylet): a Ray raylet) first"
    ), text
    assert "PID 42" not in text


@pytest.mark.parametrize("used_mib, mib", [(812, "812 MiB"), (None, "memory not reported")])
def test_next_step_foreign_entries_never_advise_a_gpu_reset(used_mib, mib):
    absent = {"pid": 812345, "used_mib": used_mib, "type": "compute", "reason": "absent", "comm": None}
    text = _advice.next_step(status_of(foreign=[absent], index=1, unexplained_mib=0))
    assert text.startswith(
        "the driver lists PID 812345 (%s) on GPU 1; no such process holds it in this PID namespace (a container?)" % mib
    )
    assert "on the host" in text and "reset" not in text
    other = {"pid": 77, "used_mib": 100, "type": "compute", "reason": "not_holding", "comm": "bash"}
    text = _advice.next_step(status_of(foreign=[absent, other], index=1))
    assert "PID 77 here (bash) does not hold that GPU" in text and "812345" in text and "reset" not in text


def test_describe_foreign():
    assert _advice.describe_foreign({"pid": 9, "used_mib": 5, "reason": "absent"}, 0) == (
        "the driver lists PID 9 (5 MiB) on GPU 0; no such process holds it in this PID namespace (a container?)"
    )


def test_next_step_unexplained_memory_names_the_nvml_only_suspects():
    text = _advice.next_step(status_of(unexplained_mib=30000, suspects=[11, 12]))
    assert "open only in processes that show no context there (PIDs 11, 12" in text and "--gpu-reset -i 3" in text


def test_a_gpu_held_only_by_a_protected_daemon_ends_the_wait_at_once_not_free(daemons):
    """Issue 33 item 2: a protected holder's memory counts (nothing ends it): the wait says so at once rather than
    waiting its whole timeout, and names the holder and what to do."""
    daemons[5000002] = "nvidia-persistenced"
    daemon = holder(5000002, {0: 40000}, comm="nvidia-persiste", cmdline="/usr/bin/nvidia-persistenced")
    result, clock = wait(Scripted(view([gpu(0, 40003)], [daemon])), timeout=60.0)
    assert result["released"] is False and result["polls"] == 1 and clock.sleeps == []
    message = _wait.conclude(result, 10.0)
    assert message.startswith("not released after 0.0 s: GPU 0: 40003 MiB used, 40000 MiB of it by protected holders")
    assert "PID 5000002 (nvidia-persiste, 40000 MiB) holds its memory and is left alone by default" in message
    # While a target's memory is still being released, the wait goes on.
    inspector = Scripted(view([gpu(0, 70003)], [daemon]), view([gpu(0, 40003)], [daemon]))
    result, _clock = wait(inspector, timeout=60.0)
    assert result["released"] is False and result["polls"] == 2
