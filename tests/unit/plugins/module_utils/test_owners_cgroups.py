# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_owners: every cgroup path form of docs/owners.md, pod names, systemctl, agents, labels, selection."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners

CID = "4f1c3a9e0b7d2c6e8a5f1b3d9c7e2a4b6d8f0e1c3a5b7d9f2e4c6a8b0d1f3e5a"
CID2 = "4f1c3a9e0b7d" + "0" * 52
UID = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
UID_ = UID.replace("-", "_")
STATIC_UID = "6d2d5f3c1b0a49e88f7e6d5c4b3a2918"  # static pods: a 32-hex config hash


def v2(path):
    return "0::%s\n" % path


def v1(systemd_path, other_path=None):
    """A cgroup v1 host: name=systemd carries the unit tree; controllers repeat it unless told."""
    other = systemd_path if other_path is None else other_path
    return "".join(
        "%d:%s:%s\n" % (number, controllers, path)
        for number, controllers, path in (
            (12, "name=systemd", systemd_path),
            (11, "memory", other),
            (10, "cpu,cpuacct", other),
            (9, "freezer", other),
            (8, "devices", other),
            (7, "pids", other),
        )
    )


def hybrid(path):
    return "12:name=systemd:%s\n11:memory:%s\n0::%s\n" % (path, path, path)


def owner(**pieces):
    result = dict.fromkeys(_owners.CGROUP_KEYS)
    result.update(pieces)
    return result


