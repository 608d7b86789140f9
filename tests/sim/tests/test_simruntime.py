"""Tests of tests/sim/simruntime, the simulated OCI runtime (tests/sim/README.md, "The simulated OCI runtime"): a
sleeping container created, started, killed and deleted on a node, as podman and conmon drive it; the cgroups create
refuses; every command refused outside a node.

Each test's containers have random IDs and its assertions look only at cgroups named after them: other engineers'
podman tests may run at the same time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import polling

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))

from containertools import CGROUP_VIEW, SIMRUNTIME  # noqa: E402


def bundle(tmp_path: Path, container_id: str, cgroups_path: str | None = None, mounts: tuple = ()) -> Path:
    """A bundle whose root file system gets the node's /usr and /etc; PID 1 is a shell that leaves a child. Its
    cgroup is podman's cgroupfs path unless `cgroups_path`; `mounts` come after the others."""
    directory = tmp_path / container_id
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
            *mounts,
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "uts"}, {"type": "ipc"}],
            "cgroupsPath": cgroups_path or "/libpod_parent/libpod-%s" % container_id,
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


def cgroups_named(container_id: str) -> list[str]:
    """The host's cgroups, in every hierarchy, whose name holds `container_id`."""
    found = subprocess.run(
        ["find", "/sys/fs/cgroup", "-name", "*%s*" % container_id], capture_output=True, text=True, check=False
    )
    return sorted(found.stdout.split())


def new_id() -> str:
    return uuid.uuid4().hex


def cgroup_node(simnode):
    """A node with cgroups of its own, as simruntime needs (else the test is skipped: CONTRIBUTING.md)."""
    if os.geteuid() != 0:
        pytest.skip("simruntime mounts and makes cgroups: root only")
    node = simnode(gpus=1)
    if node.info.get("cgroup") is None:
        pytest.skip("no cgroups of its own for the node: %s" % node.info.get("cgroup_unsupported"))
    return node


def create(node, root: Path, directory: Path, container_id: str, log: Path):
    pid_file = directory / "pidfile"
    command = ["create", "--bundle", str(directory), "--pid-file", str(pid_file), container_id]
    return runtime(node, "--root", str(root), *command, output=log, check=False)


def status_field(node, pid: int, field: str) -> str | None:
    result = node.exec("cat", "/proc/%d/status" % pid, check=False)
    lines = [line.split(":", 1)[1].split() for line in result.stdout.splitlines() if line.startswith(field + ":")]
    return " ".join(lines[0]) if lines and result.returncode == 0 else None


def test_a_sleeping_container_created_started_killed_and_deleted(simnode, tmp_path):
    node = cgroup_node(simnode)
    container = new_id()
    directory = bundle(tmp_path, container)
    root, log = tmp_path / "state", tmp_path / "container.log"
    created = create(node, root, directory, container, log)
    assert created.returncode == 0, log.read_text()
    pid = int((directory / "pidfile").read_text())
    state = json.loads(runtime(node, "--root", str(root), "state", container).stdout)
    assert (state["status"], state["pid"], state["id"]) == ("created", pid, container), state

    # The cgroup: in name=systemd below the node's cgroup, in no other hierarchy; state.json has it as the node
    # shows it, made by create.
    cgroup = node.exec("cat", "/proc/%d/cgroup" % pid).stdout.splitlines()
    assert "name=systemd:/libpod_parent/libpod-%s" % container in [line.split(":", 1)[1] for line in cgroup], cgroup
    assert all(line.endswith(":/") for line in cgroup if "name=systemd" not in line), cgroup
    own = os.path.join(node.info["cgroup"]["root"], "libpod_parent", "libpod-" + container)
    assert cgroups_named(container) == [own] and own.startswith("/sys/fs/cgroup/systemd/"), cgroups_named(container)
    saved = json.loads((root / container / "state.json").read_text())
    assert (saved["cgroup"], saved["cgroup_made"]) == ("/libpod_parent/libpod-%s" % container, True), saved

    # The container's cgroup view is read-only throughout: the view's tmpfs and the name=systemd mount below it.
    mountinfo = [line.split() for line in node.exec("cat", "/proc/%d/mountinfo" % pid).stdout.splitlines()]
    view = {fields[4]: fields[5].split(",") for fields in mountinfo if fields[4].startswith("/sys/fs/cgroup")}
    assert sorted(view) == ["/sys/fs/cgroup", "/sys/fs/cgroup/systemd"], view
    assert all("ro" in options for options in view.values()), view

    runtime(node, "--root", str(root), "start", container)
    assert json.loads(runtime(node, "--root", str(root), "state", container).stdout)["status"] == "running"
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
    runtime(node, "--root", str(root), "kill", container, "KILL")
    polling.wait_for(lambda: status_field(node, child, "State") in (None, "Z (zombie)"), 10, 0.05, "the child's end")
    state = json.loads(runtime(node, "--root", str(root), "state", container).stdout)
    assert (state["status"], state["pid"]) == ("stopped", 0), state

    runtime(node, "--root", str(root), "delete", container)
    assert cgroups_named(container) == []
    gone = runtime(node, "--root", str(root), "state", container, check=False)
    assert gone.returncode == 1 and "does not exist" in gone.stderr, gone


