"""playbooks/reset_gpus.yml and the gpu_facts / gpu_kill / gpu_wait modules, end to end on simulated nodes."""

from __future__ import annotations

import concurrent.futures
import json
import re
import time

import pytest

from ansible_run import REPO, module, only, playbook
from nodetools import (
    alive,
    daemon_executable,
    gpu_memory,
    processes,
    start_cuda_process,
    start_holder,
    start_vllm,
    vllm_tree,
    wait_for,
)
from simnode import inventory_file

PLAYBOOK = REPO / "playbooks" / "reset_gpus.yml"


def orphaned_tp8(simnode, **knobs):
    """A node whose vLLM TP=8 API server was SIGKILLed: EngineCore and 8 workers keep every GPU."""
    node = simnode(gpus=8, release_latency=0.5, **knobs)
    api = start_vllm(node, "/models/m", "--tensor-parallel-size", "8")
    node.exec("kill", "-9", str(api))
    wait_for(lambda: not alive(node, api), 10, what="API server gone")
    engines, workers = vllm_tree(node)
    assert len(engines) == 1 and len(workers) == 8
    return node, engines + workers


def test_reset_ends_orphaned_vllm_tree_and_releases_memory(simnode, tmp_path):
    node, tree = orphaned_tp8(simnode)
    inventory = inventory_file(tmp_path, node)
    assert all(used > 60000 for used, _pids in gpu_memory(node))

    rc, out, recap = playbook(inventory, PLAYBOOK, "--check")
    assert rc == 0, out
    assert recap[node.name]["changed"] == 1, out
    assert "would signal" in out
    assert all(alive(node, pid) for pid in tree), "check mode signalled something"
    assert all(used > 60000 for used, _pids in gpu_memory(node))

    rc, out, recap = playbook(inventory, PLAYBOOK)
    assert rc == 0, out
    # Argument validation, gpu_kill, gpu_wait and the summary; gpu_facts is skipped (gpu_wait reported the GPUs).
    assert recap[node.name]["changed"] == 1 and recap[node.name]["failed"] == 0, out
    assert "memory released after" in out
    assert not any(alive(node, pid) for pid in tree), processes(node)
    assert all(used <= 256 and not pids for used, pids in gpu_memory(node))
    for gpu in range(8):
        assert "GPU %d NVIDIA H100 80GB HBM3: 75034 -> 0 MiB used" % gpu in out

    rc, out, recap = playbook(inventory, PLAYBOOK)
    assert rc == 0 and recap[node.name]["changed"] == 0, out


def test_facts_report_vllm_holders_with_identity_and_memory(simnode, tmp_path):
    node, tree = orphaned_tp8(simnode)
    status, result = only(module(inventory_file(tmp_path, node), "gpuops.nvidia.gpu_facts"))
    assert status == "SUCCESS"
    facts = result["ansible_facts"]["nvidia"]
    assert facts["driver"]["available"] and facts["driver"]["driver_version"]
    assert [g["index"] for g in facts["gpus"]] == list(range(8))
    holders = {h["pid"]: h for h in facts["holders"]}
    engines, workers = vllm_tree(node)
    for rank, pid in enumerate(sorted(workers, key=lambda p: holders[p]["cmdline"])):
        worker = holders[pid]
        assert worker["cmdline"] == "VLLM::Worker_TP%d" % rank
        assert worker["comm"] == "VLLM::Worker_TP"  # the kernel's 15 bytes, not psutil's guess
        assert worker["ppid"] == engines[0] and worker["state"] in "RS"
        assert worker["gpus"] == [rank] and worker["memory_mib"] == {str(rank): 75034}
        assert worker["seen_in"] == ["driver", "fd", "mapping"]  # a context maps its GPU's file rw-s
        assert worker["user"] == "root" and worker["start_time"] and worker["start_ticks"] > 0
    for gpu in facts["gpus"]:
        assert gpu["memory_used_mib"] == 75034 and gpu["memory_reserved_mib"] == 529
        assert gpu["memory_source"] == "nvmlDeviceGetMemoryInfo_v2"
        assert gpu["unexplained_mib"] == 0 and len(gpu["holder_pids"]) >= 1


