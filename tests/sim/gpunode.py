"""gpunode: create, enter and destroy simulated GPU nodes (contract: tests/sim/README.md).

A node is a PID + mount namespace whose PID 1 is ``gpusim-init`` (tests/sim/init/gpusim-init.c):
private /dev with the NVIDIA device files, private /run with /run/gpusim bound to the node's run
directory, and an ld.so cache that finds the fake ``libnvidia-ml.so.1``. Its state lives in
``$GPUNODE_ROOT/NAME/`` (default root /tmp/gpuops-sim). Standard library only, Python >= 3.9.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import math
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIM_DIR = REPO / "tests" / "sim"
BUILD_DIR = SIM_DIR / "build"
INIT_SOURCE = SIM_DIR / "init" / "gpusim-init.c"
INIT_BINARY = BUILD_DIR / "gpusim-init"
FAKENVML_DIR = SIM_DIR / "fakenvml"
FAKENVML_BUILD_SCRIPT = FAKENVML_DIR / "build.sh"
DRIVER_LIBRARY = BUILD_DIR / "libnvidia-ml.so.1"
# The variant without the _v3 process-list symbols (up --no-v3; built by fakenvml/build.sh).
DRIVER_LIBRARY_NO_V3 = BUILD_DIR / "no-v3" / "libnvidia-ml.so.1"
# The early-R535 variant whose _v3 process lists have 32-byte entries (up --v3-32).
DRIVER_LIBRARY_V3_32 = BUILD_DIR / "v3-32" / "libnvidia-ml.so.1"
DRIVER_VARIANTS = {"no-v3": DRIVER_LIBRARY_NO_V3, "v3-32": DRIVER_LIBRARY_V3_32}
VENV_PYTHON = REPO / ".venv" / "bin" / "python"

NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")
READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
UNSHARE_EXIT_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.002

# node.conf keys in file order with their defaults; "" means none (the key is left out).
CONF_DEFAULTS = {
    "gpus": "8",
    "name": "NVIDIA H100 80GB HBM3",
    "memory_total_mib": "81559",
    "minors": "",
    "reserved_mib": "529",
    "idle_used_mib": "0",
    "stray_mib": "",
    "release_latency": "0.5",
    "hang": "",
    "lost": "",
    "driver_version": "580.95.05",
    "nvml_version": "13.580.95.05",
    "cuda_driver_version": "13000",
    "persistence_mode": "1",
    "uuids": "",
    "pci_bus_ids": "",
    "mig": "",
    "mig_pending": "",
    "mig_privileged": "",
    "memory_info_v2": "",
    "memory_info": "",
    "pid_namespace": "",
    "init_seconds": "",
    "context_overhead_mib": "",
    "driver_variant": "",
    # What the driver advises per GPU (tests/sim/README.md, "Recovery"); the simulated nvidia-smi rewrites them.
    "persistence": "",
    "recovery_action": "",
    "remapped_rows": "",
    "retired_pending": "",
    "nvlink": "",
    "kernel_clients": "",
}
# `up --preset NAME`: node.conf values of a real GPU and driver; explicit `up` options override them.
# h200: measured on an NVIDIA H200 with driver 580.159.04 (tests/sim/README.md, "The H200 preset").
PRESETS = {
    "h200": {
        "name": "NVIDIA H200",
        "memory_total_mib": "143771",
        "reserved_mib": "615",
        "release_latency": "0.15",
        "context_overhead_mib": "518",
        "driver_version": "580.159.04",
        "nvml_version": "13.580.159.04",
        "cuda_driver_version": "13000",
    }
}
# The device files under /dev (and /dev/nvidia-caps) and the driver library are made at `up`: these keys
# cannot change on a running node.
FIXED_AT_UP = ("gpus", "minors", "mig", "driver_variant")

# MIG (tests/sim/README.md "MIG"): the H100 80GB GPU instance profiles as nvidia-smi mig -lgip/-lgipp shows
# them: name -> (memory slices, allowed start slices, memory MiB). Mirrors MIG_PROFILES in fakenvml.c.
MIG_PROFILES = {
    "1g.10gb": (1, (0, 1, 2, 3, 4, 5, 6), 9984),
    "1g.10gb+me": (1, (0, 1, 2, 3, 4, 5, 6), 9984),
    "1g.20gb": (2, (0, 2, 4, 6), 20096),
    "2g.20gb": (2, (0, 2, 4), 20096),
    "3g.40gb": (4, (0, 4), 40448),
    "4g.40gb": (4, (0,), 40448),
    "7g.80gb": (8, (0,), 81152),
}
MIG_DEFAULT_LAYOUT = ("1g.10gb", "2g.20gb", "3g.40gb")
MIG_SLICES = 8
MIG_MAX_DEVICES = 7
# PCI buses of the eight GPUs of an HGX H100 board; GPU i >= 8 uses PCI domain i // 8.
HGX_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
MAX_GPUS = 64

# SSH-reached nodes (`up --ssh`): material shared by every node under $GPUNODE_ROOT/ssh/ (a name no
# node may take), one sshd per node on its own loopback address 127.0.<K // 254 + 1>.<K % 254 + 1>:22.
SSH_DIR_NAME = "ssh"
SSHD = "/usr/sbin/sshd"
SSH_PORT = 22
SSH_MAX_NODES = 254 * 254
SSH_READY_TIMEOUT_S = 10.0
# Files sshd writes for pty sessions: per-node copies are bound over them inside the node.
SSH_LOGIN_RECORDS = ("/var/log/wtmp", "/var/log/btmp", "/var/log/lastlog")

# Owner cgroups (tests/sim/README.md "Owner cgroups"): each node gets a cgroup namespace rooted at its
# own cgroup CGROUP_HIERARCHY/CGROUP_PARENT/<name>.<hash> in the cgroup v1 name=systemd hierarchy (no
# controllers: moving processes there changes no limit). Never the memory/cpu/unified hierarchies.
CGROUP_HIERARCHY = Path("/sys/fs/cgroup/systemd")
CGROUP_PARENT = "gpuops-sim"
CGROUP_PATH_PATTERN = re.compile(r"(?:/[A-Za-z0-9_@:.\\-]+)+")
CGROUP_RMDIR_TIMEOUT_S = 5.0


class GpunodeError(Exception):
    """A failure reported to the user as `gpunode: MESSAGE` with exit status 1."""


# ---------------------------------------------------------------------------------------------
# node.conf


def _int_text(key: str, text: str, minimum: int = 0) -> str:
    try:
        value = int(text)
    except ValueError:
        raise GpunodeError(f"{key}: {text!r} is not an integer") from None
    if value < minimum:
        raise GpunodeError(f"{key}: {value} is below {minimum}")
    return str(value)


def _list_items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",")] if text.strip() else []


def _gpu_index_list(key: str, text: str, gpus: int) -> str:
    indices = [int(_int_text(key, item)) for item in _list_items(text)]
    for index in indices:
        if index >= gpus:
            raise GpunodeError(f"{key}: GPU index {index} out of range (node has {gpus} GPUs)")
    return ",".join(str(index) for index in indices)


def _stray_mib(text: str, gpus: int) -> str:
    entries = []
    for item in _list_items(text):
        index, sep, mib = item.partition(":")
        if not sep:
            raise GpunodeError(f"stray_mib: {item!r} is not INDEX:MiB")
        entries.append(f"{_gpu_index_list('stray_mib', index, gpus)}:{_int_text('stray_mib', mib)}")
    return ",".join(entries)


def _indexed(key: str, text: str, gpus: int, pattern: str) -> str:
    """INDEX:VALUE,... with VALUE matching `pattern`, each GPU once."""
    entries: dict[str, str] = {}
    for item in _list_items(text):
        index, sep, value = item.partition(":")
        if not sep or not re.fullmatch(pattern, value):
            raise GpunodeError(f"{key}: {item!r} is not INDEX:{pattern}")
        entries[_gpu_index_list(key, index, gpus)] = value
    return ",".join(f"{index}:{value}" for index, value in entries.items())


def _nvlink_groups(text: str, gpus: int) -> str:
    """nvlink=0+1,2+3: groups of GPUs linked directly by NVLink, each GPU in one group of two or more."""
    groups, seen = [], set()
    for item in _list_items(text):
        members = [_gpu_index_list("nvlink", member, gpus) for member in item.split("+")]
        if len(members) < 2 or seen & set(members) or len(set(members)) != len(members):
            raise GpunodeError(f"nvlink: {item!r} is not a group of two or more GPUs, each in one group")
        seen.update(members)
        groups.append("+".join(members))
    return ",".join(groups)


def _per_gpu_list(key: str, text: str, gpus: int, pattern: str) -> str:
    items = _list_items(text)
    if len(items) != gpus:
        raise GpunodeError(f"{key}: {len(items)} entries for {gpus} GPUs")
    for item in items:
        if not re.fullmatch(pattern, item):
            raise GpunodeError(f"{key}: {item!r} does not match {pattern}")
    if len(set(items)) != len(items):
        raise GpunodeError(f"{key}: entries are not distinct")
    return ",".join(items)


def mig_layout(text: str, gpus: int) -> dict[int, list[dict]]:
    """Parse `mig` ("INDEX[:PROFILE,...];..."; "INDEX" alone: the default layout, "INDEX:" none) into
    {index: [{"profile", "start", "gi", "ci"}]} ordered by GPU instance id, as the fake driver places
    them: first fit in the order given; GPU instance id from the placement (0; 1-2; 3-6; 7-14)."""
    layout = {}
    for spec in (part.strip() for part in text.split(";") if part.strip()):
        index_text, sep, profiles_text = spec.partition(":")
        index = int(_gpu_index_list("mig", index_text, gpus))
        if index in layout:
            raise GpunodeError(f"mig: GPU {index} given twice")
        profiles = _list_items(profiles_text) if sep else list(MIG_DEFAULT_LAYOUT)
        used, instances = 0, []
        for profile in profiles:
            if profile not in MIG_PROFILES:
                raise GpunodeError(f"mig: unknown profile {profile!r} (known: {', '.join(MIG_PROFILES)})")
            slices, starts, _mib = MIG_PROFILES[profile]
            for start in starts:
                mask = ((1 << slices) - 1) << start
                if not used & mask and len(instances) < MIG_MAX_DEVICES:
                    used |= mask
                    gi = {8: 0, 4: 1 + start // 4, 2: 3 + start // 2}.get(slices, 7 + start)
                    instances.append({"profile": profile, "start": start, "gi": gi, "ci": 0})
                    break
            else:
                raise GpunodeError(
                    f"mig: GPU {index}: no free placement for {profile} after {', '.join(profiles[: profiles.index(profile)]) or 'nothing'}"
                )
        layout[index] = sorted(instances, key=lambda instance: (instance["gi"], instance["ci"]))
    return layout


def _mig(text: str, gpus: int) -> str:
    mig_layout(text, gpus)
    return ";".join(part.strip() for part in text.split(";") if part.strip())


def _mig_pending(text: str, gpus: int) -> str:
    entries = []
    for item in _list_items(text):
        index, sep, mode = item.partition(":")
        if not sep or mode not in ("0", "1"):
            raise GpunodeError(f"mig_pending: {item!r} is not INDEX:0 or INDEX:1")
        entries.append(f"{_gpu_index_list('mig_pending', index, gpus)}:{mode}")
    return ",".join(entries)


def mig_cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """Minor of /dev/nvidia-caps/nvidia-cap<N> for gpu<minor>/gi<G>[/ci<C>]/access, as the driver numbers them
    in /proc/driver/nvidia-caps/mig-minors (config 1, monitor 2, then per GPU 15 GPU instances x (1 + 8))."""
    base = 3 + gpu_minor * 15 * 9 + gi * 9
    return base if ci is None else base + 1 + ci


def default_uuid(node_name: str, index: int) -> str:
    """GPU UUID of GPU `index` of node `node_name`: GPU-<8-4-4-4-12 hex>, stable across runs."""
    digest = hashlib.sha256(f"{node_name}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def default_pci_bus_id(index: int) -> str:
    """NVML-style PCI bus id (DOMAIN:BUS:DEVICE.FUNCTION) of GPU `index`, distinct per index."""
    return f"{index // len(HGX_PCI_BUSES):08X}:{HGX_PCI_BUSES[index % len(HGX_PCI_BUSES)]:02X}:00.0"


def validate_conf(conf: dict[str, str]) -> dict[str, str]:
    """Check node.conf settings {key: text}; return them normalised, in file order.

    Keys whose value is "" (none) are left out. Raises GpunodeError on an unknown key or a value
    that does not fit (wrong type, list length != gpus, GPU index out of range).
    """
    unknown = sorted(set(conf) - set(CONF_DEFAULTS))
    if unknown:
        raise GpunodeError(f"unknown node.conf key(s): {', '.join(unknown)}")
    gpus = int(_int_text("gpus", conf["gpus"], minimum=1))
    if gpus > MAX_GPUS:
        raise GpunodeError(f"gpus: at most {MAX_GPUS}")
    checks = {
        "gpus": lambda text: str(gpus),
        "name": lambda text: text,
        "memory_total_mib": lambda text: _int_text("memory_total_mib", text, minimum=1),
        "minors": lambda text: _per_gpu_list("minors", text, gpus, r"0|[1-9][0-9]{0,2}"),
        "reserved_mib": lambda text: _int_text("reserved_mib", text),
        "idle_used_mib": lambda text: _int_text("idle_used_mib", text),
        "stray_mib": lambda text: _stray_mib(text, gpus),
        "release_latency": _release_latency,
        "hang": lambda text: _matching("hang", text, r"all|nvml[A-Za-z0-9_]+"),
        "lost": lambda text: _gpu_index_list("lost", text, gpus),
        "driver_version": lambda text: _matching("driver_version", text, r"[0-9.]+"),
        "nvml_version": lambda text: _matching("nvml_version", text, r"[0-9.]+"),
        "cuda_driver_version": lambda text: _int_text("cuda_driver_version", text),
        "persistence_mode": lambda text: _matching("persistence_mode", text, r"[01]"),
        "uuids": lambda text: _per_gpu_list(
            "uuids", text, gpus, r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
        ),
        "pci_bus_ids": lambda text: _per_gpu_list(
            "pci_bus_ids", text, gpus, r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]"
        ),
        "mig": lambda text: _mig(text, gpus),
        "mig_pending": lambda text: _mig_pending(text, gpus),
        "mig_privileged": lambda text: _matching("mig_privileged", text, r"auto|0|1"),
        "memory_info_v2": lambda text: _matching("memory_info_v2", text, r"0|1"),
        "memory_info": lambda text: _matching("memory_info", text, r"supported|unsupported"),
        "pid_namespace": lambda text: _matching("pid_namespace", text, r"auto|caller|init"),
        "init_seconds": lambda text: _seconds("init_seconds", text),
        "context_overhead_mib": lambda text: _int_text("context_overhead_mib", text),
        "driver_variant": lambda text: _matching("driver_variant", text, r"no-v3|v3-32"),
        "persistence": lambda text: _indexed("persistence", text, gpus, r"[01]"),
        "recovery_action": lambda text: _indexed("recovery_action", text, gpus, r"[0-7]"),
        "remapped_rows": lambda text: _indexed("remapped_rows", text, gpus, r"[0-9]+:[0-9]+:[01]:[01]"),
        "retired_pending": lambda text: _gpu_index_list("retired_pending", text, gpus),
        "nvlink": lambda text: _nvlink_groups(text, gpus),
        "kernel_clients": lambda text: _gpu_index_list("kernel_clients", text, gpus),
    }
    normalised = {}
    for key in CONF_DEFAULTS:
        text = conf.get(key, "").strip()
        if "\n" in text:
            raise GpunodeError(f"{key}: value spans lines")
        if text:
            normalised[key] = checks[key](text)
    for key in ("minors", "uuids", "pci_bus_ids"):
        if key not in normalised:
            raise GpunodeError(f"{key} must be set")
    return normalised


def _matching(key: str, text: str, pattern: str) -> str:
    if not re.fullmatch(pattern, text):
        raise GpunodeError(f"{key}: {text!r} does not match {pattern}")
    return text


def _seconds(key: str, text: str) -> str:
    try:
        seconds = float(text)
    except ValueError:
        raise GpunodeError(f"{key}: {text!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0 or seconds > 600:
        raise GpunodeError(f"{key}: must be between 0 and 600")
    return text


def _release_latency(text: str) -> str:
    try:
        seconds = float(text)
    except ValueError:
        raise GpunodeError(f"release_latency: {text!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise GpunodeError("release_latency: must be >= 0")
    return text


def read_conf(path: Path) -> dict[str, str]:
    """Parse node.conf (one KEY=VALUE per line) into {key: text}."""
    conf = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            conf[key.strip()] = value.strip()
    return conf


def write_conf(path: Path, conf: dict[str, str]) -> None:
    """Replace node.conf atomically (temporary file + rename) with validated settings."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text("".join(f"{key}={value}\n" for key, value in conf.items()))
    os.replace(temporary, path)


