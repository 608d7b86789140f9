"""Simulated `systemctl` of simulated GPU nodes: test infrastructure (tests/sim/README.md).

systemd is never booted on the test machines. Inside a node, `systemctl` (the node's bin/, first
on PATH) answers the few calls the collection makes, from the node's cgroups (a unit is the
cgroup of that name under the node's root cgroup, in the name=systemd hierarchy, reached through
slices only: a unit inside another unit, e.g. a user manager's in user@1000.service, is not the
system manager's) and a per-node unit table that tests write, STATE/run/units.json:
{"vllm@a.service": {"Restart": "always", "TimeoutStopSec": 5}, ...}.

- `show [-p PROP[,PROP]]... [--value] [--] UNIT...`: Id, LoadState, ActiveState, Restart (services
  only; `no` unless the table says), MainPID, ControlGroup. Exit 0 even for an unknown unit,
  which shows LoadState=not-found, ActiveState=inactive and Restart=no (systemd#1105).
- `stop UNIT...`: SIGTERM to every process of the unit's cgroup, SIGKILL to what is left after
  TimeoutStopSec (default 90 s), then removes the cgroup (systemd.kill(5): KillMode=control-group,
  KillSignal=SIGTERM, FinalKillSignal after the timeout). A unit with neither cgroup nor table
  entry: "Failed to stop UNIT: Unit UNIT not loaded." and exit 5 (systemd#25708).
- `is-active UNIT...`: active/inactive, exit 0 when all are active, else 3.
- `start UNIT...`: a unit whose table entry has `ExecStart` (an argv list) and no process yet gets one: the
  command runs detached (own session, stdio on /dev/null) in the unit's cgroup, `/system.slice/UNIT` or the
  entry's `Slice` (systemd.exec(5), systemd.slice(5)); an active unit is left as it is (exit 0). A unit without
  ExecStart: "Failed to start UNIT: Unit UNIT not found." and exit 5, as systemctl says of an unknown unit.
It never restarts anything by itself: Restart= is reported, not acted on.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

UNIT_SUFFIXES = (
    ".service",
    ".socket",
    ".target",
    ".device",
    ".mount",
    ".automount",
    ".swap",
    ".timer",
    ".path",
    ".slice",
    ".scope",
)
DEFAULT_TIMEOUT_STOP_S = 90.0
KILL_WAIT_S = 5.0
POLL_S = 0.01
EXIT_NOT_LOADED = 5
EXIT_INACTIVE = 3
ALL_PROPERTIES = ("Id", "LoadState", "ActiveState", "Restart", "MainPID", "ControlGroup")


def mangle(name: str) -> str:
    """systemctl's name mangling: a name without a unit type suffix means NAME.service."""
    return name if name.endswith(UNIT_SUFFIXES) else name + ".service"


class Node:
    def __init__(self, state_dir: str):
        state = Path(state_dir)
        info = json.loads((state / "node.json").read_text())
        self.root = Path(info["cgroup"]["root"]) if info.get("cgroup") else None
        table_path = state / "run" / "units.json"
        self.table = json.loads(table_path.read_text()) if table_path.exists() else {}

    def cgroups(self, unit: str) -> list[Path]:
        """Host paths of the cgroup of `unit` as the system manager places it: under the node's root cgroup through
        slices only (a unit's cgroup is its slice's path and its name; what lies under a unit, a user manager's or a
        container's own units, is that unit's delegated subtree, not the system manager's). Outermost first."""
        if self.root is None:
            return []
        found, slices = [], [self.root]
        while slices:
            directory = slices.pop()
            try:
                names = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
            except OSError:
                continue
            found.extend(Path(directory, name) for name in names if name == unit)
            slices.extend(Path(directory, name) for name in names if name.endswith(".slice") and name != unit)
        return sorted(found, key=lambda path: len(path.parts))

    def node_view(self, path: Path) -> str:
        return "/" + str(path.relative_to(self.root))

    @staticmethod
    def pids(cgroup: Path) -> list[int]:
        """Processes of `cgroup` and the cgroups under it, as PIDs of this (the node's) PID namespace."""
        pids = set()
        for directory, _subdirectories, _files in os.walk(cgroup):
            try:
                text = Path(directory, "cgroup.procs").read_text()
            except OSError:
                continue
            pids.update(int(pid) for pid in text.split() if pid != "0")
        pids.discard(os.getpid())
        return sorted(pids)