def test_protected_daemons_and_unselected_holders_survive(simnode, tmp_path):
    node = simnode(gpus=4, release_latency=0.2)
    # A daemon by its executable (a root-owned binary named nvidia-persistenced), whatever it is titled.
    daemon = start_cuda_process(
        node, [0, 1, 2, 3], mib=16, visible=[0, 1, 2, 3], executable=daemon_executable(node, "nvidia-persistenced")
    )
    outside_match = start_holder(node, [1], mib=2048)
    outside_gpus = start_holder(node, [3], mib=2048, title="VLLM::Worker_TP0")
    target = start_holder(node, [1], mib=4096, title="VLLM::Worker_TP1")
    inventory = inventory_file(tmp_path, node)

    rc, out, recap = playbook(
        inventory,
        PLAYBOOK,
        "-e",
        '{"reset_gpus_gpus": [1], "reset_gpus_match": "VLLM::|nvidia-persistenced", "reset_gpus_timeout": 20}',
    )
    # GPU 1 still holds the unselected process: it is named as left alone, and its memory (and the protected
    # daemon's) does not make the wait fail (issue 10: the selection decides what is waited for).
    assert rc == 0 and "memory released after" in out, out
    assert "left alone PID %d python: command line does not match" % outside_match in out, out
    assert "GPU 1 NVIDIA H100 80GB HBM3: 6160 -> 2064 MiB used, holders 3 -> 2" in out, out
    assert not alive(node, target)
    assert alive(node, daemon) and alive(node, outside_match) and alive(node, outside_gpus)
    assert "protected GPU daemon (nvidia-persistenced)" in out


def test_check_mode_kill_signals_nothing_and_second_kill_is_unchanged(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.1)
    holder = start_holder(node, [0], mib=1000)
    inventory = inventory_file(tmp_path, node)
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", check=True))
    assert status == "CHANGED" and [p["pid"] for p in result["would_signal"]] == [holder]
    assert result["signalled"] == [] and alive(node, holder)
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", {"grace_period": 5}))
    assert status == "CHANGED" and [p["pid"] for p in result["exited"]] == [holder]
    assert result["signalled"][0]["signals"] == ["SIGTERM"]
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill"))
    assert status == "SUCCESS" and result["changed"] is False and result["signalled"] == []


@pytest.mark.parametrize(
    "args, message",
    [
        ({"gpus": [9]}, "unknown GPU 9"),
        ({"gpus": ["GPU-00000000-0000-0000-0000-000000000000"]}, "unknown GPU"),
        ({"match": "VLLM::(("}, "invalid regex"),
        ({"grace_period": -1}, "grace_period=-1.0 (must not be negative)"),
        ({"signal": "SIGBOGUS"}, "unknown signal"),
    ],
)
def test_bad_input_fails_clearly_and_kills_nothing(simnode, tmp_path, args, message):
    """(See also test_every_bad_value_is_refused_before_any_signal for the values of issue 11.)"""
    node = simnode(gpus=2)
    holder = start_holder(node, [0, 1], mib=512)
    status, result = only(module(inventory_file(tmp_path, node), "gpuops.nvidia.gpu_kill", args))
    assert status == "FAILED!" and message in result["msg"], result
    assert "nothing was signalled" in result["msg"]
    assert alive(node, holder)


def test_inherited_handle_is_found_and_memory_released(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.3)
    child = start_holder(node, [1], mib=3000, mode="inherit")
    inventory = inventory_file(tmp_path, node)
    facts = only(module(inventory, "gpuops.nvidia.gpu_facts"))[1]["ansible_facts"]["nvidia"]
    gpu1 = facts["gpus"][1]
    # The driver still lists the exited parent with the memory (gpu_rmapi.c gpuGetProcWithObject_IMPL); the child
    # holds that context.
    ((listed,),) = [[p["pid"] for p in gpu1["driver_processes"]]]
    assert listed != child and gpu1["memory_used_mib"] == 3000 and gpu1["unexplained_mib"] == 0
    assert gpu1["exited"] == [{"pid": listed, "used_mib": 3000, "type": "compute", "reason": "exited", "comm": None}]
    assert gpu1["holder_pids"] == [child]
    holder = facts["holders"][0]
    # The child alone shows the context (its inherited rw-s mapping): the exited creator's memory goes to it.
    assert holder["pid"] == child and holder["seen_in"] == ["fd", "mapping"] and holder["memory_mib"] == {"1": 3000}
    assert holder["contexts_of"] == {"1": [listed]}
    rc, out, recap = playbook(inventory, PLAYBOOK)
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert gpu_memory(node)[1] == (0, [])