def alive_in(node, pid: int, cgroup: str) -> bool:
    seen = node.exec("cat", "/proc/%d/cgroup" % pid, check=False).stdout.splitlines()
    systemd = [line.split(":", 2)[2] for line in seen if line.split(":", 2)[1] == "name=systemd"]
    return status_field(node, pid, "State") not in (None, "Z (zombie)") and systemd == [cgroup]


def test_create_makes_a_cgroup_of_its_own_or_nothing(simnode, tmp_path):
    """The root cgroup and a cgroup that exists are refused, a failed create removes the cgroup it made, and delete
    signals only in a cgroup create made: another process of the node survives each."""
    node = cgroup_node(simnode)
    root, log = tmp_path / "state", tmp_path / "container.log"
    other = node.spawn("import time; time.sleep(300)", cgroup="/busy")
    for path, why in (("/", "is the root cgroup"), ("//", "is the root cgroup"), ("/busy", "exists already")):
        container = new_id()
        refused = create(node, root, bundle(tmp_path, container, cgroups_path=path), container, log)
        assert refused.returncode == 1 and why in log.read_text(), (path, log.read_text())
        assert not (root / container).exists(), path
    assert alive_in(node, other, "/busy")

    container = new_id()
    missing = {"destination": "/data", "type": "bind", "source": str(tmp_path / "absent"), "options": ["rbind"]}
    failed = create(node, root, bundle(tmp_path, container, mounts=(missing,)), container, log)
    assert failed.returncode == 1 and "its source %s does not exist" % missing["source"] in log.read_text()
    assert cgroups_named(container) == [] and not (root / container).exists()

    # A state.json of an older simruntime: its cgroup, an absolute path in the view, was not recorded as made.
    container = new_id()
    (root / container).mkdir(parents=True)
    old = {"ociVersion": "1.0.2", "id": container, "pid": 0, "starttime": 0, "cgroup": "/sys/fs/cgroup/systemd/busy"}
    (root / container / "state.json").write_text(json.dumps(old))
    runtime(node, "--root", str(root), "kill", "--all", container, "KILL")
    runtime(node, "--root", str(root), "delete", "--force", container)
    assert alive_in(node, other, "/busy") and not (root / container).exists()


# Outside a node: a tmpfs hides every cgroup hierarchy (a regressed guard could make or signal nothing there); or a
# cgroup namespace of its own with name=systemd mounted as podman's wrapper does, but no node around it.
NO_CGROUPS = "mount -t tmpfs -o mode=755 gpuops-no-cgroups /sys/fs/cgroup"
OUTSIDE = {
    "no cgroup view": (["--mount"], NO_CGROUPS, "simruntime runs only in"),
    "a cgroup view, no node": (["--cgroup", "--mount"], CGROUP_VIEW, "simruntime runs only in a simulated node"),
}


@pytest.mark.parametrize("where", sorted(OUTSIDE))
def test_outside_a_node_every_command_is_refused(tmp_path, where):
    """Before it reads, makes or signals anything, whatever --cgroup-manager says; run in a mount namespace of its
    own. The state's container has no cgroup and a dead init, the bundle does not exist: a guard that regressed
    fails the test and still makes or signals nothing."""
    if os.geteuid() != 0:
        pytest.skip("the test mounts in a mount namespace of its own: root only")
    namespaces, view, refusal = OUTSIDE[where]
    container, root, absent = new_id(), tmp_path / "state", tmp_path / "absent"
    (root / container).mkdir(parents=True)
    saved = {"ociVersion": "1.0.2", "id": container, "pid": 0, "starttime": 0, "bundle": str(absent)}
    saved.update(rootfs=str(absent), created="", owner="", cgroup=None, annotations={})
    (root / container / "state.json").write_text(json.dumps(saved))
    commands = [
        ["create", "--bundle", str(absent), new_id()],
        ["--cgroup-manager", "disabled", "create", "--bundle", str(absent), new_id()],
        ["state", container],
        ["start", container],
        ["kill", "--all", container, "KILL"],
        ["--cgroup-manager", "disabled", "delete", "--force", container],
    ]
    for command in commands:
        script = view + ' && exec "$@"'
        argv = ["unshare", *namespaces, "--propagation", "private", "/bin/sh", "-c", script, "sh", str(SIMRUNTIME)]
        result = subprocess.run(
            [*argv, "--root", str(root), *command], capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 1 and refusal in result.stderr, (command, result)
        assert os.listdir(root) == [container] and json.loads((root / container / "state.json").read_text()) == saved
    refused = subprocess.run(
        [str(SIMRUNTIME), "--systemd-cgroup", "state", container],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert refused.returncode == 1 and "--systemd-cgroup" in refused.stderr, refused
