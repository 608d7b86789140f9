"""tests/gpu/check.py (the acceptance check for real GPUs) run end to end on simulated nodes.

With default knobs the simulator must show no difference from what the check expects of it
(report.SIMULATOR); with other knobs the check must report exactly those differences.
"""

from __future__ import annotations

import json

from ansible_run import REPO
from nodetools import processes
from simnode import VENV_PYTHON

CHECK = REPO / "tests" / "gpu" / "check.py"


def run_check(node, out_dir, *args, timeout=400):
    proc = node.exec(str(VENV_PYTHON), str(CHECK), "--backend", "sim", "--out", str(out_dir), *args, timeout=timeout, check=False)
    result = json.loads((out_dir / "result.json").read_text())
    left = [pid for pid, (_ppid, state, _comm, cmdline) in processes(node).items()
            if result["host"]["marker"] in cmdline and state != "Z"]
    assert left == [], "processes of the check left running"
    return proc, result


def test_check_passes_on_a_default_simulated_node_and_finds_no_difference(simnode, tmp_path):
    node = simnode(gpus=2, minors=[3, 5])
    proc, result = run_check(node, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["status"] == "ok" and result["leaked"] == []
    scenarios = result["scenarios"]
    assert {name: s["status"] for name, s in scenarios.items()} == dict.fromkeys(
        ["idle", "vllm_tree", "inherited", "sigterm_ignored", "nested_pidns", "release_latency"], "ok")
    assert result["differences"] == [] and len(result["comparisons"]) == len(result["observations"])
    assert result["gpu"] == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": result["gpu"]["uuid"], "minor": 3,
                             "all_minors": [3, 5], "pci_bus_id": "00000000:18:00.0", "memory_total_mib": 81559,
                             "persistence_mode": 1, "compute_mode": None, "gpu_count": 2}

    tree = scenarios["vllm_tree"]
    assert {name: s["signals"] for name, s in tree["gpu_kill"]["signalled"].items()} == {
        "vllm.engine.tp0": ["SIGTERM"], "vllm.engine.tp1": ["SIGTERM"]}
    assert tree["gpu_kill"]["not_holding"] == ["vllm.engine"] and tree["gpu_wait"]["released"]
    assert tree["memory"]["freed_mib"] == 2048
    assert scenarios["sigterm_ignored"]["gpu_kill"]["signalled"]["stubborn"]["signals"] == ["SIGTERM", "SIGKILL"]
    inherited = scenarios["inherited"]
    assert inherited["after_parent_exit"]["memory_kept"] and inherited["after_parent_exit"]["child"]["seen_in"] == ["fd"]
    assert inherited["memory"]["freed_mib"] == 1024
    nested = scenarios["nested_pidns"]
    assert nested["driver_pid"] == "host" and len(nested["nspid"]) == 2 and nested["holders"]["nested"]["ns_pid"] == 2
    assert nested["playbook"]["rc"] == 0 and nested["playbook"]["recap"]["changed"] == 1
    for gib, size in scenarios["release_latency"]["sizes"].items():
        assert size["allocated_mib"] == size["listed_mib"] == int(gib) * 1024
        assert 0.5 <= size["seconds"]["released"] < 0.75 and size["seconds"]["exited"] < 0.25
    assert result["suggested_sim_knobs"]["reserved_mib"] == 529
    assert "| 0 / 529 | 0 | 5/6 · 6/6 | not listed / kept |" in (tmp_path / "result.md").read_text()


def test_check_reports_the_knobs_that_differ(simnode, tmp_path):
    node = simnode(gpus=1, reserved_mib=1012, idle_used_mib=40, release_latency=1.5)
    proc, result = run_check(node, tmp_path, "--only", "idle,release_latency", "--sizes-gib", "1,200")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(row["item"] for row in result["differences"]) == ["idle_used_mib", "release_s_1gib", "reserved_mib"]
    assert result["scenarios"]["release_latency"]["sizes"]["200"]["status"] == "skipped"
    knobs = result["suggested_sim_knobs"]
    assert knobs["reserved_mib"] == 1012 and knobs["idle_used_mib"] == 40 and 1.5 <= knobs["release_latency"] < 1.75