def test_minor_numbers_that_differ_from_indices(simnode, tmp_path):
    node = simnode(gpus=4, minors=[3, 2, 1, 0], release_latency=0.1)
    on_index0 = start_holder(node, [0], mib=700)  # holds /dev/nvidia3
    on_index3 = start_holder(node, [3], mib=900)  # holds /dev/nvidia0
    inventory = inventory_file(tmp_path, node)
    facts = only(module(inventory, "gpuops.nvidia.gpu_facts"))[1]["ansible_facts"]["nvidia"]
    by_pid = {h["pid"]: h for h in facts["holders"]}
    assert by_pid[on_index0]["gpus"] == [0] and by_pid[on_index0]["minors"] == [3]
    assert by_pid[on_index3]["gpus"] == [3] and by_pid[on_index3]["minors"] == [0]
    uuid0 = facts["gpus"][0]["uuid"]
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", {"gpus": [uuid0]}))
    assert status == "CHANGED" and [p["pid"] for p in result["signalled"]] == [on_index0]
    assert alive(node, on_index3) and not alive(node, on_index0)


def test_sigterm_ignoring_holder_is_escalated_to_sigkill(simnode, tmp_path):
    node = simnode(gpus=1, release_latency=0.1)
    stubborn = start_holder(node, [0], mib=100, mode="ignore-term")
    status, result = only(module(inventory_file(tmp_path, node), "gpuops.nvidia.gpu_kill", {"grace_period": 0.5}))
    assert status == "CHANGED", result
    [entry] = result["exited"]
    assert entry["pid"] == stubborn and entry["signals"] == ["SIGTERM", "SIGKILL"]
    assert entry["exited_after_s"] >= 0.5


def test_zombie_counts_as_exited_on_a_node_that_never_reaps(simnode, tmp_path):
    node = simnode(gpus=1, release_latency=0.1, no_reap=True)
    holder = start_holder(node, [0], mib=100)
    inventory = inventory_file(tmp_path, node)
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", {"grace_period": 5}))
    assert status == "CHANGED" and result["exited"][0]["pid"] == holder and result["survived"] == []
    assert processes(node)[holder][1] == "Z"
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill"))
    assert result["changed"] is False


def test_leaked_memory_makes_wait_fail_with_a_report(simnode, tmp_path):
    node = simnode(gpus=2, stray_mib={1: 5000})
    started = time.monotonic()
    status, result = only(module(inventory_file(tmp_path, node), "gpuops.nvidia.gpu_wait", {"timeout": 1}))
    assert status == "FAILED!" and time.monotonic() - started < 15
    stuck_gpus = [g for g in result["gpus"] if not g["released"]]
    assert len(stuck_gpus) == 1, result
    stuck = stuck_gpus[0]
    assert stuck["index"] == 1 and stuck["memory_used_mib"] == 5000 and stuck["unexplained_mib"] == 5000
    assert stuck["holders"] == [] and "nvidia-smi --gpu-reset -i 1" in stuck["next_step"]
    assert "GPU 1: 5000 MiB used" in result["msg"]