# ---------------------------------------------------------------------------------------------
# builds


def _stale(output: Path, sources: list[Path]) -> bool:
    if not output.exists():
        return True
    built = output.stat().st_mtime
    return any(source.stat().st_mtime > built for source in sources)


def _build_lock():
    """Exclusive lock serialising builds of concurrent `gpunode up`s (released on close)."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    lock = open(os.open(BUILD_DIR / ".build.lock", os.O_RDONLY | os.O_CREAT, 0o644))
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def build_init(force: bool = False) -> Path:
    """Compile gpusim-init into tests/sim/build/ when the source is newer; return its path."""
    with _build_lock():
        if force or _stale(INIT_BINARY, [INIT_SOURCE]):
            temporary = INIT_BINARY.with_name(f".{INIT_BINARY.name}.{os.getpid()}")
            _run_build(["gcc", "-O2", "-Wall", "-Wextra", "-o", str(temporary), str(INIT_SOURCE)], "gpusim-init")
            os.replace(temporary, INIT_BINARY)
    return INIT_BINARY


def build_driver(force: bool = False) -> Path:
    """Run tests/sim/fakenvml/build.sh when a file of fakenvml/ is newer than the library."""
    with _build_lock():
        if not FAKENVML_BUILD_SCRIPT.exists():
            raise GpunodeError(f"fake driver not built: {FAKENVML_BUILD_SCRIPT} does not exist")
        sources = [path for path in FAKENVML_DIR.iterdir() if path.is_file()]
        if force or _stale(DRIVER_LIBRARY, sources):
            _run_build(["bash", str(FAKENVML_BUILD_SCRIPT)], "fake driver")
        if force or any(_stale(library, sources) for library in DRIVER_VARIANTS.values()):
            _run_build(["bash", str(FAKENVML_BUILD_SCRIPT)], "fake driver")
        for library in (DRIVER_LIBRARY, *DRIVER_VARIANTS.values()):
            if not library.exists():
                raise GpunodeError(f"fake driver not built: {FAKENVML_BUILD_SCRIPT} made no {library}")
    return DRIVER_LIBRARY


def _run_build(command: list[str], what: str) -> None:
    result = subprocess.run(command, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GpunodeError(f"building {what} failed ({shlex.join(command)}):\n{result.stdout}{result.stderr}")


# ---------------------------------------------------------------------------------------------
# processes


def _user_namespace_args() -> list[str]:
    """Unprivileged callers need a user namespace to own the node's namespaces."""
    return [] if os.geteuid() == 0 else ["--user", "--map-root-user"]


