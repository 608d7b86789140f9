"""tests/gpu/check.py (the acceptance check for real GPUs) run end to end on simulated nodes.

With default knobs the simulator must show no difference from what the check expects of it
(report.SIMULATOR); with other knobs the check must report exactly those differences. The
attribution scenario's four processes (a CUDA context, an NVML-only client, an inheriting child
after its parent's exit, CUDA initialized without a context) are the simulator's models of them
(tests/sim/README.md, "Device files per process kind"), judged by gpu_facts as docs/attribution.md says.
"""

from __future__ import annotations

import json

import pytest

from ansible_run import REPO
from nodetools import processes
from simnode import VENV_PYTHON

CHECK = REPO / "tests" / "gpu" / "check.py"
RUN_SH = REPO / "tests" / "gpu" / "run.sh"


def run_check(node, out_dir, *args, timeout=400):
    proc = node.exec(
        str(VENV_PYTHON), str(CHECK), "--backend", "sim", "--out", str(out_dir), *args, timeout=timeout, check=False
    )
    result = json.loads((out_dir / "result.json").read_text())
    left = [
        pid
        for pid, (_ppid, state, _comm, cmdline) in processes(node).items()
        if result["host"]["marker"] in cmdline and state != "Z"
    ]
    assert left == [], "processes of the check left running"
    return proc, result


@pytest.mark.slow
def test_check_passes_on_a_default_simulated_node_and_finds_no_difference(simnode, tmp_path):
    node = simnode(gpus=2, minors=[3, 5])
    proc, result = run_check(node, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["status"] == "ok" and result["leaked"] == []
    scenarios = result["scenarios"]
    assert {name: s["status"] for name, s in scenarios.items()} == dict.fromkeys(
        ["idle", "attribution", "vllm_tree", "inherited", "sigterm_ignored", "nested_pidns", "release_latency"], "ok"
    )
    assert result["differences"] == [] and len(result["comparisons"]) == len(result["observations"])
    assert result["gpu"] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": result["gpu"]["uuid"],
        "minor": 3,
        "all_minors": [3, 5],
        "pci_bus_id": "00000000:18:00.0",
        "memory_total_mib": 81559,
        "persistence_mode": 1,
        "compute_mode": 0,
        "gpu_count": 2,
        "mig_mode": {"current": 0, "pending": 0, "error": None},
    }

    attribution = scenarios["attribution"]
    assert all(check["ok"] for check in attribution["checks"]) and len(attribution["checks"]) == 12
    explained, unexplained = attribution["readings"]["explained"], attribution["readings"]["unexplained"]
    pids = attribution["pids"]
    context = explained["context"]
    assert context["record"]["driver"] == {"0": {"lists": ["compute"], "used_mib": 1024}}
    assert context["record"]["device_fds"] == ["/dev/nvidia-uvm", "/dev/nvidia3", "/dev/nvidiactl"]
    assert context["facts"]["role"] == "holder" and context["facts"]["attribution"] == {"0": "driver"}
    nvml = explained["nvml_only"]  # NVML opens every GPU's file, GPU 1's (minor 5) too
    assert (
        nvml["record"]["device_fds"] == ["/dev/nvidia3", "/dev/nvidia5", "/dev/nvidiactl"]
        and nvml["record"]["driver"] == {}
    )
    assert (
        nvml["facts"]["role"] == "device_user"
        and nvml["facts"]["kind"] == "nvml"
        and nvml["facts"]["device_gpus"] == [0, 1]
    )
    cuinit = explained["cuda_init"]
    assert cuinit["record"]["device_fds"] == context["record"]["device_fds"] and cuinit["record"]["driver"] == {}
    assert cuinit["facts"]["role"] == "device_user" and cuinit["facts"]["kind"] == "cuda"
    child = unexplained["inherited_child"]
    assert child["record"]["driver"] == {} and child["facts"]["attribution"] == {"0": "device_file"}
    assert attribution["memory"]["explained"]["unexplained_mib"] == 0
    # The driver keeps listing the dead parent with the memory (the real driver's behaviour, tests/sim/README.md).
    parent = attribution["inherit_parent"]
    assert attribution["memory"]["unexplained"]["unexplained_mib"] == 0 and parent["listed_after_exit"]
    assert attribution["memory"]["unexplained"]["exited"] == [parent["pid"]] and parent["child_lists"] == []
    assert parent["child_device_files"] == ["/dev/nvidia-uvm", "/dev/nvidia3", "/dev/nvidiactl"]
    # While the dead parent's context is held, the cuInit-only process is a device-file holder too.
    assert unexplained["cuda_init"]["facts"]["attribution"] == {"0": "device_file"}
    assert unexplained["nvml_only"]["facts"]["role"] == "device_user" and unexplained["context"]["facts"][
        "attribution"
    ] == {"0": "driver"}
    assert sorted(pids) == ["context", "cuda_init", "inherited_child", "nvml_only"] and len(set(pids.values())) == 4
    assert all(not r["record"]["device_mappings"] for reading in (explained, unexplained) for r in reading.values())

    tree = scenarios["vllm_tree"]
    assert {name: s["signals"] for name, s in tree["gpu_kill"]["signalled"].items()} == {
        "vllm.engine.tp0": ["SIGTERM"],
        "vllm.engine.tp1": ["SIGTERM"],
    }
    assert tree["gpu_kill"]["not_holding"] == ["vllm.engine"] and tree["gpu_wait"]["released"]
    assert tree["memory"]["freed_mib"] == 2048
    assert scenarios["sigterm_ignored"]["gpu_kill"]["signalled"]["stubborn"]["signals"] == ["SIGTERM", "SIGKILL"]
    inherited = scenarios["inherited"]
    assert inherited["after_parent_exit"]["memory_kept"] and inherited["after_parent_exit"]["child"]["seen_in"] == [
        "fd"
    ]
    assert inherited["memory"]["freed_mib"] == 1024
    nested = scenarios["nested_pidns"]
    assert nested["driver_pid"] == "host" and len(nested["nspid"]) == 2 and nested["holders"]["nested"]["ns_pid"] == 2
    # Seen from inside its namespace, a translating driver lists the holder under its namespace PID.
    assert nested["driver_pid_in_namespace"] == "namespace", nested["lists_from_namespace"]
    assert nested["playbook"]["rc"] == 0 and nested["playbook"]["recap"]["changed"] == 1
    for gib, size in scenarios["release_latency"]["sizes"].items():
        assert size["allocated_mib"] == size["listed_mib"] == int(gib) * 1024
        assert 0.5 <= size["seconds"]["released"] < 0.75 and size["seconds"]["exited"] < 0.25
    assert result["suggested_sim_knobs"]["reserved_mib"] == 529
    markdown = (tmp_path / "result.md").read_text()
    assert "| 0 / 529 | 0 | 5/6 · 6/6 | not listed / kept | 4/4 |" in markdown
    assert ": MIG mode: current disabled, pending disabled (nvmlDeviceGetMigMode)" in markdown
    assert (
        "| cuda_init | CUDA initialized without a context (cuInit only) | nvidia-uvm, nvidiactl + GPU 0 | none | "
        "not listed | device user (cuda) | device user (cuda) | a device user (cuda), never a holder | yes |"
    ) in markdown
    assert (
        "| nvml_only | an NVML-only client (pynvml nvmlInit, stays initialized) | nvidiactl + GPUs 0,1 | none | "
        "not listed | device user (nvml) | device user (nvml) | a device user (nvml), never a holder | yes |"
    ) in markdown
    assert (
        "- in the unexplained-memory reading, cuda_init: gpu_facts holder (GPU 0: device_file), "
        "rule holder (GPU 0: device_file)"
    ) in markdown