def test_hung_driver_does_not_hang_the_modules(simnode, tmp_path):
    node = simnode(gpus=2, hang="nvmlDeviceGetMemoryInfo_v2")
    inventory = inventory_file(tmp_path, node)
    started = time.monotonic()
    status, result = only(module(inventory, "gpuops.nvidia.gpu_facts", {"driver_timeout": 1}))
    assert status == "SUCCESS" and result["ansible_facts"]["nvidia"]["driver"]["timed_out"] is True
    status, result = only(module(inventory, "gpuops.nvidia.gpu_wait", {"timeout": 2, "driver_timeout": 1}))
    # The cause and the next step are named; a hung driver is never called "no NVML", nor is widening advised.
    assert status == "FAILED!" and "NVML did not answer within driver_timeout" in result["msg"], result["msg"]
    assert "no NVML" not in result["msg"] and "omit gpus" not in result["msg"]
    # gpu_kill goes on from /proc (GPU 0 is mapped through /proc/driver/nvidia) and says why.
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", {"gpus": [0], "driver_timeout": 1}))
    assert status == "SUCCESS" and "NVML did not answer within driver_timeout" in result["msg"], result
    assert "omit gpus" not in str(result) and "no NVML" not in str(result)
    assert time.monotonic() - started < 20


def test_host_without_driver_library(simnode, tmp_path):
    node = simnode(gpus=2, no_driver=True, release_latency=0.1)
    holder = start_holder(node, [0], mib=100)
    inventory = inventory_file(tmp_path, node)
    status, result = only(module(inventory, "gpuops.nvidia.gpu_facts"))
    facts = result["ansible_facts"]["nvidia"]
    assert status == "SUCCESS" and facts["driver"]["available"] is False
    assert "LibraryNotFound" in facts["driver"]["error"]
    # The kernel module's /proc/driver/nvidia still maps indices to minors; memory is unknown.
    assert facts["index_source"] == "proc_driver" and [g["memory_used_mib"] for g in facts["gpus"]] == [None, None]
    assert [h["pid"] for h in facts["holders"]] == [holder] and facts["holders"][0]["gpus"] == [0]
    status, result = only(module(inventory, "gpuops.nvidia.gpu_kill", {"gpus": [1]}, check=True))
    assert status == "SUCCESS" and result["would_signal"] == [] and alive(node, holder)
    rc, out, recap = playbook(inventory, PLAYBOOK)
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert "driver library not usable" in out and not alive(node, holder)
    assert "1 ok; holders ended on 1 (%s); used memory not read on 1 (%s)" % (node.name, node.name) in out, out


def test_check_gpus_probe_changes_nothing_and_fails_on_dirty_gpus(simnode, tmp_path):
    dirty = simnode(gpus=2, release_latency=0.1)
    clean = simnode(gpus=2)
    holder = start_holder(dirty, [1], mib=3000)
    inventory = inventory_file(tmp_path, dirty, clean)
    check = REPO / "playbooks" / "check_gpus.yml"
    rc, out, recap = playbook(inventory, check)
    assert rc != 0 and recap[dirty.name]["failed"] == 1 and recap[clean.name]["failed"] == 0, out
    assert recap[dirty.name]["changed"] == 0 and recap[clean.name]["changed"] == 0
    # The host fails at gpu_wait itself (one task per host), with its message; the greppable line says "not free".
    [line] = [l for l in out.splitlines() if l.startswith("fatal: [%s]" % dirty.name)]
    assert "GPU 1: 3000 MiB used" in line and "PID %d" % holder in line
    assert "check_gpus %s: not free: GPU 1: 3000 MiB used" % dirty.name in out, out
    assert "%s: GPUs free (2 checked)" % clean.name in out
    assert alive(dirty, holder)
    # The role's own summary, as a caller of the role keeps it (reset_gpus_summary true): gpu_kill's lines on each host
    # whose run it finished (tasks/summary.yml).
    rc, out, recap = playbook(inventory, PLAYBOOK, "-e", json.dumps({"reset_gpus_summary": True}))
    assert rc == 0, out
    shown = out.split("TASK [gpuops.nvidia.reset_gpus : Show gpu_kill's summary of the reset]")[1].split("TASK [")[0]
    assert "ok: [%s]" % clean.name in shown and "signalled 0 process(es)" in shown, out
    assert "ok: [%s]" % dirty.name in shown and "signalled 1 process(es)" in shown, out
    rc, out, recap = playbook(inventory, check)
    assert rc == 0 and recap[dirty.name]["failed"] == 0, out