def _pid_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _state_and_start_time(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of process `pid`, None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], fields[19]


def _alive(pid: int, start_time: str) -> bool:
    """True while process `pid` started at `start_time` exists and is not a zombie."""
    found = _state_and_start_time(pid)
    return found is not None and found[1] == start_time and found[0] != "Z"


def init_running(info: dict) -> bool:
    """True when the node's recorded init PID still has the node's PID namespace (PIDs wrap)."""
    return _pid_namespace(info["init_pid"]) == info["pidns"]


def inside_node(info: dict) -> bool:
    """True when the calling process is itself in the node's PID namespace."""
    return _pid_namespace("self") == info["pidns"]


def node_path(info: dict, path: str) -> str:
    """PATH for the node: its bin/ directory first, then `path`."""
    bin_dir = str(Path(info["state_dir"]) / "bin")
    return path if path == bin_dir or path.startswith(bin_dir + ":") else f"{bin_dir}:{path}"


def nsenter_argv(info: dict, working_dir: str, cgroup: str | None = None) -> list[str]:
    """Command prefix that runs the rest of a command line inside the node.

    nsenter joins the node's PID and mount namespaces (and its user namespace when the node was
    made unprivileged) keeping `working_dir`; setpriv gives the command SIGTERM when nsenter dies,
    as nsenter does not forward signals. A node with owner cgroups is entered in its cgroup
    namespace too, and the command is moved into the node's root cgroup or `cgroup` (see
    cgroup_mover).
    """
    user = ["--user", "--preserve-credentials"] if info["userns"] else []
    cgroup_ns = ["--cgroup"] if info.get("cgroup") else []
    return [
        "nsenter",
        "--target",
        str(info["init_pid"]),
        *user,
        "--pid",
        "--mount",
        *cgroup_ns,
        f"--wd={working_dir}",
        "--",
        "setpriv",
        "--pdeathsig",
        "TERM",
        "--",
    ] + cgroup_mover(info, cgroup)


def cgroup_mover(info: dict, cgroup: str | None = None) -> list[str]:
    """Command prefix that moves itself (a process of the node) into the node's cgroup `cgroup`
    (a path as the node shows it, e.g. /system.slice/vllm@a.service; default: the node's root
    cgroup), creating it, then execs the rest. [] for a node without owner cgroups."""
    if not info.get("cgroup"):
        if cgroup not in (None, "/"):
            raise GpunodeError(f"node {info['name']} has no owner cgroups: {info.get('cgroup_unsupported')}")
        return []
    root = info["cgroup"]["root"]
    if cgroup in (None, "/"):
        script = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
        return ["/bin/sh", "-c", script, root]
    check_cgroup_path(cgroup)
    script = '(cd "$0" && mkdir -p ".$1") && echo $$ > "$0$1/cgroup.procs" && shift && exec "$@"'
    return ["/bin/sh", "-c", script, root, cgroup]


def check_cgroup_path(path: str) -> str:
    """`path` if it is an absolute cgroup path of plain names (no `.`/`..`, no control files)."""
    if not CGROUP_PATH_PATTERN.fullmatch(path) or any(
        part in (".", "..") or part.startswith("cgroup.") or part in ("tasks", "notify_on_release", "release_agent")
        for part in path.split("/")[1:]
    ):
        raise GpunodeError(f"invalid cgroup path {path!r} (absolute, names of [A-Za-z0-9_@:.\\-])")
    return path


