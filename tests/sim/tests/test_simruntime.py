"""Tests of tests/sim/simruntime, the simulated OCI runtime (tests/sim/README.md, "The simulated OCI runtime"): a
sleeping container created, started, killed and deleted on a node, as podman and conmon drive it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import polling

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))

from containertools import CGROUP_VIEW, SIMRUNTIME  # noqa: E402

CONTAINER = "c0ffee" * 4


def bundle(tmp_path: Path, container_id: str) -> Path:
    """A bundle whose root file system gets the node's /usr and /etc; PID 1 is a shell that leaves a child."""
    directory = tmp_path / "bundle"
    rootfs = directory / "rootfs"
    for name in ("usr", "etc", "proc", "dev", "sys", "tmp"):
        (rootfs / name).mkdir(parents=True)
    for name in ("bin", "lib", "lib64", "sbin"):
        (rootfs / name).symlink_to("usr/" + name)
    spec = {
        "ociVersion": "1.0.2",
        "process": {
            "args": ["/bin/sh", "-c", "sleep 300 & exec sleep 301"],
            "env": ["PATH=/usr/bin:/bin"],
            "cwd": "/work",
            "user": {"uid": 0, "gid": 0},
            "rlimits": [{"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs"},
        "hostname": "simrt",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
            {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]},
            {"destination": "/etc", "type": "bind", "source": "/etc", "options": ["rbind", "ro"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["ro", "nosuid"]},
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "uts"}, {"type": "ipc"}],
            "cgroupsPath": "/libpod_parent/libpod-%s" % container_id,
            "maskedPaths": ["/proc/kcore"],
            "readonlyPaths": ["/proc/sys"],
        },
    }
    (directory / "config.json").write_text(json.dumps(spec))
    return directory


def runtime(node, *args, check=True, output=None):
    """simruntime inside `node`, in the cgroup view the podman wrapper gives it (containertools.py); with `output`,
    its stdio (which the container's init inherits, as from conmon) is /dev/null and that file."""
    redirect = ' </dev/null >"%s" 2>&1' % output if output else ""
    script = CGROUP_VIEW + ' && exec "$@"' + redirect
    command = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", str(SIMRUNTIME)]
    return node.exec(*command, *args, check=check)


def libpod_cgroups() -> list[str]:
    found = subprocess.run(["find", "/sys/fs/cgroup", "-name", "libpod*"], capture_output=True, text=True, check=False)
    return sorted(found.stdout.split())


def status_field(node, pid: int, field: str) -> str | None:
    result = node.exec("cat", "/proc/%d/status" % pid, check=False)
    lines = [line.split(":", 1)[1].split() for line in result.stdout.splitlines() if line.startswith(field + ":")]
    return " ".join(lines[0]) if lines and result.returncode == 0 else None


def test_a_sleeping_container_created_started_killed_and_deleted(simnode, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("simruntime mounts and makes cgroups: root only")
    node = simnode(gpus=1)
    if node.info.get("cgroup") is None:
        pytest.skip("no cgroups of its own for the node: %s" % node.info.get("cgroup_unsupported"))
    before = libpod_cgroups()
    directory = bundle(tmp_path, CONTAINER)
    root, pid_file = tmp_path / "state", tmp_path / "pidfile"
    log = tmp_path / "container.log"
    create = ["create", "--bundle", str(directory), "--pid-file", str(pid_file), CONTAINER]
    created = runtime(node, "--root", str(root), *create, output=log, check=False)
    assert created.returncode == 0, log.read_text()
    pid = int(pid_file.read_text())
    state = json.loads(runtime(node, "--root", str(root), "state", CONTAINER).stdout)
    assert (state["status"], state["pid"], state["id"]) == ("created", pid, CONTAINER), state

    # The cgroup: in name=systemd below the node's cgroup, in no other hierarchy.
    cgroup = node.exec("cat", "/proc/%d/cgroup" % pid).stdout.splitlines()
    assert "name=systemd:/libpod_parent/libpod-%s" % CONTAINER in [line.split(":", 1)[1] for line in cgroup], cgroup
    assert all(line.endswith(":/") for line in cgroup if "name=systemd" not in line), cgroup
    own = os.path.join(node.info["cgroup"]["root"], "libpod_parent", "libpod-" + CONTAINER)
    assert libpod_cgroups() == sorted(before + [own, os.path.dirname(own)]), libpod_cgroups()

    runtime(node, "--root", str(root), "start", CONTAINER)
    assert json.loads(runtime(node, "--root", str(root), "state", CONTAINER).stdout)["status"] == "running"
    assert status_field(node, pid, "NSpid") == "%d 1" % pid  # PID 1 of a PID namespace of its own
    assert node.exec("nsenter", "-t", str(pid), "-u", "hostname").stdout.strip() == "simrt"
    child = polling.wait_for(
        lambda: [p for p in node.exec("pgrep", "-P", str(pid), check=False).stdout.split() if p],
        10,
        0.05,
        "the init's child",
    )
    (child,) = map(int, child)

    # The init killed: the kernel ends the rest of its PID namespace.
    runtime(node, "--root", str(root), "kill", CONTAINER, "KILL")
    polling.wait_for(lambda: status_field(node, child, "State") in (None, "Z (zombie)"), 10, 0.05, "the child's end")
    state = json.loads(runtime(node, "--root", str(root), "state", CONTAINER).stdout)
    assert (state["status"], state["pid"]) == ("stopped", 0), state

    runtime(node, "--root", str(root), "delete", CONTAINER)
    assert libpod_cgroups() == sorted(before + [os.path.dirname(own)])
    gone = runtime(node, "--root", str(root), "state", CONTAINER, check=False)
    assert gone.returncode == 1 and "does not exist" in gone.stderr, gone


def test_outside_a_nodes_cgroup_namespace_nothing_is_made(tmp_path):
    """On the host (its initial cgroup namespace) create is refused before any cgroup or state is made."""
    if os.readlink("/proc/self/ns/cgroup") != "cgroup:[4026531835]":  # PROC_CGROUP_INIT_INO
        pytest.skip("this test runs in a cgroup namespace of its own, not the host's")
    directory = bundle(tmp_path, CONTAINER)
    root = tmp_path / "state"
    command = [str(SIMRUNTIME), "--root", str(root), "create", "--bundle", str(directory), CONTAINER]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 1 and "only inside a cgroup namespace of a node" in result.stderr, result
    assert os.listdir(root) == [] and not [path for path in libpod_cgroups() if CONTAINER in path]
    refused = subprocess.run(
        [str(SIMRUNTIME), "--systemd-cgroup", "state", CONTAINER],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert refused.returncode == 1 and "--systemd-cgroup" in refused.stderr, refused