def test_reports_for_pipelines_and_progress_while_waiting(simnode, tmp_path):
    import json

    node = simnode(gpus=2, release_latency=0.1, stray_mib={1: 5000})
    holder = start_holder(node, [0], mib=2000)
    inventory = inventory_file(tmp_path, node)
    reports, textfile = tmp_path / "reports", tmp_path / "gpuops_nvidia.prom"
    reports.mkdir()
    extra = json.dumps(
        {
            "reset_gpus_report_dir": str(reports),
            "reset_gpus_textfile": str(textfile),
            "reset_gpus_timeout": 4,
            "reset_gpus_progress_interval": 0.4,
        }
    )
    rc, out, recap = playbook(inventory, PLAYBOOK, "-e", extra)
    # GPU 1 keeps 5000 MiB that no process explains: the wait reports progress, then fails with the summary.
    assert rc != 0 and recap[node.name]["failed"] == 1, out
    # gpu_wait's slices of 0.4 s within the 3.6 s left, each module run's start (0.3-1.5 s, loaded) counted on the
    # controller's clock: at least two slices, so a line of its own between them.
    assert out.count("still waiting after") >= 1 and "GPU 1 5000 MiB used, held by no selected process" in out, out
    # After gpu_kill's slice of 0.4 s: the rest that gpu_wait's own lines count within.
    assert re.search(
        r"still held after 0 s of 4 s: GPU 1 5000 MiB used, [^\n]*; waiting up to 3\.[56]\d* s more", out
    ), out
    # The whole wait: 4 s, and at most one module run's start past it.
    assert re.search(r"FAILED: not released after [45]\.[0-9] s: GPU 1: 5000 MiB used", out) and not alive(
        node, holder
    ), out
    report = json.loads((reports / ("%s.json" % node.name)).read_text())
    assert report["outcome"] == "failed" and report["host"] == node.name and not report["check_mode"]
    assert [p["pid"] for p in report["signalled"]] == [holder]
    assert [g["memory_used_mib"] for g in report["gpus_before"]] == [2000, 5000]
    assert [g["memory_used_mib"] for g in report["gpus_after"]] == [0, 5000]
    metrics = textfile.read_text()
    assert "gpuops_nvidia_reset_success 0\n" in metrics and "gpuops_nvidia_reset_signalled_processes 1\n" in metrics
    assert re.search(
        r'gpuops_nvidia_gpu_unexplained_memory_bytes\{gpu="1",uuid="GPU-[0-9a-f-]+"\} 5242880000\n', metrics
    )
    assert re.search(r'gpuops_nvidia_gpu_holders\{gpu="0",uuid="GPU-[0-9a-f-]+"\} 0\n', metrics)

    node.set(stray_mib=None)
    rc, out, recap = playbook(inventory, PLAYBOOK, "-e", extra)
    assert rc == 0 and recap[node.name]["changed"] == 0 and "still waiting" not in out, out
    assert json.loads((reports / ("%s.json" % node.name)).read_text())["outcome"] == "released"
    assert "gpuops_nvidia_reset_success 1\n" in textfile.read_text()
    rc, out, recap = playbook(inventory, PLAYBOOK, "--check", "-e", extra)
    assert rc == 0 and json.loads((reports / ("%s.json" % node.name)).read_text())["outcome"] == "check"


def test_gpu_zero_and_text_selections_select_exactly_those_gpus(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.1)
    on0, on1 = start_holder(node, [0], mib=500), start_holder(node, [1], mib=600)
    inventory = inventory_file(tmp_path, node)
    rc, out, recap = playbook(inventory, PLAYBOOK, "-e", '{"reset_gpus_gpus": 0}')
    assert rc == 0 and not alive(node, on0) and alive(node, on1), out
    assert "GPU 0 NVIDIA H100 80GB HBM3: 500 -> 0 MiB used" in out and "GPU 1 NVIDIA" not in out
    rc, out, recap = playbook(inventory, PLAYBOOK, "-e", "reset_gpus_gpus=1")
    assert rc == 0 and not alive(node, on1), out