def enter_command(info: dict, command: list[str], cgroup: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that run `command` inside the node with the node's PATH.

    With `cgroup` (a path as the node shows it), the command runs in that cgroup of the node.
    Raises GpunodeError when the node is not running. A caller already inside the node runs the
    command directly (moved into `cgroup` when one is given).
    """
    environment = dict(os.environ)
    environment["PATH"] = node_path(info, environment.get("PATH", os.defpath))
    if inside_node(info):
        return (cgroup_mover(info, cgroup) if cgroup else []) + list(command), environment
    if not init_running(info):
        raise GpunodeError(f"node {info['name']} is not running")
    return nsenter_argv(info, os.getcwd(), cgroup) + list(command), environment


# ---------------------------------------------------------------------------------------------
# nodes


def gpunode_root() -> Path:
    """Directory holding one state directory per node ($GPUNODE_ROOT, default /tmp/gpuops-sim)."""
    return Path(os.environ.get("GPUNODE_ROOT", "/tmp/gpuops-sim"))


def node_python() -> str:
    """Interpreter the node runs: the repository's venv Python, else the one running gpunode."""
    return str(VENV_PYTHON) if os.access(VENV_PYTHON, os.X_OK) else sys.executable


def state_dir_of(name: str) -> Path:
    """$GPUNODE_ROOT/NAME; GpunodeError if NAME is not [A-Za-z0-9_.-]+."""
    if not NAME_PATTERN.fullmatch(name) or name in (".", ".."):
        raise GpunodeError(f"invalid node name {name!r} (allowed: letters, digits, _ . -)")
    if name == SSH_DIR_NAME:
        raise GpunodeError(f"node name {name!r} is reserved ($GPUNODE_ROOT/{SSH_DIR_NAME} holds the SSH keys)")
    return gpunode_root() / name


def load_node(name: str) -> dict:
    """node.json of node `name` (what `up` printed); GpunodeError if there is no such node."""
    try:
        return json.loads((state_dir_of(name) / "node.json").read_text())
    except FileNotFoundError:
        raise GpunodeError(f"node {name} is not running (no such node)") from None


def node_running(name: str) -> bool:
    """True when node `name` exists and its init is alive (False for a dead or broken node)."""
    try:
        return init_running(load_node(name))
    except (GpunodeError, ValueError, KeyError):
        return False


def _write_ld_cache(lib_dir: Path, driver: bool) -> None:
    """Make lib_dir/ld.so.cache covering the host's library directories plus lib_dir.

    ldconfig runs in a private mount namespace with a tmpfs over /var/cache/ldconfig, so that it
    does not rewrite the host's aux cache; -X keeps it from touching symlinks in system dirs.
    """
    conf = lib_dir / "ld.so.conf"
    cache = lib_dir / "ld.so.cache"
    conf.write_text(f"include /etc/ld.so.conf\n{lib_dir}\n")
    ldconfig_path = shutil.which("ldconfig", path=f"{os.environ.get('PATH', os.defpath)}:/usr/sbin:/sbin")
    if ldconfig_path is None:
        raise GpunodeError("ldconfig not found")
    ldconfig = f"{ldconfig_path} -X -C {shlex.quote(str(cache))} -f {shlex.quote(str(conf))}"
    if os.path.isdir("/var/cache/ldconfig"):
        ldconfig = f"mount -n -t tmpfs tmpfs /var/cache/ldconfig && {ldconfig}"
    result = subprocess.run(
        ["unshare", *_user_namespace_args(), "--mount", "--", "sh", "-c", ldconfig],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise GpunodeError(f"ldconfig failed: {result.stderr.strip()}")
    listing = subprocess.run([ldconfig_path, "-p", "-C", str(cache)], capture_output=True, text=True, check=True).stdout
    sonames = {line.split()[0] for line in listing.splitlines()[1:] if line.strip()}
    if "libc.so.6" not in sonames:
        raise GpunodeError(f"{cache} does not cover the host's libraries (no libc.so.6)")
    if driver != ("libnvidia-ml.so.1" in sonames):
        raise GpunodeError(
            f"{cache} {'lacks' if driver else 'has'} libnvidia-ml.so.1"
            + ("" if driver else " (the host has an NVIDIA driver library)")
        )


def _write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _vllm_script(python: str) -> str:
    """bin/vllm: runs simvllm.cli:main() like a pip-installed console script."""
    return (
        f"#!{python}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(SIM_DIR)!r})\n"
        "from simvllm.cli import main\n"
        "sys.exit(main())\n"
    )


def _systemctl_script(python: str, state: Path) -> str:
    """bin/systemctl: the simulated systemctl (tests/sim/simsystemctl.py) for this node."""
    return (
        f"#!{python}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(SIM_DIR)!r})\n"
        "from simsystemctl import main\n"
        f"sys.exit(main(sys.argv[1:], {str(state)!r}))\n"
    )


def _nvidia_smi_script(python: str) -> str:
    """bin/nvidia-smi: the simulated nvidia-smi's reset and persistence mode (tests/sim/simsmi.py)."""
    return (
        f"#!{python}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(SIM_DIR)!r})\n"
        "from simsmi import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )


def _python_wrapper(info: dict, python: str) -> str:
    """The node's interpreter wrapper: /bin/sh doing what `gpunode exec NAME -- PYTHON` does."""
    bin_dir = shlex.quote(str(Path(info["state_dir"]) / "bin"))
    pidns = shlex.quote(info["pidns"])
    enter = " ".join('--wd="$PWD"' if arg.startswith("--wd=") else shlex.quote(arg) for arg in nsenter_argv(info, "."))
    return f"""#!/bin/sh
# Interpreter of simulated GPU node {info['name']} (written by gpunode up): {python} inside the node.
case $PATH in {bin_dir}|{bin_dir}:*) ;; *) PATH={bin_dir}:$PATH; export PATH ;; esac
namespaces=$(readlink /proc/self/ns/pid /proc/{info['init_pid']}/ns/pid 2>/dev/null)
case $namespaces in
{pidns}|{pidns}"
"*) exec {shlex.quote(python)} "$@" ;;
*"
"{pidns}) exec {enter} {shlex.quote(python)} "$@" ;;
esac
echo "gpunode: node {info['name']} is not running" >&2
exit 1
"""


def proc_driver_information(conf: dict[str, str], index: int) -> str:
    """/proc/driver/nvidia/gpus/<bus>/information of GPU `index`, in the format of the kernel module
    (open-gpu-kernel-modules kernel-open/nvidia/nv-procfs.c, nv_procfs_read_gpu_info; release build)."""
    domain, bus, device_function = conf["pci_bus_ids"].split(",")[index].split(":")
    device, function = device_function.split(".")
    return (
        "Model: \t\t %s\n" % conf["name"]
        + "IRQ:   \t\t %d\n" % (128 + index)
        + "GPU UUID: \t %s\n" % conf["uuids"].split(",")[index]
        + "Video BIOS: \t 96.00.99.00.01\n"
        + "Bus Type: \t PCIe\n"
        + "DMA Size: \t 52 bits\n"
        + "DMA Mask: \t 0xfffffffffffff\n"
        + "Bus Location: \t %04x:%02x:%02x.%x\n" % (int(domain, 16), int(bus, 16), int(device, 16), int(function, 16))
        + "Device Minor: \t %s\n" % conf["minors"].split(",")[index]
        + "GPU Firmware: \t %s\n" % conf["driver_version"]
        + "GPU Excluded:\t No\n"
    )


def write_proc_driver(directory: Path, conf: dict[str, str]) -> None:
    """Write the node's /proc/driver (bound there by gpusim-init): nvidia/version and, per GPU,
    nvidia/gpus/<domain:bus:device.function>/information, the directory named as the kernel module
    names it (%04x:%02x:%02x.%1x, lower case; NVML writes the same bus id upper case, 8-digit domain)."""
    gpus_dir = directory / "nvidia" / "gpus"
    gpus_dir.mkdir(parents=True)
    (directory / "nvidia" / "version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (gpusim)\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n" % conf["driver_version"]
    )
    for index in range(int(conf["gpus"])):
        text = proc_driver_information(conf, index)
        location = re.search(r"^Bus Location: \t (\S+)$", text, re.M).group(1)
        (gpus_dir / location).mkdir()
        (gpus_dir / location / "information").write_text(text)
    # The MIG capabilities of every host, MIG or not (src/nvidia/arch/nvalloc/unix/src/os.c osRmCapRegisterSys):
    # config, root's alone (/dev/nvidia-caps/nvidia-cap1), and monitor, everyone's (nvidia-cap2).
    capabilities = directory / "nvidia" / "capabilities" / "mig"
    write_capability(capabilities / "config", 1, 0o400)
    write_capability(capabilities / "monitor", 2, 0o444)


def write_capability(path: Path, cap_minor: int, mode: int) -> None:
    """A capability file of /proc/driver/nvidia/capabilities as kernel-open/nvidia/nv-caps.c writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"DeviceFileMinor: {cap_minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")


def _read_ready_line(ready_fd: int, deadline: float) -> str:
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([ready_fd], [], [], remaining)[0]:
            break
        chunk = os.read(ready_fd, 64)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def cgroup_refusal() -> str | None:
    """Why this process cannot give nodes owner cgroups, or None if it can: it needs root and a
    cgroup v1 hierarchy named systemd mounted at CGROUP_HIERARCHY."""
    if os.geteuid() != 0:
        return "owner cgroups need root"
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError as error:
        return f"cannot read /proc/self/mountinfo: {error}"
    for line in mounts:
        fields, _sep, tail = line.partition(" - ")
        fields, tail = fields.split(), tail.split()
        if (
            len(fields) > 4
            and fields[4] == str(CGROUP_HIERARCHY)
            and len(tail) > 2
            and tail[0] == "cgroup"
            and "name=systemd" in tail[2].split(",")
        ):
            return None
    return f"no cgroup v1 name=systemd hierarchy at {CGROUP_HIERARCHY}"


def node_cgroup_root(state: Path) -> Path:
    """The node's own cgroup: CGROUP_HIERARCHY/CGROUP_PARENT/<name>.<hash of its state dir>."""
    digest = hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:8]
    return CGROUP_HIERARCHY / CGROUP_PARENT / f"{state.name}.{digest}"


def remove_node_cgroups(root: Path, timeout: float = CGROUP_RMDIR_TIMEOUT_S) -> None:
    """Remove the node's cgroup `root` and every cgroup under it (bottom-up rmdir), retrying while
    exiting processes leave them; GpunodeError naming what is left after `timeout` s."""
    if root.parent != CGROUP_HIERARCHY / CGROUP_PARENT:
        raise GpunodeError(f"refusing to remove {root}: not a node cgroup")
    deadline = time.monotonic() + timeout
    while root.exists():
        for directory, _subdirectories, _files in os.walk(root, topdown=False):
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                pass
            except OSError:
                break  # busy: a process (or a child cgroup) is still there
        if root.exists() and time.monotonic() > deadline:
            left = sorted(
                {
                    line
                    for directory, _sub, _files in os.walk(root)
                    for line in Path(directory, "cgroup.procs").read_text().split()
                }
            )
            raise GpunodeError(f"cgroup {root} still holds processes {', '.join(left) or '(none listed)'}")
        if root.exists():
            time.sleep(POLL_INTERVAL_S)


def _start_init(
    state: Path, minors: list[str], reap: bool, cgroup_root: Path | None = None
) -> tuple[subprocess.Popen, int]:
    """Start the node's namespaces and init; return (unshare process, init's PID on the host).

    With `cgroup_root`, unshare first moves itself into that cgroup and makes a cgroup namespace
    there: the node's processes see paths relative to it in /proc/PID/cgroup.
    """
    ready_read, ready_write = os.pipe()
    mover = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup_root)] if cgroup_root else []
    command = [
        *mover,
        "unshare",
        *_user_namespace_args(),
        "--pid",
        "--mount",
        *(["--cgroup"] if cgroup_root else []),
        "--fork",
        "--kill-child",
        "--",
        str(INIT_BINARY),
        "--state-dir",
        str(state),
        "--ready-fd",
        str(ready_write),
        "--minors",
        ",".join(minors),
    ]
    if not reap:
        command.append("--no-reap")
    with open(state / "node.log", "ab") as log:
        unshare = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, pass_fds=(ready_write,)
        )
    os.close(ready_write)
    try:
        line = _read_ready_line(ready_read, time.monotonic() + READY_TIMEOUT_S)
    finally:
        os.close(ready_read)
    ready = re.fullmatch(r"ready ([0-9]+)", line)
    if not ready:
        unshare.kill()
        unshare.wait()
        log_text = (state / "node.log").read_text(errors="replace").strip()
        raise GpunodeError(f"node did not start (unshare exit {unshare.returncode}): {log_text}")
    return unshare, int(ready.group(1))


