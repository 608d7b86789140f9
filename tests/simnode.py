"""Test harness for simulated GPU nodes (tests/sim/README.md).

    node = up("t-example", gpus=2, minors=[3, 5], release_latency=0.1)
    node.py("import os; print(os.getpid())")      # venv Python inside the node -> stdout
    pid = node.spawn("import time; time.sleep(600)")  # detached; PID in the node's namespace
    node.set(lost=[1])                            # edit node.conf live
    node.down()

In pytest use the `simnode` fixture (tests/conftest.py), which names nodes uniquely and downs
them after the test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPUNODE = REPO / "tests" / "sim" / "gpunode"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
CLI_TIMEOUT_S = 60


def _load_gpunode():
    spec = importlib.util.spec_from_file_location("gpunode", GPUNODE.with_suffix(".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpunode = _load_gpunode()

# Launches the snippet in argv[1] detached (new session, stdio on /dev/null) and prints its PID.
_SPAWN_LAUNCHER = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdin=subprocess.DEVNULL,\n"
    "                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,\n"
    "                         start_new_session=True)\n"
    "print(child.pid)\n"
)


class NodeCommandError(subprocess.CalledProcessError):
    """A command failed; unlike CalledProcessError its message includes stdout and stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


def knob_text(value) -> str:
    """Text of a knob value as gpunode takes it: lists comma-joined, {index: MiB} as i:MiB,...,
    booleans 1/0, None as "" (none)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, dict):
        return ",".join(f"{key}:{item}" for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value)
    return str(value)


def _run_gpunode(args: list[str], root: Path | None = None) -> subprocess.CompletedProcess:
    environment = dict(os.environ)
    if root is not None:
        environment["GPUNODE_ROOT"] = str(root)
    command = [str(GPUNODE), *args]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        env=environment,
        check=False,
    )
    if result.returncode != 0:
        raise NodeCommandError(result.returncode, command, result.stdout, result.stderr)
    return result


class Node:
    """A running simulated GPU node, as described by `gpunode up` (`info`)."""

    def __init__(self, info: dict):
        self.info = info
        self.name: str = info["name"]
        self.state_dir = Path(info["state_dir"])
        self.run_dir = Path(info["run_dir"])

    def __repr__(self) -> str:
        return f"Node({self.name!r}, init_pid={self.info['init_pid']})"

    def exec(
        self, *command, input: str | None = None, timeout: float = 60, check: bool = True, cgroup: str | None = None
    ) -> subprocess.CompletedProcess:
        """Run `command` inside the node (text mode, output captured); with `cgroup` (a path as the
        node shows it, e.g. "/system.slice/vllm@a.service"), in that cgroup of the node.

        Raises NodeCommandError when `check` and the exit status is not 0, gpunode.GpunodeError
        when the node is not running, subprocess.TimeoutExpired after `timeout` s (the command
        then gets SIGTERM through its parent-death signal).
        """
        argv, environment = gpunode.enter_command(self.info, [str(part) for part in command], cgroup)
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=environment,
            check=False,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if check and result.returncode != 0:
            raise NodeCommandError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def ssh_argv(self, command: str) -> list[str]:
        """ssh's command line that runs `command` (one shell line) on this node, started with ssh=True: its key, its
        known_hosts, no prompt. Over SSH a command gets a session's environment, not this process's."""
        ssh = self.info["ssh"]
        return [
            "ssh",
            "-i",
            ssh["private_key"],
            "-o",
            "UserKnownHostsFile=%s" % ssh["known_hosts"],
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-p",
            str(ssh["port"]),
            "%s@%s" % (ssh["user"], ssh["host"]),
            command,
        ]

    def py(self, code: str, *args: str, timeout: float = 60, cgroup: str | None = None) -> str:
        """Run the venv Python with `-c code args...` inside the node (in `cgroup`, see exec);
        return its stdout.

        Raises NodeCommandError (with stderr) if it exits non-zero.
        """
        return self.exec(str(VENV_PYTHON), "-c", code, *args, timeout=timeout, cgroup=cgroup).stdout

    def spawn(self, code: str, cgroup: str | None = None) -> int:
        """Start Python `code` detached inside the node (own session, stdio on /dev/null), in the
        node's cgroup `cgroup` when given (a path as /proc/PID/cgroup shows it inside the node:
        "/system.slice/vllm@a.service", "/kubepods.slice/.../cri-containerd-<id>.scope"...).

        Returns its PID in the node's PID namespace. Its parent exits at once, so it is an
        orphan of the node's init; it ends at the latest with `down`.
        """
        return int(self.py(_SPAWN_LAUNCHER, code, cgroup=cgroup))

    @property
    def cgroup_root(self) -> Path | None:
        """The node's own cgroup on the host (name=systemd hierarchy), None without owner cgroups."""
        return Path(self.info["cgroup"]["root"]) if self.info.get("cgroup") else None

    def set_units(self, units: dict) -> None:
        """Write the node's unit table for the simulated systemctl, replacing it:
        {"vllm@a.service": {"Restart": "always", "TimeoutStopSec": 5, "MainPID": 12}, ...}."""
        path = self.run_dir / "units.json"
        temporary = path.with_name(f".units.json.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(units, indent=2) + "\n")
        os.replace(temporary, path)

    def set(self, **knobs) -> None:
        """Edit node.conf live: set(release_latency=2, lost=[1], stray_mib={0: 1024}, hang=None)."""
        assignments = [f"{key}={knob_text(value)}" for key, value in knobs.items()]
        _run_gpunode(["set", self.name, *assignments], self.state_dir.parent)

    def down(self) -> None:
        """End every process of the node and remove its state (idempotent)."""
        _run_gpunode(["down", self.name], self.state_dir.parent)


def up(name: str, root: Path | None = None, **knobs) -> Node:
    """Create node `name` with `gpunode up` and return it.

    Knobs are the `up` options with underscores: gpus=2, model_name=..., memory_mib=...,
    minors=[3, 5], reserved_mib, idle_used_mib, stray_mib={0: 1024}, release_latency=0.1,
    no_driver=True, hang="nvmlDeviceGetCount", lost=[1], no_reap=True, ssh=True (an sshd in the node, which
    `inventory_file` then reaches over SSH; root only). `root` overrides
    $GPUNODE_ROOT. Raises NodeCommandError (with gpunode's message) if the node cannot start.
    """
    args = ["up", name]
    for key, value in knobs.items():
        option = "--" + key.replace("_", "-")
        if value is True:
            args.append(option)
        elif value is not False and value is not None:
            args += [option, knob_text(value)]
    return Node(json.loads(_run_gpunode(args, root).stdout))


def inventory_file(tmp_path: Path, *nodes: Node) -> Path:
    """Write an Ansible INI inventory of `nodes` (group `gpunodes`) under tmp_path; return it."""
    path = tmp_path / "gpunodes.ini"
    path.write_text(_run_gpunode(["inventory", *(node.name for node in nodes)], nodes[0].state_dir.parent).stdout)
    return path