def test_negative_time_fails_before_anything_is_signalled(simnode, tmp_path):
    node = simnode(gpus=1)
    holder = start_holder(node, [0], mib=500)
    rc, out, recap = playbook(inventory_file(tmp_path, node), PLAYBOOK, "-e", "reset_gpus_timeout=-5")
    assert rc != 0 and "nothing was signalled" in out and alive(node, holder), out


def test_a_time_beyond_its_bound_is_refused_by_name_at_once(simnode, tmp_path):
    """Issue 33 item 11: reset_gpus_grace_period: 1e308 was accepted, and the reset of a holder that ignores SIGTERM
    then printed nothing for minutes. Every time the role, check_gpus and the modules take has a bound."""
    node = simnode(gpus=1)
    holder = start_holder(node, [0], mib=500, mode="ignore-term")
    inventory = inventory_file(tmp_path, node)
    started = time.monotonic()
    rc, out, _recap = playbook(inventory, PLAYBOOK, "-e", '{"reset_gpus_grace_period": 1e308}')
    assert rc != 0 and time.monotonic() - started < 60, out
    assert "nothing was signalled: invalid value: reset_gpus_grace_period=1e+308 (must be at most 3600 seconds)" in out
    rc, out, _recap = playbook(inventory, REPO / "playbooks" / "check_gpus.yml", "-e", '{"check_gpus_wait": 1e308}')
    assert rc != 0 and "check_gpus_wait=1e+308 (must be at most 3600 seconds)" in out, out
    assert alive(node, holder)


def test_lost_gpu_is_never_reported_free(simnode, tmp_path):
    node = simnode(gpus=2, lost=[1])
    rc, out, recap = playbook(inventory_file(tmp_path, node), REPO / "playbooks" / "check_gpus.yml")
    assert rc != 0 and "NVML answers GPU 1 with an error" in out and "GPUs free" not in out, out
    assert "Xid" in out and "nvidia-smi --gpu-reset -i 1" in out, out


def test_a_process_holding_a_lost_gpu_is_named_and_ended(simnode, tmp_path):
    """NVML answers GPU 1 with NVML_ERROR_GPU_IS_LOST; the kernel module still lists it (its minor): the CUDA process
    with its device file is its holder (memory unknown), named by the check, by the reset in check mode (which fails:
    the GPU stays lost whatever is ended) and ended by the reset, and the GPU still needs the reset that the message
    advises."""
    node = simnode(gpus=2, lost=[1])
    holder = start_holder(node, [1], mib=100)
    inventory = inventory_file(tmp_path, node)
    rc, out, recap = playbook(inventory, REPO / "playbooks" / "check_gpus.yml", "-e", "check_gpus_wait=0")
    assert rc != 0 and "held by PID %d" % holder in out and "GPUs free" not in out, out
    assert (
        "end PID %d, which still holds it (gpuops.nvidia.gpu_kill), then reset it (nvidia-smi --gpu-reset -i 1)"
        % holder
        in out
    ), out
    # Check mode signals nothing and says that the reset would fail whatever it ended, as the real run then does.
    rc, out, recap = playbook(inventory, PLAYBOOK, "--check")
    assert rc != 0 and alive(node, holder) and recap[node.name]["failed"] == 1, out
    assert "FAILED (check mode): would signal 1 process(es): %d" % holder in out, out
    assert "a real run would fail whatever it ended: not free: GPU 1: error GPU is lost" in out, out
    assert "1 host(s): 0 ok, 1 failed or unreachable (%s)" % node.name in out, out
    rc, out, recap = playbook(inventory, PLAYBOOK, "-e", "reset_gpus_timeout=1")
    assert rc != 0 and not alive(node, holder), out
    assert "GPU is lost" in out and "nvidia-smi --gpu-reset -i 1" in out, out