CASES = [
    # systemd units
    ("service", "/system.slice/vllm.service", owner(systemd_unit="vllm.service")),
    ("template instance", "/system.slice/system-vllm.slice/vllm@a.service", owner(systemd_unit="vllm@a.service")),
    ("delegated subtree", "/system.slice/vllm.service/payload", owner(systemd_unit="vllm.service")),
    ("session scope", "/user.slice/user-1000.slice/session-4.scope", owner(systemd_unit="session-4.scope")),
    # A user manager's units lie in user@UID.service, delegated to it: the system manager's unit is user@UID.service.
    (
        "user service",
        "/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service",
        owner(systemd_unit="user@1000.service"),
    ),
    # LXD puts a container beside the system manager's slices; its own systemd's units are not the host's.
    ("lxd container service", "/lxc.payload.c1/system.slice/vllm.service", owner()),
    ("transient scope", "/system.slice/run-r1b2c3.scope", owner(systemd_unit="run-r1b2c3.scope")),
    ("root", "/", owner()),
    ("init scope", "/init.scope", owner(systemd_unit="init.scope")),
    # docker
    (
        "docker systemd",
        "/system.slice/docker-%s.scope" % CID,
        owner(systemd_unit="docker-%s.scope" % CID, container_id=CID, runtime="docker"),
    ),
    ("docker cgroupfs", "/docker/%s" % CID, owner(container_id=CID, runtime="docker")),
    ("docker in docker", "/docker/%s/docker/%s" % (CID2, CID), owner(container_id=CID, runtime="docker")),
    # containerd / nerdctl
    (
        "nerdctl systemd",
        "/system.slice/nerdctl-%s.scope" % CID,
        owner(systemd_unit="nerdctl-%s.scope" % CID, container_id=CID, runtime="containerd"),
    ),
    ("containerd cgroupfs namespace", "/default/%s" % CID, owner(container_id=CID)),
    # podman
    (
        "podman root",
        "/machine.slice/libpod-%s.scope" % CID,
        owner(systemd_unit="libpod-%s.scope" % CID, container_id=CID, runtime="podman"),
    ),
    (
        "podman crun child",
        "/machine.slice/libpod-%s.scope/container" % CID,
        owner(systemd_unit="libpod-%s.scope" % CID, container_id=CID, runtime="podman"),
    ),
    (
        "podman rootless",
        "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-%s.scope" % CID,
        owner(systemd_unit="user@1000.service", container_id=CID, runtime="podman"),
    ),
    (
        "podman conmon",
        "/machine.slice/libpod-conmon-%s.scope" % CID,
        owner(systemd_unit="libpod-conmon-%s.scope" % CID),
    ),
    # podman's cgroupfs manager (containers/common CgroupfsDefaultCgroupParent "/libpod_parent"); conmon beside it
    ("podman cgroupfs", "/libpod_parent/libpod-%s" % CID, owner(container_id=CID, runtime="podman")),
    ("podman cgroupfs conmon", "/libpod_parent/conmon", owner()),
    # quadlet (podman-systemd.unit(5), CgroupsMode=split by default): the payload inside the unit, conmon in runtime
    (
        "quadlet payload",
        "/system.slice/vllm-a.service/libpod-payload-%s" % CID,
        owner(systemd_unit="vllm-a.service", container_id=CID, runtime="podman"),
    ),
    ("quadlet conmon", "/system.slice/vllm-a.service/runtime", owner(systemd_unit="vllm-a.service")),
    # Kubernetes, systemd driver: QoS slices
    (
        "pod burstable containerd",
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope" % (UID_, CID),
        owner(systemd_unit="cri-containerd-%s.scope" % CID, container_id=CID, runtime="containerd", pod_uid=UID),
    ),
    (
        "pod besteffort cri-o",
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice/crio-%s.scope" % (UID_, CID),
        owner(systemd_unit="crio-%s.scope" % CID, container_id=CID, runtime="cri-o", pod_uid=UID),
    ),
    (
        "pod guaranteed docker (cri-dockerd)",
        "/kubepods.slice/kubepods-pod%s.slice/docker-%s.scope" % (UID_, CID),
        owner(systemd_unit="docker-%s.scope" % CID, container_id=CID, runtime="docker", pod_uid=UID),
    ),
    (
        "pod cri-o conmon",
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/crio-conmon-%s.scope" % (UID_, CID),
        owner(systemd_unit="crio-conmon-%s.scope" % CID, pod_uid=UID),
    ),
    (
        "pod crun container child",
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/crio-%s.scope/container" % (UID_, CID),
        owner(systemd_unit="crio-%s.scope" % CID, container_id=CID, runtime="cri-o", pod_uid=UID),
    ),
    (
        "static pod hash uid",
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/"
        "cri-containerd-%s.scope" % (STATIC_UID, CID),
        owner(systemd_unit="cri-containerd-%s.scope" % CID, container_id=CID, runtime="containerd", pod_uid=STATIC_UID),
    ),
    (
        "pod slice only (sandbox)",
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice" % UID_,
        owner(pod_uid=UID),
    ),
    # Kubernetes, cgroupfs driver
    ("pod cgroupfs burstable", "/kubepods/burstable/pod%s/%s" % (UID, CID), owner(container_id=CID, pod_uid=UID)),
    ("pod cgroupfs besteffort", "/kubepods/besteffort/pod%s/%s" % (UID, CID), owner(container_id=CID, pod_uid=UID)),
    ("pod cgroupfs guaranteed", "/kubepods/pod%s/%s" % (UID, CID), owner(container_id=CID, pod_uid=UID)),
    (
        "pod cgroupfs cri-o",
        "/kubepods/burstable/pod%s/crio-%s" % (UID, CID),
        owner(container_id=CID, runtime="cri-o", pod_uid=UID),
    ),
    # Slurm cgroup/v2
    (
        "slurm v2 task",
        "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
        owner(systemd_unit="slurmstepd.scope", slurm_job="4242"),
    ),
    (
        "slurm v2 batch",
        "/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0",
        owner(systemd_unit="slurmstepd.scope", slurm_job="77"),
    ),
    (
        "slurm v2 multiple slurmd",
        "/system.slice/node3_slurmstepd.scope/job_9/step_extern/user/task_special",
        owner(systemd_unit="node3_slurmstepd.scope", slurm_job="9"),
    ),
    (
        "slurm v2 stepd itself",
        "/system.slice/slurmstepd.scope/job_9/step_0/slurm",
        owner(systemd_unit="slurmstepd.scope", slurm_job="9"),
    ),
    # nested: systemd inside a container
    (
        "service inside container",
        "/system.slice/docker-%s.scope/system.slice/vllm.service" % CID,
        owner(systemd_unit="docker-%s.scope" % CID, container_id=CID, runtime="docker"),
    ),
    (
        "service inside a cgroupfs container",
        "/docker/%s/system.slice/vllm.service" % CID,
        owner(container_id=CID, runtime="docker"),
    ),
    # look-alikes that are not owners
    ("job_ without slurm parent", "/system.slice/batch.service/job_12", owner(systemd_unit="batch.service")),
    ("pod without kubepods parent", "/custom/pod%s" % UID, owner()),
    ("short hex", "/docker/%s" % CID[:12], owner()),
    ("a slice is not a unit", "/system.slice", owner()),
]