def create_node(name: str, conf: dict[str, str], driver: bool, reap: bool, ssh: bool = False) -> dict:
    """Start node `name` with node.conf settings `conf`; return its description (node.json).

    With `ssh`, the node also runs its own sshd (see start_sshd). Raises GpunodeError if a running
    node has that name, a build fails, the node does not become ready within READY_TIMEOUT_S, or
    (ssh) sshd is missing, not root, or does not listen within SSH_READY_TIMEOUT_S. A dead node's
    leftover state is removed first.
    """
    if ssh and os.geteuid() != 0:
        raise GpunodeError("--ssh needs root (sshd's privilege separation)")
    if ssh and not os.access(SSHD, os.X_OK):
        raise GpunodeError(f"--ssh: {SSHD} is not installed (scripts/bench/ensure_tools.sh sshd installs it)")
    state = state_dir_of(name)
    conf = validate_conf(conf)
    if state.exists():
        if node_running(name):
            raise GpunodeError(f"node {name} already exists and is running")
        destroy_node(name)
    build_init()
    if driver:
        build_driver()
    gpunode_root().mkdir(parents=True, exist_ok=True)
    try:
        state.mkdir()
    except FileExistsError:
        raise GpunodeError(f"node {name} is being created by another gpunode") from None
    try:
        info = _populate_and_start(name, state, conf, driver, reap)
    except BaseException:
        shutil.rmtree(state, ignore_errors=True)
        if cgroup_refusal() is None:
            remove_node_cgroups(node_cgroup_root(state))
        raise
    if ssh:
        try:
            info["ssh"] = start_sshd(info)
        except BaseException:
            destroy_node(name)
            raise
        _write_node_json(info)
    return info