def _properties(node: Node, unit: str) -> dict[str, str]:
    entry = node.table.get(unit, {})
    cgroups = node.cgroups(unit)
    pids = node.pids(cgroups[0]) if cgroups else []
    values = {
        "Id": unit,
        "LoadState": "loaded" if entry or cgroups else "not-found",
        "ActiveState": "active" if pids else "inactive",
        "MainPID": str(entry.get("MainPID", pids[0] if pids else 0)),
        "ControlGroup": node.node_view(cgroups[0]) if cgroups else "",
    }
    if unit.endswith(".service"):  # Restart= is a property of services only
        values["Restart"] = str(entry.get("Restart", "no"))
    return values


def _show(node: Node, units: list[str], properties: list[str], value_only: bool) -> int:
    blocks = []
    for unit in units:
        values = _properties(node, unit)
        lines = []
        for name in properties or ALL_PROPERTIES:
            if name in values:
                lines.append(values[name] if value_only else f"{name}={values[name]}")
        blocks.append("\n".join(lines))
    sys.stdout.write("\n\n".join(blocks) + ("\n" if blocks else ""))
    return 0


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _wait_empty(node: Node, cgroup: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while node.pids(cgroup):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def _remove_tree(cgroup: Path) -> None:
    for directory, _subdirectories, _files in os.walk(cgroup, topdown=False):
        try:
            os.rmdir(directory)
        except OSError:
            pass


def _stop(node: Node, units: list[str]) -> int:
    status = 0
    for unit in units:
        cgroups = node.cgroups(unit)
        if not cgroups and unit not in node.table:
            print(f"Failed to stop {unit}: Unit {unit} not loaded.", file=sys.stderr)
            status = EXIT_NOT_LOADED
            continue
        timeout = float(node.table.get(unit, {}).get("TimeoutStopSec", DEFAULT_TIMEOUT_STOP_S))
        for cgroup in cgroups:
            _signal_all(node.pids(cgroup), signal.SIGTERM)
            if not _wait_empty(node, cgroup, timeout):
                _signal_all(node.pids(cgroup), signal.SIGKILL)
                _wait_empty(node, cgroup, KILL_WAIT_S)
            _remove_tree(cgroup)
    return status


def _start(node: Node, units: list[str]) -> int:
    status = 0
    for unit in units:
        command = node.table.get(unit, {}).get("ExecStart")
        if not command or node.root is None:
            print(f"Failed to start {unit}: Unit {unit} not found.", file=sys.stderr)
            status = EXIT_NOT_LOADED
            continue
        if _properties(node, unit)["ActiveState"] == "active":
            continue
        cgroup = node.root / node.table[unit].get("Slice", "system.slice") / unit
        cgroup.mkdir(parents=True, exist_ok=True)
        _launch_in(cgroup, [str(part) for part in command])
    return status


def _launch_in(cgroup: Path, command: list[str]) -> None:
    """Run `command` detached in `cgroup`: a child joins it and forks the command, then exits (the command is an
    orphan of the node's init, as a service is a child of PID 1)."""
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
            if os.fork() == 0:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execv(command[0], command)
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def _is_active(node: Node, units: list[str]) -> int:
    states = [_properties(node, unit)["ActiveState"] for unit in units]
    sys.stdout.write("".join(state + "\n" for state in states))
    return 0 if states and all(state == "active" for state in states) else EXIT_INACTIVE


def main(argv: list[str], state_dir: str) -> int:
    """Command-line entry point (bin/systemctl of the node whose state directory is `state_dir`)."""
    properties: list[str] = []
    value_only = False
    positional: list[str] = []
    arguments = iter(argv)
    for argument in arguments:
        if argument == "--":
            positional.extend(arguments)
        elif argument in ("-p", "--property"):
            properties.extend(next(arguments, "").split(","))
        elif argument.startswith("--property="):
            properties.extend(argument.split("=", 1)[1].split(","))
        elif argument.startswith("-p") and len(argument) > 2:
            properties.extend(argument[2:].split(","))
        elif argument == "--value":
            value_only = True
        elif argument in ("--no-pager", "--no-block", "-q", "--quiet", "--system", "--no-ask-password"):
            continue
        elif argument.startswith("-"):
            print(f"systemctl (simulated): unsupported option {argument}", file=sys.stderr)
            return 1
        else:
            positional.append(argument)
    if not positional:
        print("systemctl (simulated): give a verb: show, stop, start, is-active", file=sys.stderr)
        return 1
    verb, units = positional[0], [mangle(unit) for unit in positional[1:]]
    node = Node(state_dir)
    if verb == "show":
        return _show(node, units, [name for name in properties if name], value_only)
    if verb == "stop":
        return _stop(node, units)
    if verb == "is-active":
        return _is_active(node, units)
    if verb == "start":
        return _start(node, units)
    print(f"systemctl (simulated): unsupported verb {verb}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[2:], sys.argv[1]))