def test_a_lost_gpu_does_not_cut_short_the_wait_for_the_others(simnode, tmp_path):
    """GPU 1 fell off the bus; GPU 0's holder is ended and its memory released 0.5 s later. The reset waits for GPU 0
    (found released, not "memory that no process explains" with a GPU reset to do) and fails for GPU 1 alone."""
    node = simnode(gpus=2, lost=[1], release_latency=0.5)
    holder = start_holder(node, [0], mib=3000)
    rc, out, recap = playbook(inventory_file(tmp_path, node), PLAYBOOK)
    assert rc != 0 and recap[node.name]["failed"] == 1 and not alive(node, holder), out
    assert "GPU 0 NVIDIA H100 80GB HBM3: 3000 -> 0 MiB used, holders 1 -> 0" in out, out
    assert "GPU 1: error GPU is lost" in out and "nvidia-smi --gpu-reset -i 1" in out, out
    assert "GPU 0: 3000 MiB used" not in out and "nvidia-smi --gpu-reset -i 0" not in out, out


# Issue 11: values that used to spin forever, widen the selection to everything, or be read as another GPU.
BAD_VALUES = [
    ("gpuops.nvidia.gpu_kill", {"grace_period": "nan"}, "grace_period=nan (must be a finite number)"),
    ("gpuops.nvidia.gpu_kill", {"kill_wait": "inf"}, "kill_wait=inf (must be a finite number)"),
    ("gpuops.nvidia.gpu_kill", {"driver_timeout": "nan"}, "driver_timeout=nan"),
    ("gpuops.nvidia.gpu_kill", {"driver_timeout": 0}, "driver_timeout=0.0 (must be greater than 0)"),
    ("gpuops.nvidia.gpu_kill", {"grace_period": 1e308}, "grace_period=1e+308 (must be at most 3600 seconds)"),
    ("gpuops.nvidia.gpu_kill", {"gpus": []}, "gpus is empty"),
    ("gpuops.nvidia.gpu_kill", {"pids": []}, "pids is empty"),
    ("gpuops.nvidia.gpu_kill", {"users": []}, "users is empty"),
    ("gpuops.nvidia.gpu_kill", {"match": ""}, "match is empty"),
    ("gpuops.nvidia.gpu_kill", {"users": ["no-such-user-x"]}, "no such user on this host: no-such-user-x"),
    ("gpuops.nvidia.gpu_kill", {"pids": [0]}, "pids must be positive"),
    ("gpuops.nvidia.gpu_kill", {"pids": [-4]}, "pids must be positive"),
    ("gpuops.nvidia.gpu_kill", {"gpus": ["\u0661"]}, "unknown GPU"),
    ("gpuops.nvidia.gpu_wait", {"timeout": "inf"}, "timeout=inf (must be a finite number)"),
    ("gpuops.nvidia.gpu_wait", {"poll_interval": "nan"}, "poll_interval=nan"),
    ("gpuops.nvidia.gpu_wait", {"timeout": 1e308}, "timeout=1e+308 (must be at most 3600 seconds)"),
    ("gpuops.nvidia.gpu_wait", {"gpus": []}, "gpus is empty"),
    ("gpuops.nvidia.gpu_facts", {"driver_timeout": "inf"}, "driver_timeout=inf"),
]