@pytest.mark.parametrize("path, expected", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
@pytest.mark.parametrize("layout", ["v2", "v1", "hybrid"])
def test_parse_cgroup_path_forms(layout, path, expected):
    text = {"v2": v2, "v1": v1, "hybrid": hybrid}[layout](path)
    assert _owners.parse_cgroup(text) == expected


def test_slurm_v1_job_only_in_controller_hierarchies():
    # cgroup/v1 plugin: slurmstepd stays in slurmd.service in name=systemd; jobs live in freezer etc.
    text = v1("/system.slice/slurmd.service", "/slurm/uid_1000/job_4242/step_0/task_1")
    assert _owners.parse_cgroup(text) == owner(systemd_unit="slurmd.service", slurm_job="4242")


def test_slurm_v1_multiple_slurmd_root():
    text = v1("/system.slice/slurmd.service", "/slurm_node3/uid_0/job_5/step_batch/task_0")
    assert _owners.parse_cgroup(text)["slurm_job"] == "5"


def test_hybrid_with_unified_root_reads_name_systemd():
    # what the simulator shows (and a hybrid host whose unified tree is not populated): 0::/ says nothing
    text = "12:name=systemd:/system.slice/system-vllm.slice/vllm@a.service\n4:memory:/\n0::/\n"
    assert _owners.parse_cgroup(text)["systemd_unit"] == "vllm@a.service"


def test_v2_line_wins_over_name_systemd():
    text = "1:name=systemd:/system.slice/old.service\n0::/system.slice/new.service\n"
    assert _owners.parse_cgroup(text)["systemd_unit"] == "new.service"


def test_cgroup_namespace_escape_prefix_is_ignored():
    # a reader outside the process's cgroup namespace root sees /../.. before the path
    text = "0::/../../system.slice/docker-%s.scope\n" % CID
    assert _owners.parse_cgroup(text) == owner(container_id=CID, runtime="docker")  # that unit is not this manager's


@pytest.mark.parametrize("text", ["", "garbage\n", "0::\n", "1:cpu\n", None])
def test_parse_cgroup_unreadable_is_all_none(text):
    assert _owners.parse_cgroup(text) == owner()


def test_pod_names_from_log_directory(tmp_path):
    (tmp_path / ("inference_vllm-0_%s" % UID)).mkdir()
    (tmp_path / ("other_web-1_%s" % STATIC_UID)).mkdir()
    assert _owners.pod_names(UID, str(tmp_path)) == ("inference", "vllm-0")
    assert _owners.pod_names(STATIC_UID, str(tmp_path)) == ("other", "web-1")


def test_pod_names_unknown(tmp_path):
    (tmp_path / UID).mkdir()  # the old /var/log/pods/<uid> layout names nothing
    assert _owners.pod_names(UID, str(tmp_path)) == (None, None)
    assert _owners.pod_names(UID, str(tmp_path / "absent")) == (None, None)
    assert _owners.pod_names(None, str(tmp_path)) == (None, None)


def fake_systemctl(tmp_path, body):
    path = tmp_path / "systemctl"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_unit_restart_reads_systemctl(tmp_path):
    log = tmp_path / "argv"
    systemctl = fake_systemctl(tmp_path, 'echo "$@" > %s\necho always\n' % log)
    assert _owners.unit_restart("vllm@a.service", systemctl) == "always"
    assert log.read_text().split() == ["show", "-p", "Restart", "--value", "--", "vllm@a.service"]


def test_unit_restart_none_cases(tmp_path):
    assert _owners.unit_restart("vllm.service", str(tmp_path / "no-systemctl")) is None
    failing = fake_systemctl(tmp_path, 'echo "System has not been booted with systemd" >&2\nexit 1\n')
    assert _owners.unit_restart("vllm.service", failing) is None
    empty = fake_systemctl(tmp_path, "echo\n")
    assert _owners.unit_restart("docker-x.scope", empty) is None
    assert _owners.unit_restart("not a unit", empty) is None
    assert _owners.unit_restart(None, empty) is None


def test_unit_restart_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(_owners, "SYSTEMCTL_TIMEOUT_S", 0.2)
    slow = fake_systemctl(tmp_path, "exec sleep 5\n")
    assert _owners.unit_restart("vllm.service", slow) is None


def test_unit_restart_with_run_callable():
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, "on-failure\n"

    assert _owners.unit_restart("x.service", run=run) == "on-failure"
    assert calls[0][0] == "systemctl"


def tree(entries):
    """read_stat/read_cmdline over {pid: (comm, state, ppid, argv)}."""

    def read_stat(pid):
        entry = entries.get(pid)
        return None if entry is None else {"comm": entry[0], "state": entry[1], "ppid": entry[2]}

    def read_cmdline(pid):
        entry = entries.get(pid)
        return None if entry is None else entry[3]

    return read_stat, read_cmdline


@pytest.mark.parametrize(
    "comm, argv, kind",
    [
        ("torchrun", ["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node=8", "train.py"], "torchrun"),
        ("python3", ["python3", "-m", "torch.distributed.run", "--nproc-per-node=2", "x.py"], "torchrun"),
        ("python", ["python", "-m", "torch.distributed.launch", "x.py"], "torchrun"),
        ("raylet", ["/opt/ray/core/src/ray/raylet/raylet", "--node_ip_address=10.0.0.1"], "ray"),
        ("ray::Worker", ["ray::VLLMWorker.execute_method"], "ray"),
        ("mpirun", ["mpirun", "-np", "8", "./a.out"], "mpi"),
        ("orted", ["orted", "-mca", "ess", "env"], "mpi"),
        ("hydra_pmi_proxy", ["/usr/bin/hydra_pmi_proxy", "--control-port", "n1:1"], "mpi"),
        ("supervisord", ["/usr/bin/python3", "/usr/bin/supervisord", "-n"], "supervisord"),
        ("vllm", ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "meta-llama/Llama-3.1-8B"], "vllm"),
        ("bash", ["bash", "-c", "torchrun-like"], None),
        ("python3", ["python3", "serve.py", "vllm"], None),
        ("sshd", ["sshd: root@pts/0"], None),
    ],
)
def test_agent_kind(comm, argv, kind):
    assert _owners.agent_kind(comm, argv) == kind