def test_check_reports_the_knobs_that_differ(simnode, tmp_path):
    node = simnode(gpus=1, reserved_mib=1012, idle_used_mib=40, release_latency=1.5)
    proc, result = run_check(node, tmp_path, "--only", "idle,release_latency", "--sizes-gib", "1,200")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(row["item"] for row in result["differences"]) == ["idle_used_mib", "release_s_1gib", "reserved_mib"]
    assert result["scenarios"]["release_latency"]["sizes"]["200"]["status"] == "skipped"
    knobs = result["suggested_sim_knobs"]
    # The knob is "released" minus "exited", each the first poll (every 10 ms) that saw it: where the poll that sees
    # the exit comes late (2 cores, other tests running) the difference falls short of the latency by up to a poll
    # round; 1.491 s was seen once in CI.
    assert knobs["reserved_mib"] == 1012 and knobs["idle_used_mib"] == 40 and 1.45 <= knobs["release_latency"] < 1.75


def test_mig_mode_is_recorded_as_the_driver_reports_it(simnode, tmp_path):
    node = simnode(gpus=1, mig="0")
    node.set(mig_pending="0:0")  # MIG on, a change to off pending (a GPU reset would apply it)
    proc, result = run_check(node, tmp_path, "--only", "idle")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["gpu"]["mig_mode"] == {"current": 1, "pending": 0, "error": None}
    assert (
        ": MIG mode: current enabled, pending disabled (nvmlDeviceGetMigMode)" in (tmp_path / "result.md").read_text()
    )


def test_run_sh_skips_a_host_without_the_nvidia_driver(simnode, tmp_path):
    node = simnode(gpus=1, no_driver=True)
    proc = node.exec(str(RUN_SH), "--out", str(tmp_path), timeout=60, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.startswith("skipped: no NVIDIA GPU (libnvidia-ml.so.1 cannot be loaded")
    assert not (tmp_path / "result.json").exists()