def _populate_and_start(name: str, state: Path, conf: dict[str, str], driver: bool, reap: bool) -> dict:
    run_dir, lib_dir, bin_dir = state / "run", state / "lib", state / "bin"
    for directory in (run_dir, run_dir / "proc", lib_dir, bin_dir):
        directory.mkdir()
    for shared in (run_dir / "contexts", run_dir / "released"):
        shared.mkdir()
        shared.chmod(0o1777)
    write_conf(run_dir / "node.conf", conf)
    if driver:
        library = DRIVER_VARIANTS.get(conf.get("driver_variant") or "", DRIVER_LIBRARY)
        shutil.copy2(library, lib_dir / DRIVER_LIBRARY.name)
    _write_ld_cache(lib_dir, driver)
    python = node_python()
    _write_executable(bin_dir / "vllm", _vllm_script(python))
    _write_executable(bin_dir / "systemctl", _systemctl_script(python, state))
    refusal = cgroup_refusal()
    cgroup_root = None
    if refusal is None:
        cgroup_root = node_cgroup_root(state)
        cgroup_root.mkdir(parents=True, exist_ok=True)

    minors = conf["minors"].split(",")
    write_proc_driver(state / "proc-driver", conf)
    write_proc_driver_mig(state / "proc-driver", conf)
    unshare, init_pid = _start_init(state, minors, reap, cgroup_root)
    info = {
        "name": name,
        "init_pid": init_pid,
        "pidns": _pid_namespace(init_pid),
        "state_dir": str(state),
        "run_dir": str(run_dir),
        "python": str(state / "python"),
        "gpus": [
            {
                "index": index,
                "minor": int(minor),
                "uuid": uuid,
                "pci_bus_id": bus_id,
                "name": conf["name"],
                "memory_total_mib": int(conf["memory_total_mib"]),
            }
            for index, (minor, uuid, bus_id) in enumerate(
                zip(minors, conf["uuids"].split(","), conf["pci_bus_ids"].split(","))
            )
        ],
        "driver": driver,
        "release_latency": float(conf["release_latency"]),
        "reap": reap,
        "userns": bool(_user_namespace_args()),
        "cgroup": {"hierarchy": str(CGROUP_HIERARCHY), "root": str(cgroup_root)} if cgroup_root else None,
        "cgroup_unsupported": refusal,
        "init_start_time": (_state_and_start_time(init_pid) or ("", ""))[1],
        "unshare_pid": unshare.pid,
        "unshare_start_time": (_state_and_start_time(unshare.pid) or ("", ""))[1],
        "log": str(state / "node.log"),
    }
    layout = mig_layout(conf.get("mig", ""), int(conf["gpus"]))
    if layout:
        info["mig"] = {
            str(index): [
                dict(
                    instance,
                    caps=[
                        mig_cap_minor(int(minors[index]), instance["gi"]),
                        mig_cap_minor(int(minors[index]), instance["gi"], instance["ci"]),
                    ],
                )
                for instance in instances
            ]
            for index, instances in layout.items()
        }
    info["driver_variant"] = conf.get("driver_variant") or "default"
    _write_executable(state / "python", _python_wrapper(info, python))
    _write_node_json(info)
    if layout:
        _make_mig_caps(info)
    return info


def write_proc_driver_mig(directory: Path, conf: dict[str, str]) -> None:
    """The MIG part of the node's /proc/driver (MIG user guide, "Device Nodes and Capabilities"):
    nvidia-caps/mig-minors ("config 1", "monitor 2", "gpu<minor>/gi<G>[/ci<C>]/access <N>" for every
    possible instance of the node's GPUs) and, for the instances that exist, nvidia/capabilities/
    gpu<minor>/mig/gi<G>/access and .../ci<C>/access ("DeviceFileMinor: N" ...: the minor of
    /dev/nvidia-caps/nvidia-cap<N>; format of open-gpu-kernel-modules kernel-open/nvidia/nv-caps.c)."""
    layout = mig_layout(conf.get("mig", ""), int(conf["gpus"]))
    if not layout:
        return
    minors = [int(minor) for minor in conf["minors"].split(",")]
    lines = ["config 1", "monitor 2"]
    for minor in sorted(minors):
        for gi in range(15):
            lines.append(f"gpu{minor}/gi{gi}/access {mig_cap_minor(minor, gi)}")
            lines.extend(f"gpu{minor}/gi{gi}/ci{ci}/access {mig_cap_minor(minor, gi, ci)}" for ci in range(8))
    (directory / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    (directory / "nvidia-caps" / "mig-minors").write_text("\n".join(lines) + "\n")

    def access(path: Path, cap_minor: int) -> None:
        write_capability(path, cap_minor, 0o444)

    capabilities = directory / "nvidia" / "capabilities"
    for index, instances in layout.items():
        gpu_dir = capabilities / f"gpu{minors[index]}" / "mig"
        for instance in instances:
            gi_dir = gpu_dir / f"gi{instance['gi']}"
            access(gi_dir / "access", mig_cap_minor(minors[index], instance["gi"]))
            access(
                gi_dir / f"ci{instance['ci']}" / "access", mig_cap_minor(minors[index], instance["gi"], instance["ci"])
            )


def _make_mig_caps(info: dict) -> None:
    """/dev/nvidia-caps/nvidia-cap<N> of the GPU and compute instance of every MIG device in the node's private /dev
    (empty regular files, mode 0444 as the driver's DeviceFileMode 292; config and monitor, nvidia-cap1 and -cap2,
    are on every node: gpusim-init makes them)."""
    names = [
        f"nvidia-cap{minor}"
        for instances in info["mig"].values()
        for instance in instances
        for minor in instance["caps"]
    ]
    script = "mkdir -p -m 0755 /dev/nvidia-caps && cd /dev/nvidia-caps && for f in \"$@\"; do : > \"$f\" && chmod 0444 \"$f\"; done"
    argv, environment = enter_command(info, ["sh", "-c", script, "sh", *names])
    result = subprocess.run(
        argv, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        destroy_node(info["name"])
        raise GpunodeError(f"could not make /dev/nvidia-caps in node {info['name']}: {result.stderr.strip()}")


def _write_node_json(info: dict) -> None:
    state = Path(info["state_dir"])
    temporary = state / ".node.json.tmp"
    temporary.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(temporary, state / "node.json")


# ---------------------------------------------------------------------------------------------
# nodes reached over SSH


def ssh_dir() -> Path:
    """$GPUNODE_ROOT/ssh: keys, known_hosts and the minimal .bashrc shared by every SSH node."""
    return gpunode_root() / SSH_DIR_NAME


def _ssh_lock():
    """Exclusive lock serialising address allocation and sshd starts (released on close)."""
    directory = ssh_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = open(os.open(directory / ".lock", os.O_RDONLY | os.O_CREAT, 0o600))
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def _keygen(path: Path, comment: str) -> None:
    if not path.exists():
        _run_build(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], f"SSH key {path}")


def _ssh_material() -> dict[str, Path]:
    """Create, once, the shared SSH files (call with the SSH lock held); return their paths.

    One host key for every node (a changing key would make ssh warn or refuse), one client key
    authorized on every node, a known_hosts file matching every loopback address, and the
    minimal .bashrc bound over root's inside the nodes (bash runs ~/.bashrc for every SSH command).
    """
    directory = ssh_dir()
    paths = {
        "host_key": directory / "ssh_host_ed25519_key",
        "client_key": directory / "id_ed25519",
        "authorized_keys": directory / "authorized_keys",
        "known_hosts": directory / "known_hosts",
        "bashrc": directory / "bashrc",
    }
    _keygen(paths["host_key"], "gpunode-host")
    _keygen(paths["client_key"], "gpunode-client")
    host_public = (directory / "ssh_host_ed25519_key.pub").read_text().split()
    # Running nodes' sshds read these: replace them only when they differ, and atomically.
    for key, text in (
        ("authorized_keys", (directory / "id_ed25519.pub").read_text()),
        ("known_hosts", f"127.* {host_public[0]} {host_public[1]}\n"),
        ("bashrc", "# ~/.bashrc of simulated GPU nodes (gpunode up --ssh): nothing to run per SSH command.\n"),
    ):
        if not paths[key].exists() or paths[key].read_text() != text:
            temporary = paths[key].with_name(f".{paths[key].name}.{os.getpid()}.tmp")
            temporary.write_text(text)
            os.replace(temporary, paths[key])
    return paths


def ssh_address(number: int) -> str:
    """Loopback address of SSH node slot `number` (0 -> 127.0.1.1, 254 -> 127.0.2.1...)."""
    return f"127.0.{number // 254 + 1}.{number % 254 + 1}"


def _free_ssh_address() -> str:
    """First loopback address no running node uses and where port SSH_PORT can be bound."""
    taken = set()
    for name in node_names():
        try:
            info = load_node(name)
        except (GpunodeError, ValueError):
            continue
        if "ssh" in info and init_running(info):
            taken.add(info["ssh"]["host"])
    for number in range(SSH_MAX_NODES):
        address = ssh_address(number)
        if address in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, SSH_PORT))
            except OSError:
                continue  # something else listens there (a host sshd on 0.0.0.0:22 takes every one)
        return address
    raise GpunodeError(f"no free loopback address for port {SSH_PORT} (a host sshd listening on 0.0.0.0:22?)")