def test_find_agent_nearest_live_ancestor():
    read_stat, read_cmdline = tree(
        {
            1: ("init", "S", 0, ["/sbin/init"]),
            10: ("supervisord", "S", 1, ["/usr/bin/python3", "/usr/bin/supervisord"]),
            20: ("torchrun", "Z", 10, []),  # a zombie restarts nothing
            30: ("bash", "S", 20, ["bash"]),
            40: ("python3", "S", 30, ["python3", "train.py"]),
        }
    )
    assert _owners.find_agent(40, read_stat, read_cmdline) == {
        "pid": 10,
        "comm": "supervisord",
        "cmdline": "/usr/bin/python3 /usr/bin/supervisord",
        "kind": "supervisord",
    }


def test_find_agent_s_command_line_without_setproctitle_s_padding():
    # A Ray worker's title (setproctitle) padded to the end of its argv area, as a holder's own command line reads.
    read_stat, read_cmdline = tree(
        {
            10: ("ray::VLLMWorker", "S", 1, ["ray::VLLMWorker.execute_method" + " " * 200, "", ""]),
            40: ("x", "S", 10, []),
        }
    )
    assert _owners.find_agent(40, read_stat, read_cmdline)["cmdline"] == "ray::VLLMWorker.execute_method"


def test_find_agent_self_is_not_its_own_agent_and_none_found():
    read_stat, read_cmdline = tree(
        {1: ("gpusim-init", "S", 0, ["gpusim-init"]), 8: ("vllm", "S", 1, ["python", "/x/bin/vllm", "serve", "m"])}
    )
    assert _owners.find_agent(8, read_stat, read_cmdline) is None


