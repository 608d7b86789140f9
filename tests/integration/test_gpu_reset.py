"""The guarded GPU reset (issue 44, docs/recovery.md) end to end: reset_gpus.yml -e reset_gpus_gpu_reset=true on
three simulated hosts at once, in check mode and then for real. A leaked context (memory that only a reset frees) on
an NVLink pair comes back to idle with persistence mode and the nvidia-persistenced and DCGM units as they were; a
device user that is no GPU daemon refuses the reset and nothing changes; a reset the driver refuses ("In use by
another client", exit 255) undoes every step and names the next one."""

from __future__ import annotations

import json
import re

import pytest

from ansible_run import REPO, playbook
from nodetools import gpu_memory, start_cuda_init, start_gpu_daemon_unit, unit_main_pid
from simnode import inventory_file

PLAYBOOK = REPO / "playbooks" / "reset_gpus.yml"
UNITS = (
    ("nvidia-persistenced.service", "nvidia-persistenced", "persistenced"),
    ("nvidia-dcgm.service", "nv-hostengine", "nvml"),
)


def host(simnode, gpus, **knobs):
    """A node with the GPU daemons' stand-ins running in their units; its unit PIDs."""
    node = simnode(gpus=gpus, release_latency=0.1, nvidia_smi=True)
    if node.info.get("cgroup") is None:
        pytest.skip("this machine gives simulated nodes no owner cgroups: %s" % node.info.get("cgroup_unsupported"))
    node.set(**knobs)
    return node, {unit: start_gpu_daemon_unit(node, unit, name, kind) for unit, name, kind in UNITS}


def conf(node, key):
    return dict(line.split("=", 1) for line in (node.run_dir / "node.conf").read_text().splitlines()).get(key)


def test_a_leaked_context_is_freed_by_the_guarded_reset_and_every_daemon_and_setting_comes_back(simnode, tmp_path):
    leaked, leaked_units = host(simnode, 3, stray_mib="0:30000", nvlink="0+1")
    refused, refused_units = host(simnode, 2, stray_mib="1:5000")
    user = start_cuda_init(refused, visible=[1])
    driver_says_no, no_units = host(simnode, 1, stray_mib="0:2000", kernel_clients="0")
    inventory = inventory_file(tmp_path, leaked, refused, driver_says_no)
    reports = tmp_path / "reports"
    extra = json.dumps(
        {
            "reset_gpus_gpu_reset": True,
            "reset_gpus_gpu_reset_own_pid_namespace": True,
            "reset_gpus_timeout": 1,
            "reset_gpus_report_dir": str(reports),
        }
    )

    def report(node):
        return json.loads((reports / ("%s.json" % node.name)).read_text())

    rc, out, recap = playbook(inventory, PLAYBOOK, "--check", "-e", extra)
    assert recap[leaked.name]["failed"] == 0 and recap[leaked.name]["changed"] >= 1, out
    assert "would: stop nvidia-persistenced.service" in out and "reset GPU 0, 1; turn persistence mode on" in out
    assert gpu_memory(leaked)[0][0] == 30000 and conf(leaked, "persistence") is None
    assert {unit: unit_main_pid(leaked, unit) for unit in leaked_units} == leaked_units
    # The summary and the report say what the GPU reset would do; the closing line names the host.
    assert report(leaked)["outcome"] == "check", report(leaked)
    assert report(leaked)["message"].endswith("; GPU 0, 1 would be reset (reset_gpus_gpu_reset)"), report(leaked)
    would = re.search(r"; GPUs would be reset on \d+ \(([^)]*)\)", out)
    assert would and leaked.name in would.group(1).split(", ") and refused.name not in would.group(1), out
    # Check mode names the GPUs that ending the holders would not free, in the report and the closing line.
    assert "; ending the holders would not free these GPUs" in report(leaked)["message"], report(leaked)
    stay = re.search(r"; GPUs that ending the holders would not free on \d+ \(([^)]*)\)", out)
    assert stay and set(stay.group(1).split(", ")) == {leaked.name, refused.name, driver_says_no.name}, out

    rc, out, recap = playbook(inventory, PLAYBOOK, "-e", extra)
    assert rc != 0 and recap[leaked.name]["failed"] == 0 and recap[leaked.name]["changed"] == 1, out
    assert "reset GPU 0, 1: stop nvidia-persistenced.service" in out, out
    assert [used for used, _pids in gpu_memory(leaked)] == [0, 0, 0]
    # The summary, the report and the closing line come after the GPU reset and say what it did: no "FAILED" for a
    # host whose GPUs it freed (they were not released by the wait before it).
    assert report(leaked)["outcome"] == "released" and "phase" not in report(leaked), report(leaked)
    assert report(leaked)["message"].endswith("; GPU 0, 1 were reset (reset_gpus_gpu_reset)"), report(leaked)
    assert [gpu["memory_used_mib"] for gpu in report(leaked)["gpus_after"]] == [0, 0, 0], report(leaked)
    assert "GPUs reset on 1 (%s)" % leaked.name in out, out
    assert report(refused)["outcome"] == "failed" and report(refused)["phase"] == "free", report(refused)
    assert "gpu_reset refused, nothing was changed: device_users: PID %d" % user in report(refused)["message"]
    assert (
        report(driver_says_no)["outcome"] == "failed" and "next: reboot the node" in report(driver_says_no)["message"]
    )
    # Persistence mode was turned off for the reset and on again; each daemon was stopped and started again.
    assert conf(leaked, "persistence") == "0:1,1:1"
    for unit, pid in leaked_units.items():
        assert unit_main_pid(leaked, unit) not in (0, pid), unit

    assert recap[refused.name]["failed"] == 1 and recap[refused.name]["changed"] == 0, out
    assert "gpu_reset refused, nothing was changed: device_users: PID %d" % user in out, out
    assert gpu_memory(refused)[1][0] == 5000 and conf(refused, "persistence") is None
    assert {unit: unit_main_pid(refused, unit) for unit in refused_units} == refused_units

    assert recap[driver_says_no.name]["failed"] == 1, out
    assert "the driver says the GPU is in use by another client that no process here shows" in out, out
    assert "every step done before was undone" in out and "next: reboot the node" in out, out
    assert "scontrol update nodename=" in out and gpu_memory(driver_says_no)[0][0] == 2000
    assert conf(driver_says_no, "persistence") == "0:1"
    assert all(unit_main_pid(driver_says_no, unit) not in (0, pid) for unit, pid in no_units.items())

    # The GPU reset's phase alone: gpu_kill does not run (its tag is not asked for); the GPU reset looks again itself,
    # and the look after it passes the clean host (before, the role failed on gpu_kill's undefined result).
    rc, out, recap = playbook(inventory, PLAYBOOK, "--tags", "reset_gpus_gpu_reset", "-l", leaked.name, "-e", extra)
    assert rc == 0 and recap[leaked.name]["failed"] == 0 and "is undefined" not in out, out
    assert "Fail when the GPUs are still not released after the GPU reset" in out, out
    # Reports and the GPU reset skipped by tag, the GPU reset on: the GPUs still held fail the host all the same
    # (before, skipping the report's tag skipped the rest of the wait and the failure with it, and the host passed).
    skipped = "reset_gpus_report,reset_gpus_gpu_reset"
    rc, out, recap = playbook(inventory, PLAYBOOK, "--skip-tags", skipped, "-l", refused.name, "-e", extra)
    assert recap[refused.name]["failed"] == 1 and "not released after" in out and "gpu_reset refused" not in out, out
