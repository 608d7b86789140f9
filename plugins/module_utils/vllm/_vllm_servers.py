# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The vLLM API servers of a host, whoever started them: read from /proc, for the vllm_server role.

A vLLM API server is known by its process: a Python process that runs vLLM's server (`vllm serve`, `python -m
vllm.entrypoints.cli.main serve`, `python -m vllm.entrypoints.openai.api_server`), listening or not. vLLM binds its
port before it builds the engine and listens only once the model is loaded (vLLM 0.33
vllm/entrypoints/launchers/launcher.py setup_server): a server still loading is a server, with no listening socket
yet, and the port its command line names (--port, else vLLM's default 8000). The launcher of several API servers
(`--api-server-count`, data parallel) is the one such process of its tree: its `VLLM::APIServer_<i>` children carry
a title, not vLLM's command line (vLLM 0.33 vllm/v1/utils.py run_api_server_worker_proc). What its tree holds of the GPUs comes from a gpu_facts snapshot.

find_servers(snapshot, proc) -> [Server]; recorded(server, records) -> the instance whose record it is, or None.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners, _proc

if TYPE_CHECKING:
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._shapes import Snapshot

# /proc/net/tcp's state column: 0A is TCP_LISTEN (include/net/tcp_states.h).
_LISTEN = "0A"
_PYTHON = re.compile(r"^python[0-9.]*$")
# The modules that run vLLM's OpenAI-compatible server when given to `python -m`, True where `serve` follows: the
# console script `vllm` calls vllm.entrypoints.cli.main:main; vllm/entrypoints/openai/api_server.py has a __main__
# of its own (make_arg_parser, the model as --model; setup_server binds the socket that run_server listens on).
_SERVE_MODULES = {"vllm.entrypoints.cli.main": True, "vllm.entrypoints.openai.api_server": False}
# FrontendArgs.port's default (vLLM 0.33 vllm/entrypoints/common/cli_args.py); --uds binds a unix socket instead and
# --headless, or --api-server-count (-asc) below 1, runs no API server (vllm/entrypoints/cli/serve.py cmd,
# run_headless): no TCP port then. A --config file may set the port (FlexibleArgumentParser._pull_args_from_config):
# it is not read, so the port is not known then.
DEFAULT_PORT = 8000
_NO_TCP_FLAGS = ("--uds", "--headless")
_SERVER_COUNT_FLAGS = ("--api-server-count", "-asc")
# Flags whose value is a secret: shown as SECRET_SHOWN (plugin_utils/_vllm_checks.py SECRETS names the same two).
_SECRET_FLAGS = ("--api-key", "--hf-token")
SECRET_SHOWN = "<not shown>"


class Server(TypedDict):
    """A vLLM API server found on the host."""

    pid: int
    start_ticks: int
    sid: int
    user: Optional[int]
    argv: List[str]  # as /proc/PID/cmdline has it, secrets replaced by SECRET_SHOWN
    command: str  # argv quoted for a shell (shlex.join)
    cwd: Optional[str]
    log_file: Optional[str]  # where its standard output goes
    cuda_visible_devices: Optional[str]  # from its environment (the one variable read there)
    listen: List[List[Any]]  # [address, port] of each listening TCP socket ([]: still loading its model)
    own_network: Optional[bool]  # in this module's network namespace (False: a container's own; None: not readable)
    host: Optional[str]  # the address its command line binds (--host; None: every address)
    port: Optional[int]  # the TCP port its command line names (vLLM's default 8000; None with --uds, --headless)
    model: Optional[str]
    served_model_name: Optional[str]
    tensor_parallel_size: int
    data_parallel_size: int
    tree: List[int]  # its descendants' PIDs
    holders: List[int]  # the PIDs of its tree that hold a GPU
    gpus: List[int]
    mig: Dict[str, List[str]]  # GPU index -> MIG UUIDs its tree holds there
    systemd_unit: Optional[str]
    container_id: Optional[str]  # the container its cgroup names (docs/owners.md)


def _after_interpreter(argv: Sequence[str]) -> List[str]:
    """`argv` from the script or `-m` on, for a Python interpreter's command line (its own options skipped: -u, -X
    utf8, -W ignore); `argv` itself for another program."""
    if not argv or not _PYTHON.match(os.path.basename(argv[0])):
        return list(argv)
    position = 1
    while position < len(argv) and argv[position].startswith("-") and argv[position] != "-m":
        position += 2 if argv[position] in ("-X", "-W") else 1
    return list(argv[position:])


def serve_args(argv: Sequence[str]) -> Optional[List[str]]:
    """The arguments after vLLM's server entry point in `argv`, or None when `argv` runs no vLLM server.

    `[python] .../vllm serve ARGS`, `python -m vllm.entrypoints.cli.main serve ARGS`,
    `python -m vllm.entrypoints.openai.api_server ARGS` (its model is --model)."""
    program = _after_interpreter(argv)
    if program[:1] == ["-m"] and len(program) > 1 and program[1] in _SERVE_MODULES:
        rest = program[2:]
        if not _SERVE_MODULES[program[1]]:
            return rest
        return rest[1:] if rest[:1] == ["serve"] else None
    if program and os.path.basename(program[0]) == "vllm" and program[1:2] == ["serve"]:
        return program[2:]
    return None


def _options(args: Sequence[str]) -> Tuple[List[str], Dict[str, List[str]]]:
    """(positional arguments, {flag: values}) of a vLLM command line, read as `--flag value...` and `--flag=value`
    (underscores as dashes, as vLLM's FlexibleArgumentParser reads them)."""
    positional: List[str] = []
    flags: Dict[str, List[str]] = {}
    current: Optional[str] = None
    for arg in args:
        if arg.startswith("-") and not re.match(r"^-[0-9.]", arg):
            name, equals, value = arg.partition("=")
            current = name.replace("_", "-") if name.startswith("--") else name
            flags[current] = [value] if equals else []
            current = None if equals else current
        elif current is not None:
            flags[current].append(arg)
        else:
            positional.append(arg)
    return positional, flags


def _size(flags: Mapping[str, List[str]], *names: str) -> int:
    for name in names:
        values = flags.get(name) or []
        if values and values[0].isdigit():
            return int(values[0])
    return 1


def described(args: Sequence[str]) -> Dict[str, Any]:
    """What a server's arguments (serve_args) say it serves: model, first served name, tensor and data parallel
    sizes (vLLM's defaults: 1)."""
    positional, flags = _options(args)
    given = flags.get("--model") or positional
    model = given[0] if given else None
    names = flags.get("--served-model-name")
    return {
        "model": model,
        "served_model_name": names[0] if names else model,
        "tensor_parallel_size": _size(flags, "--tensor-parallel-size", "-tp"),
        "data_parallel_size": _size(flags, "--data-parallel-size", "-dp"),
    }


def bound_address(args: Sequence[str]) -> Tuple[Optional[str], Optional[int]]:
    """(--host, TCP port) that a server's arguments (serve_args) bind: --port, else DEFAULT_PORT; (host, None) with
    --uds, --headless or --api-server-count 0, a --config file and no --port (the file may set it), or a --port that
    is not a number."""
    _positional, flags = _options(args)
    hosts = flags.get("--host")
    host = hosts[0] if hosts else None
    counts = [value for name in _SERVER_COUNT_FLAGS for value in (flags.get(name) or [])[:1]]
    headless = any(re.match(r"^(-[0-9]+|0+)$", value) for value in counts)  # serve.py cmd: api_server_count < 1
    if headless or any(flag in flags for flag in _NO_TCP_FLAGS):
        return host, None
    given = flags.get("--port")
    if not given:
        return host, None if "--config" in flags else DEFAULT_PORT
    return host, int(given[0]) if given[0].isdigit() else None


def hide_secrets(argv: Sequence[str]) -> List[str]:
    """`argv` with the values of --api-key and --hf-token replaced by SECRET_SHOWN."""
    shown: List[str] = []
    hide_next = False
    for arg in argv:
        name = arg.split("=", 1)[0].replace("_", "-")
        if hide_next and not arg.startswith("-"):
            shown.append(SECRET_SHOWN)
        elif name in _SECRET_FLAGS and "=" in arg:
            shown.append("%s=%s" % (arg.split("=", 1)[0], SECRET_SHOWN))
        else:
            shown.append(arg)
        hide_next = name in _SECRET_FLAGS and "=" not in arg
    return shown


def listening_sockets(proc: str = "/proc") -> Dict[str, List[Any]]:
    """{socket inode: [address, port]} of the TCP sockets that listen, IPv4 and IPv6 (/proc/net/tcp, tcp6)."""
    found: Dict[str, List[Any]] = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, "net", name)) as table:
                lines = table.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN:
                address, port = fields[1].rsplit(":", 1)
                found[fields[9]] = [_address(address), int(port, 16)]
    return found


def _address(hex_address: str) -> str:
    """The text of an address of /proc/net/tcp (IPv4: 8 hex digits, little-endian; IPv6: 32, per 32-bit word)."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return ".".join(str(byte) for byte in words)
    import ipaddress  # deferred: IPv6 listeners only

    return str(ipaddress.IPv6Address(words))


def _link(path: str) -> Optional[str]:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _socket_inodes(pid: int, proc: str) -> List[str]:
    """The inodes of the sockets process `pid` has open (socket:[INODE] links of /proc/PID/fd)."""
    directory = "%s/%d/fd" % (proc, pid)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    links = [_link(os.path.join(directory, name)) or "" for name in names]
    return [link[8:-1] for link in links if link.startswith("socket:[")]


def _python(pid: int, proc: str) -> bool:
    """Whether the process runs a Python interpreter (its executable; True when /proc/PID/exe cannot be read)."""
    exe = _link("%s/%d/exe" % (proc, pid))
    return exe is None or bool(_PYTHON.match(os.path.basename(exe.replace(" (deleted)", ""))))


def _descendants(pid: int, children: Mapping[int, List[int]]) -> List[int]:
    found: List[int] = []
    queue = list(children.get(pid, []))
    while queue:
        child = queue.pop(0)
        if child not in found:
            found.append(child)
            queue.extend(children.get(child, []))
    return sorted(found)


def _held(tree: Iterable[int], snapshot: Snapshot) -> Tuple[List[int], List[int], Dict[str, List[str]]]:
    """(holders, GPU indices, {index: MIG UUIDs}) of the processes `tree` in a gpu_facts snapshot."""
    pids = set(tree)
    holders = [h for h in snapshot.get("holders") or [] if h["pid"] in pids]
    gpus = sorted({index for h in holders for index in h.get("gpus") or []})
    mig: Dict[str, List[str]] = {}
    for holder in holders:
        for index, uuids in (holder.get("mig") or {}).items():
            mig[index] = sorted(set(mig.get(index, [])) | set(uuids))
    return sorted(h["pid"] for h in holders), gpus, mig


def _server(pid: int, stat: _proc.Stat, argv: List[str], args: List[str], listen: List[List[Any]]) -> Dict[str, Any]:
    shown = hide_secrets(argv)
    host, port = bound_address(args)
    return dict(
        described(args),
        host=host,
        port=port,
        pid=pid,
        start_ticks=stat["start_ticks"],
        sid=stat["sid"],
        argv=shown,
        command=shlex.join(shown),
        listen=listen,
    )


def _environment(pid: int, name: str, proc: str) -> Optional[str]:
    """The value of one variable of /proc/PID/environ (None when unset or unreadable); no other is read."""
    try:
        with open("%s/%d/environ" % (proc, pid), "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode("utf-8", "replace")
    return None


def _details(server: Dict[str, Any], proc: str) -> None:
    """Add the owner, working directory and log file of a server (what an operator needs to start it again)."""
    pid = server["pid"]
    try:
        server["user"] = os.stat("%s/%d" % (proc, pid)).st_uid
    except OSError:
        server["user"] = None
    server["cwd"] = _link("%s/%d/cwd" % (proc, pid))
    # Its listening sockets are read from this namespace's /proc/net/tcp: in a namespace of its own (a container on a
    # bridge network) they are not there, and its port is not this host's.
    mine, its = _link("%s/self/ns/net" % proc), _link("%s/%d/ns/net" % (proc, pid))
    server["own_network"] = None if mine is None or its is None else mine == its
    server["log_file"] = _link("%s/%d/fd/1" % (proc, pid))
    server["cuda_visible_devices"] = _environment(pid, "CUDA_VISIBLE_DEVICES", proc)
    cgroup = _owners.parse_cgroup(_owners.read_cgroup(pid, proc))
    server["systemd_unit"], server["container_id"] = cgroup["systemd_unit"], cgroup["container_id"]


def find_servers(snapshot: Snapshot, proc: str = "/proc") -> List[Server]:
    """The vLLM API servers of the host (see the module docstring), each with what its tree holds in `snapshot`."""
    stats: Dict[int, _proc.Stat] = {}
    for pid in _proc.list_pids(proc):
        stat = _proc.read_stat(pid, proc)
        if stat is not None and stat["state"] not in ("Z", "X"):
            stats[pid] = stat
    children: Dict[int, List[int]] = {}
    for pid, stat in stats.items():
        children.setdefault(stat["ppid"], []).append(pid)
    sockets = listening_sockets(proc)
    found: Dict[int, Dict[str, Any]] = {}
    for pid, stat in sorted(stats.items()):
        argv = _proc.read_argv(pid, proc) or []
        args = serve_args(argv)
        if args is not None and _python(pid, proc):
            listen = [sockets[inode] for inode in _socket_inodes(pid, proc) if inode in sockets]
            found[pid] = _server(pid, stat, argv, args, sorted(listen))
    servers: List[Server] = []
    for pid, server in found.items():
        if _launched_by(pid, stats, found):
            continue  # an API server that a launcher found here started: the launcher stands for it
        server["tree"] = _descendants(pid, children)
        server["holders"], server["gpus"], server["mig"] = _held(server["tree"], snapshot)
        _details(server, proc)
        servers.append(server)  # type: ignore[arg-type]  # every key of Server is set above
    return servers


def _launched_by(pid: int, stats: Mapping[int, _proc.Stat], found: Mapping[int, Any]) -> bool:
    """Whether an ancestor of `pid` is itself a vLLM API server of `found`."""
    seen = {pid}
    parent = stats[pid]["ppid"]
    while parent in stats and parent not in seen:
        if parent in found:
            return True
        seen.add(parent)
        parent = stats[parent]["ppid"]
    return False


def recorded(server: Mapping[str, Any], records: Mapping[str, Mapping[str, Any]]) -> Optional[str]:
    """The name of the instance whose record `server` is, or None: the role started it when its PID (or the leader
    of its session) is the (PID, start ticks) of the instance's pidfile, or when it runs in the instance's unit or
    container.

    `records`: {name: {"pidfile": (pid, start_ticks) or None, "unit": unit name, "container": the ID of its container
    or None}} of the deployed instances."""
    for name, record in sorted(records.items()):
        pidfile = record.get("pidfile")
        if pidfile and (tuple(pidfile) == (server["pid"], server["start_ticks"]) or pidfile[0] == server["sid"]):
            return name
        if record.get("unit") and server.get("systemd_unit") == record["unit"]:
            return name
        if record.get("container") and server.get("container_id") == record["container"]:
            return name
    return None