def _sshd_config(info: dict, address: str, material: dict[str, Path]) -> str:
    path = f"{Path(info['state_dir']) / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return "\n".join(
        [
            f"# sshd of simulated GPU node {info['name']} (written by gpunode up --ssh)",
            f"ListenAddress {address}:{SSH_PORT}",
            f"HostKey {material['host_key']}",
            f"AuthorizedKeysFile {material['authorized_keys']}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "UseDNS no",
            # The keys live under $GPUNODE_ROOT, which may be in /tmp (mode 1777).
            "StrictModes no",
            "PidFile none",
            # Ansible's forks open many connections at once; the default (10:30:100) drops some.
            "MaxStartups 64:30:128",
            "MaxSessions 64",
            "PrintMotd no",
            "PrintLastLog no",
            "LogLevel ERROR",
            f"SetEnv PATH={path}",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def start_sshd(info: dict) -> dict:
    """Start an sshd inside running node `info`, listening on its own loopback address, port 22.

    sshd runs in the foreground as an orphan of the node's init (so every SSH session lands in the
    node's PID and mount namespaces) with a private /run/sshd, the minimal .bashrc bound over
    root's and per-node login records bound over the host's. Returns {"host", "port", "user",
    "private_key", "known_hosts", "config", "log"}. Raises GpunodeError when sshd does not
    accept connections within SSH_READY_TIMEOUT_S (its log is in the message).
    """
    state = Path(info["state_dir"])
    node_ssh = state / "ssh"
    node_ssh.mkdir(mode=0o700, exist_ok=True)
    config, log = node_ssh / "sshd_config", node_ssh / "sshd.log"
    binds = []
    home_bashrc = Path(os.path.expanduser("~root")) / ".bashrc"
    with _ssh_lock():
        material = _ssh_material()
        address = _free_ssh_address()
        config.write_text(_sshd_config(info, address, material))
        if home_bashrc.exists():
            binds.append((material["bashrc"], home_bashrc))
        for record in SSH_LOGIN_RECORDS:
            if os.path.exists(record):
                copy = node_ssh / os.path.basename(record)
                copy.touch()
                binds.append((copy, Path(record)))
        script = "".join(
            f"mount -n --bind {shlex.quote(str(source))} {shlex.quote(str(target))} || exit 1\n"
            for source, target in binds
        )
        script += (
            f"mkdir -p /run/sshd && chmod 0755 /run/sshd || exit 1\n"
            f"exec setsid -f {SSHD} -D -e -f {shlex.quote(str(config))} </dev/null >>{shlex.quote(str(log))} 2>&1\n"
        )
        result = subprocess.run(
            nsenter_argv(info, "/") + ["/bin/sh", "-c", script],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise GpunodeError(f"starting sshd in node {info['name']} failed: {result.stderr.strip()}")
        _wait_listening(address, log)
    return {
        "host": address,
        "port": SSH_PORT,
        "user": "root",
        "private_key": str(material["client_key"]),
        "known_hosts": str(material["known_hosts"]),
        "config": str(config),
        "log": str(log),
    }


def _wait_listening(address: str, log: Path) -> None:
    deadline = time.monotonic() + SSH_READY_TIMEOUT_S
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            if probe.connect_ex((address, SSH_PORT)) == 0:
                return
        # sshd logs only errors (LogLevel ERROR): anything logged before it listens is fatal.
        logged = log.read_text(errors="replace").strip() if log.exists() else ""
        if logged:
            raise GpunodeError(f"sshd on {address}:{SSH_PORT} did not start: {logged}")
        if time.monotonic() > deadline:
            raise GpunodeError(
                f"sshd on {address}:{SSH_PORT} accepted no connection within {SSH_READY_TIMEOUT_S:.0f} s"
            )
        time.sleep(POLL_INTERVAL_S)


def _wait_gone(pid: int, start_time: str, timeout: float) -> bool:
    """Poll until process `pid` has exited (zombie or gone); False if `timeout` s passed first."""
    deadline = time.monotonic() + timeout
    while _alive(pid, start_time):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_INTERVAL_S)
    return True


def destroy_node(name: str) -> bool:
    """End every process of node `name` and remove its state; False if there was no such node.

    SIGKILL to the init ends every process of the node's PID namespace and frees its mount
    namespace; unshare, which waits for it, reaps it and exits (SIGKILLed if it does not, e.g. when
    stopped). Raises GpunodeError if a process outlives SIGKILL for STOP_TIMEOUT_S.
    """
    state = state_dir_of(name)
    if not state.exists():
        return False
    try:
        info = json.loads((state / "node.json").read_text())
    except (OSError, ValueError):
        info = None  # `up` failed or is still writing it: nothing was recorded to stop
    if info is not None:
        init = (info["init_pid"], info["init_start_time"])
        unshare = (info["unshare_pid"], info["unshare_start_time"])
        if init_running(info):
            _kill(info["init_pid"])
        if not _wait_gone(*init, STOP_TIMEOUT_S):
            raise GpunodeError(f"node {name}: init {init[0]} did not exit after SIGKILL")
        if not _wait_gone(*unshare, UNSHARE_EXIT_TIMEOUT_S):
            _kill(info["unshare_pid"])
            if not _wait_gone(*unshare, STOP_TIMEOUT_S):
                raise GpunodeError(f"node {name}: unshare {unshare[0]} did not exit after SIGKILL")
    cgroup_root = Path(info["cgroup"]["root"]) if info and info.get("cgroup") else node_cgroup_root(state)
    if cgroup_root.exists():
        remove_node_cgroups(cgroup_root)
    shutil.rmtree(state)
    return True


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def node_names() -> list[str]:
    """Names of the nodes that have a state directory, sorted."""
    root = gpunode_root()
    if not root.is_dir():
        return []
    return sorted(
        entry.name
        for entry in root.iterdir()
        if entry.is_dir() and NAME_PATTERN.fullmatch(entry.name) and entry.name != SSH_DIR_NAME
    )


def inventory_text(names: list[str]) -> str:
    """Ansible INI inventory: group `gpunodes`, one host per node, with its connection vars.

    A node started with --ssh is reached over SSH (its loopback address, the shared client key and
    known_hosts, pipelining) and runs the venv's Python directly; others use the local connection
    with the node's interpreter wrapper.

    gpuops_nvidia_venv names the Python the collection's modules run with (plugins/plugin_utils/_interpreter.py):
    over SSH the repository's venv, as on a host that prepare_hosts.yml made ready (one module start per task, not
    a missing /opt/gpuops-nvidia/venv tried first); empty (no venv) on a local-connection node, whose modules must run
    through its interpreter wrapper, inside the node, and never with a Python of this machine.
    """
    lines = ["[gpunodes]"]
    python = node_python()
    for name in names:
        info = load_node(name)
        if "ssh" in info:
            ssh = info["ssh"]
            host_vars = {
                "ansible_host": ssh["host"],
                "ansible_port": str(ssh["port"]),
                "ansible_user": ssh["user"],
                "ansible_ssh_private_key_file": ssh["private_key"],
                "ansible_ssh_common_args": f"-o UserKnownHostsFile={ssh['known_hosts']} -o StrictHostKeyChecking=yes",
                "ansible_ssh_pipelining": "true",
                "ansible_python_interpreter": python,
                "gpuops_nvidia_venv": str(VENV_PYTHON.parent.parent) if python == str(VENV_PYTHON) else "",
            }
        else:
            host_vars = {
                "ansible_connection": "local",
                "ansible_python_interpreter": info["python"],
                "gpuops_nvidia_venv": "",
            }
        lines.append(" ".join([name] + [f"{key}={shlex.quote(value)}" for key, value in host_vars.items()]))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# command line


def _up(args: argparse.Namespace) -> int:
    if not os.access(VENV_PYTHON, os.X_OK):
        # A node without the venv runs the collection's modules with a Python that lacks their libraries, and its
        # inventory is one that prepare_hosts.yml refuses: say what to run first instead.
        raise GpunodeError(
            f"{VENV_PYTHON} does not exist yet: run `make setup` first (it makes the virtual environment whose Python "
            "the nodes run), then `tests/sim/gpunode up` again"
        )
    gpus = args.gpus
    conf = dict(CONF_DEFAULTS)
    conf.update(PRESETS.get(args.preset or "", {}))
    given = {
        "name": args.model_name,
        "memory_total_mib": args.memory_mib,
        "reserved_mib": args.reserved_mib,
        "release_latency": args.release_latency,
        "context_overhead_mib": args.context_overhead_mib,
    }
    conf.update({key: str(value) for key, value in given.items() if value is not None})
    conf.update(
        {
            "gpus": str(gpus),
            "minors": args.minors if args.minors is not None else ",".join(map(str, range(gpus))),
            "idle_used_mib": str(args.idle_used_mib),
            "stray_mib": args.stray_mib,
            "hang": args.hang,
            "lost": args.lost,
            "uuids": ",".join(default_uuid(args.name, index) for index in range(gpus)),
            "pci_bus_ids": ",".join(default_pci_bus_id(index) for index in range(gpus)),
            "mig": ";".join(args.mig or []),
            "driver_variant": "no-v3" if args.no_v3 else "v3-32" if args.v3_32 else "",
        }
    )
    if args.no_v3 and args.v3_32:
        raise GpunodeError("--no-v3 and --v3-32 exclude each other")
    info = create_node(args.name, conf, driver=not args.no_driver, reap=not args.no_reap, ssh=args.ssh)
    if args.nvidia_smi:
        # The simulated nvidia-smi (-pm, --gpu-reset) on the node's PATH (tests/sim/README.md, "Recovery").
        _write_executable(Path(info["state_dir"]) / "bin" / "nvidia-smi", _nvidia_smi_script(node_python()))
        info["nvidia_smi"] = True
        _write_node_json(info)
    print(json.dumps(info, indent=2))
    return 0


def _exec(args: argparse.Namespace) -> int:
    command, cgroup = list(args.command), args.cgroup
    # `exec NAME --cgroup PATH -- CMD`: argparse leaves options after NAME in the remainder
    if command[:1] == ["--cgroup"] and len(command) > 1:
        cgroup, command = command[1], command[2:]
    elif command[:1] and command[0].startswith("--cgroup="):
        cgroup, command = command[0].split("=", 1)[1], command[1:]
    command = command[1:] if command[:1] == ["--"] else command
    if not command:
        raise GpunodeError("exec: no command given")
    argv, environment = enter_command(load_node(args.name), command, cgroup)
    try:
        os.execvpe(argv[0], argv, environment)
    except OSError as error:
        raise GpunodeError(f"exec {argv[0]}: {error.strerror}") from None


def _set(args: argparse.Namespace) -> int:
    info = load_node(args.name)
    conf_path = Path(info["run_dir"]) / "node.conf"
    conf = dict(CONF_DEFAULTS)
    conf.update(read_conf(conf_path))
    for assignment in args.assignments:
        key, sep, value = assignment.partition("=")
        if not sep:
            raise GpunodeError(f"set: {assignment!r} is not KEY=VALUE")
        if key in FIXED_AT_UP:
            raise GpunodeError(f"set: {key} is fixed when the node is made (gpunode up)")
        if key not in CONF_DEFAULTS:
            raise GpunodeError(f"set: unknown key {key!r} (known: {', '.join(CONF_DEFAULTS)})")
        conf[key] = value
    write_conf(conf_path, validate_conf(conf))
    return 0


def _down(args: argparse.Namespace) -> int:
    if args.all == bool(args.names):
        raise GpunodeError("down: give node names or --all")
    for name in node_names() if args.all else args.names:
        if not destroy_node(name):
            print(f"gpunode: no node {name} (nothing to do)", file=sys.stderr)
    return 0


def _inventory(args: argparse.Namespace) -> int:
    sys.stdout.write(inventory_text(args.names))
    return 0


def _list(args: argparse.Namespace) -> int:
    for name in node_names():
        print(f"{name}\t{'running' if node_running(name) else 'dead'}")
    return 0


def _build(args: argparse.Namespace) -> int:
    print(build_init(force=True))
    print(build_driver(force=True))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpunode", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command_name", required=True)

    up = commands.add_parser("up", help="create a node and print its description (JSON)")
    up.add_argument("name")
    up.add_argument("--gpus", type=int, default=int(CONF_DEFAULTS["gpus"]))
    up.add_argument("--preset", choices=sorted(PRESETS), help="a real GPU's figures (h200); options override them")
    up.add_argument("--model-name", help="default %s" % CONF_DEFAULTS["name"])
    up.add_argument("--memory-mib", type=int, help="default %s" % CONF_DEFAULTS["memory_total_mib"])
    up.add_argument("--minors", help="comma-separated minor numbers (default 0..N-1)")
    up.add_argument("--reserved-mib", type=int, help="default %s" % CONF_DEFAULTS["reserved_mib"])
    up.add_argument("--idle-used-mib", type=int, default=int(CONF_DEFAULTS["idle_used_mib"]))
    up.add_argument("--stray-mib", default="", help="INDEX:MiB,... memory that never frees")
    up.add_argument("--release-latency", help="seconds (default %s)" % CONF_DEFAULTS["release_latency"])
    up.add_argument(
        "--context-overhead-mib", type=int, help="MiB the driver adds to every context's own (default 0; h200: 518)"
    )
    up.add_argument("--no-driver", action="store_true", help="no libnvidia-ml.so.1 in the node")
    up.add_argument("--hang", default="", help="NVML function that blocks forever (all: every call)")
    up.add_argument("--lost", default="", help="GPU indices that answer NVML_ERROR_GPU_IS_LOST")
    up.add_argument("--no-reap", action="store_true", help="init never reaps: zombies stay")
    up.add_argument("--ssh", action="store_true", help="run an sshd in the node on its own loopback address (root)")
    up.add_argument(
        "--nvidia-smi", action="store_true", help="put the simulated nvidia-smi (-pm, --gpu-reset) on the node's PATH"
    )
    up.add_argument(
        "--mig",
        action="append",
        metavar="INDEX[:PROFILE,...]",
        help="MIG on GPU INDEX with these instances (INDEX alone: 1g.10gb,2g.20gb,3g.40gb); repeatable",
    )
    up.add_argument("--no-v3", action="store_true", help="driver library without the _v3 process-list functions")
    up.add_argument(
        "--v3-32",
        action="store_true",
        help="driver library of early R535 (535.43.02-535.86.05): 32-byte _v3 process-list entries",
    )
    up.set_defaults(handler=_up)

    exec_ = commands.add_parser("exec", help="run a command inside a node")
    exec_.add_argument("name")
    exec_.add_argument("--cgroup", help="run CMD in this cgroup of the node (a path as the node shows it)")
    exec_.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD...")
    exec_.set_defaults(handler=_exec)

    set_ = commands.add_parser("set", help="edit a running node's node.conf")
    set_.add_argument("name")
    set_.add_argument("assignments", nargs="+", metavar="KEY=VALUE")
    set_.set_defaults(handler=_set)

    down = commands.add_parser("down", help="end a node's processes and remove its state")
    down.add_argument("names", nargs="*")
    down.add_argument("--all", action="store_true")
    down.set_defaults(handler=_down)

    inventory = commands.add_parser("inventory", help="print an Ansible INI inventory of nodes")
    inventory.add_argument("names", nargs="+")
    inventory.set_defaults(handler=_inventory)

    commands.add_parser("list", help="list nodes and their status").set_defaults(handler=_list)
    commands.add_parser("build", help="build gpusim-init and the fake driver").set_defaults(handler=_build)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except GpunodeError as error:
        print(f"gpunode: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