def test_find_agent_vllm_api_server_and_orphans():
    entries = {
        1: ("init", "S", 0, ["init"]),
        7: ("vllm", "S", 1, ["/venv/bin/python", "/node/bin/vllm", "serve", "m", "--tensor-parallel-size", "2"]),
        8: ("VLLM::EngineCor", "S", 7, ["VLLM::EngineCore"]),
        9: ("VLLM::Worker_TP", "S", 8, ["VLLM::Worker_TP0"]),
    }
    read_stat, read_cmdline = tree(entries)
    assert _owners.find_agent(9, read_stat, read_cmdline)["pid"] == 7
    entries[8] = ("VLLM::EngineCor", "S", 1, ["VLLM::EngineCore"])  # API server killed: reparented to init
    del entries[7]
    assert _owners.find_agent(9, read_stat, read_cmdline) is None


def test_find_agent_gone_and_cycles():
    read_stat, read_cmdline = tree({5: ("a", "S", 6, ["a"]), 6: ("b", "S", 5, ["b"])})
    assert _owners.find_agent(5, read_stat, read_cmdline) is None
    assert _owners.find_agent(99, read_stat, read_cmdline) is None


def make_proc(root, pid, cgroup=None, stat_line=None, cmdline=None):
    base = root / str(pid)
    base.mkdir(parents=True)
    if cgroup is not None:
        (base / "cgroup").write_text(cgroup)
    if stat_line is not None:  # the fields given, then zeros up to the 52 fields of a real stat line
        fields = stat_line[stat_line.rindex(b")") + 2 :].split()
        (base / "stat").write_bytes(stat_line.rstrip(b"\n") + b" 0" * (50 - len(fields)) + b"\n")
    if cmdline is not None:
        (base / "cmdline").write_bytes(b"".join(arg.encode() + b"\0" for arg in cmdline))


def test_owner_of_fake_proc(tmp_path):
    proc, pods = tmp_path / "proc", tmp_path / "pods"
    (pods / ("ml_vllm-0_%s" % UID)).mkdir(parents=True)
    make_proc(proc, 1, "0::/init.scope\n", b"1 (systemd) S 0 1 1 0 -1 0\n", ["/sbin/init"])
    make_proc(
        proc,
        50,
        "0::/system.slice/torch.service\n",
        b"50 (torchrun) S 1 50 50 0 -1 0\n",
        ["/usr/bin/python3", "/usr/bin/torchrun", "x.py"],
    )
    path = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope" % (
        UID_,
        CID,
    )
    make_proc(proc, 51, "0::%s\n" % path, b"51 (python3) S 50 50 50 0 -1 0\n", ["python3", "x.py"])
    calls = []

    def run(argv):
        calls.append(argv[-1])
        return 0, "always\n"

    got = _owners.owner_of(51, proc=str(proc), pods_log_dir=str(pods), run=run)
    assert got == {
        "systemd_unit": "cri-containerd-%s.scope" % CID,
        "unit_restart": None,
        "container_id": CID,
        "runtime": "containerd",
        "pod_uid": UID,
        "pod_namespace": "ml",
        "pod_name": "vllm-0",
        "slurm_job": None,
        "agent": {
            "pid": 50,
            "comm": "torchrun",
            "cmdline": "/usr/bin/python3 /usr/bin/torchrun x.py",
            "kind": "torchrun",
        },
    }
    assert calls == []  # scopes have no Restart=: systemctl is not asked
    cache = {}
    service = _owners.owner_of(50, proc=str(proc), pods_log_dir=str(pods), run=run, cache=cache)
    assert service["systemd_unit"] == "torch.service" and service["unit_restart"] == "always"
    _owners.owner_of(50, proc=str(proc), pods_log_dir=str(pods), run=run, cache=cache)
    assert calls == ["torch.service"]


def test_owner_of_gone_process(tmp_path):
    assert _owners.owner_of(12345, proc=str(tmp_path)) == _owners.empty_owner()


def test_owner_of_real_self():
    got = _owners.owner_of(os.getpid(), systemctl="/nonexistent/systemctl")
    assert set(got) == set(_owners.OWNER_KEYS)
    assert got["unit_restart"] is None