def test_every_bad_value_is_refused_before_any_signal(simnode, tmp_path):
    """Each bad value in a task of its own, all in one play (one ansible-playbook run): each task fails with its
    message, no traceback, and nothing is signalled."""
    node = simnode(gpus=2)
    holders = [start_holder(node, [0], mib=512), start_holder(node, [1], mib=512)]
    inventory = inventory_file(tmp_path, node)
    results = tmp_path / "results.json"
    tasks = [
        {"name": "case %d" % number, name: args, "register": "case%d" % number, "ignore_errors": True}
        for number, (name, args, _message) in enumerate(BAD_VALUES)
    ]
    registered = ", ".join("case%d" % number for number in range(len(BAD_VALUES)))
    tasks.append(
        {
            "name": "the results",
            "ansible.builtin.copy": {"content": "{{ [%s] | to_json }}" % registered, "dest": str(results)},
            "delegate_to": "localhost",
        }
    )
    bad_values = tmp_path / "bad_values.yml"
    bad_values.write_text(json.dumps([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    started = time.monotonic()
    rc, out, _recap = playbook(inventory, bad_values, timeout=300)
    assert rc == 0 and time.monotonic() - started < 30 * len(BAD_VALUES), out
    for (name, args, message), result in zip(BAD_VALUES, json.loads(results.read_text())):
        assert result.get("failed") and message in result["msg"], (name, args, result)
        assert "Traceback" not in str(result), (name, args, result)
    assert all(alive(node, pid) for pid in holders)
    assert gpu_memory(node) == [(512, [holders[0]]), (512, [holders[1]])]


def test_two_gpu_kill_runs_at_once_never_both_end_the_same_holders(simnode, tmp_path):
    """Issue 33 item 10: two resets of one host at once both reported `signalled 8`, one of them "SIGTERM, exited
    after 1.96 s" for holders the other run had SIGKILLed. A run holds the host's lock from its first look to its
    last; the second waits for it, looks again and reports only what it ended itself (nothing, here)."""
    node = simnode(gpus=8, release_latency=0.1)
    # Holders that ignore SIGTERM keep the first run busy for its whole grace period, so the runs overlap.
    holders = sorted(start_holder(node, [index], mib=1000, mode="ignore-term") for index in range(8))
    inventory = inventory_file(tmp_path, node)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(module, inventory, "gpuops.nvidia.gpu_kill", {"grace_period": 4}) for _run in range(2)]
        results = [only(run.result()) for run in runs]
    assert all(status in ("SUCCESS", "CHANGED") for status, _result in results), results
    ended = sorted(([p["pid"] for p in result["signalled"]] for _status, result in results), key=len)
    assert ended == [[], holders], results
    first, second = sorted((result for _status, result in results), key=lambda result: len(result["signalled"]))[::-1]
    assert all(p["signals"] == ["SIGTERM", "SIGKILL"] for p in first["signalled"]), first["signalled"]
    assert second["changed"] is False and second["lock_waited_s"] > 1.0, second
    assert re.match(r"waited [0-9.]+ s for another gpu_kill run on this host \(PID [0-9]+ \(", second["msg"]), second
    assert "this run reports only what it ended itself; signalled 0 process(es)" in second["msg"], second
    assert not any(alive(node, pid) for pid in holders)


def test_a_daemon_s_name_protects_nothing_and_a_daemon_s_memory_counts(simnode, tmp_path):
    """Issue 33 item 2: a process titled nvidia-persistenced (`exec -a`, setproctitle) with 40000 MiB on a GPU was
    left alone as a "protected GPU daemon" and check_gpus passed. A daemon is what it runs: the impostor is ended
    like any holder. A real one (its executable) is left alone, but its memory keeps the GPU from being free: the
    reset says so at once, with the next step, and check_gpus fails until the operator leaves it out knowingly."""
    node = simnode(gpus=2, release_latency=0.2)
    impostor = start_cuda_process(node, [0], mib=40000, visible=[0], title="nvidia-persistenced")
    daemon = start_cuda_process(node, [1], mib=3000, visible=[1], executable=daemon_executable(node, "nv-hostengine"))
    inventory = inventory_file(tmp_path, node)
    check = REPO / "playbooks" / "check_gpus.yml"

    rc, out, _recap = playbook(inventory, check)
    assert rc != 0 and "not free" in out and "PID %d" % impostor in out, out

    started = time.monotonic()
    rc, out, _recap = playbook(inventory, PLAYBOOK, "-e", '{"reset_gpus_timeout": 60}')
    assert rc != 0 and time.monotonic() - started < 45, out  # no wait for what nothing will end
    assert not alive(node, impostor) and alive(node, daemon), out
    assert re.search(r"PID %d \S+ \(GPUs 0\): SIGTERM, exited after" % impostor, out), out
    assert "left alone PID %d nv-hostengine: protected GPU daemon (nv-hostengine)" % daemon in out, out
    assert "MiB of it by protected holders, which counts" in out and "include_protected=true" in out, out

    rc, out, _recap = playbook(inventory, check, "-e", '{"check_gpus_gpus": [0]}')
    assert rc == 0, out
    rc, out, _recap = playbook(inventory, check)
    assert rc != 0 and "PID %d (nv-hostengine" % daemon in out, out
    rc, out, _recap = playbook(inventory, check, "-e", '{"check_gpus_exclude": ["nv-hostengine"]}')
    assert rc == 0, out
    assert alive(node, daemon)