@pytest.mark.parametrize(
    "pieces, label",
    [
        ({"systemd_unit": "vllm@a.service"}, "unit:vllm@a.service"),
        ({"systemd_unit": "docker-%s.scope" % CID, "container_id": CID, "runtime": "docker"}, "container:" + CID[:12]),
        ({"systemd_unit": "crio-%s.scope" % CID, "container_id": CID, "pod_uid": UID}, "pod:" + UID),
        ({"systemd_unit": "slurmstepd.scope", "slurm_job": "42"}, "slurm_job:42"),
        ({}, ""),
        (None, ""),
    ],
)
def test_owner_label(pieces, label):
    block = None if pieces is None else dict(_owners.empty_owner(), **pieces)
    assert _owners.owner_label(block) == label


def test_matches_units():
    block = dict(_owners.empty_owner(), systemd_unit="vllm@a.service")
    assert _owners.matches(block, units=["vllm@a.service"])
    assert _owners.matches(block, units=["vllm@a"])
    assert not _owners.matches(block, units=["vllm@b"])
    assert _owners.mismatch(block, units=["vllm@b"]) == "unit not in units"
    assert _owners.normalize_unit("a.b") == "a.b.service"
    assert _owners.normalize_unit("x.scope") == "x.scope"


def test_matches_containers_full_and_prefix():
    block = dict(_owners.empty_owner(), container_id=CID, runtime="docker")
    assert _owners.matches(block, containers=[CID])
    assert _owners.matches(block, containers=[CID[:12].upper()])
    assert not _owners.matches(block, containers=["0" * 64])
    assert _owners.mismatch(dict(_owners.empty_owner()), containers=[CID]) == "container not in containers"


def test_container_ref_errors():
    assert _owners.container_ref_errors([CID, CID[:12]], known_ids=[CID]) == []
    errors = _owners.container_ref_errors([CID[:11], "xyz" * 5, CID + "0"], known_ids=[CID])
    assert len(errors) == 3 and "12 or more" in errors[0]
    ambiguous = _owners.container_ref_errors([CID[:12]], known_ids=[CID, CID2])
    assert len(ambiguous) == 1 and "ambiguous" in ambiguous[0]
    assert _owners.container_ref_errors([CID[:13]], known_ids=[CID, CID2]) == []


def test_matches_pods_and_jobs_and_combinations():
    block = dict(_owners.empty_owner(), pod_uid=UID, pod_namespace="ml", pod_name="vllm-0", slurm_job="7")
    assert _owners.matches(block, pods=[UID])
    assert _owners.matches(block, pods=[UID_])
    assert _owners.matches(block, pods=["ml/vllm-0"])
    assert not _owners.matches(block, pods=["ml/vllm-1"])
    assert _owners.matches(block, slurm_jobs=[7])
    assert _owners.mismatch(block, slurm_jobs=["8"]) == "Slurm job not in slurm_jobs"
    assert _owners.mismatch(block, pods=[UID], slurm_jobs=["8"]) == "Slurm job not in slurm_jobs"
    assert _owners.matches(block)  # no filter: any
    assert not _owners.matches(block, units=[])  # an empty list selects nothing (callers refuse it first)


def test_module_is_python39_compatible():
    # plugins/ must parse under Python 3.9's grammar (ansible-test sanity compile)
    import ast

    source = open(_owners.__file__).read()
    ast.parse(source, feature_version=(3, 9))
    assert "print(" not in source
    assert sys.version_info >= (3, 9)


def test_a_ray_actor_names_its_raylet_and_how_to_stop_it():
    """vLLM's Ray executor: workers are actors of the raylet (vllm/v1/executor/ray_executor_v2.py)."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners

    owner = dict(_owners.empty_owner(), agent={"pid": 812, "comm": "raylet", "cmdline": "raylet", "kind": "ray"})
    note = _owners.restart_note(owner)
    assert "raylet PID 812" in note and "stop the vLLM instance" in note and "`ray stop`" in note
    assert _owners.stop_command(owner) == "ray stop"
    vllm = dict(_owners.empty_owner(), agent={"pid": 9, "comm": "vllm", "cmdline": "vllm serve m", "kind": "vllm"})
    assert _owners.restart_note(vllm) is None and _owners.stop_command(vllm) is None
