# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Who owns a process: systemd unit, container, Kubernetes pod, Slurm job, respawning agent.

Read from the host alone, with no runtime client: /proc/PID/cgroup (the path forms each manager
writes, below), the kubelet's pod log directories, `systemctl show` and the process tree. Every
piece that is not there is None, never guessed. The path forms and their sources are in
docs/owners.md; in short (`<id>` is a 64-hex container id):

- systemd unit: the first path component ending in .service/.scope/.socket/.mount/.swap, below
  slices only: the system manager's unit (`/system.slice/vllm.service`,
  `/system.slice/system-vllm.slice/vllm@a.service`); what lies under it (a user manager's units under
  `user@UID.service`, a container's own systemd) is not the system manager's.
- docker: `docker-<id>.scope` (systemd driver; moby cmd/dockerd/daemon_systemd_unix.go gives
  runc the parent `system.slice:docker:<id>`, runc's systemd driver names it PREFIX-NAME.scope),
  `/docker/<id>` (cgroupfs driver).
- containerd: `cri-containerd-<id>.scope` (CRI plugin, systemd driver), `nerdctl-<id>.scope`;
  with the cgroupfs driver the container is a bare `<id>` and the runtime is not in the path.
- CRI-O: `crio-<id>.scope` (systemd), `crio-<id>` (cgroupfs); `crio-conmon-<id>` is its
  monitor, not a container.
- podman: `libpod-<id>.scope` (systemd manager; crun may put the payload in a `container` child),
  `/libpod_parent/libpod-<id>` (cgroupfs manager), `<unit>.service/libpod-payload-<id>` (quadlet's default
  `CgroupsMode=split`: the container inside its unit, conmon in the unit's `runtime` child);
  `libpod-conmon-<id>.scope` is the monitor.
- Kubernetes pod (kubelet pkg/kubelet/cm/cgroup_manager_linux.go): systemd driver
  `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<UID, - written _>.slice` (Guaranteed:
  `kubepods-pod<UID_>.slice`), cgroupfs driver `/kubepods/<qos>/pod<UID>` (`/kubepods/pod<UID>`).
- Slurm: cgroup/v1 `/slurm/uid_<uid>/job_<job>/step_<step>/task_<n>` (controller hierarchies),
  cgroup/v2 `/system.slice/slurmstepd.scope/job_<job>/step_<step>/user/task_<n>`
  (`<node>_slurmstepd.scope` with several slurmd per host).
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Callable, Dict, Iterable, List, Literal, Optional, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _proc

OWNER_KEYS = (
    "systemd_unit",
    "unit_restart",
    "container_id",
    "runtime",
    "pod_uid",
    "pod_namespace",
    "pod_name",
    "slurm_job",
    "agent",
)
CGROUP_KEYS = ("systemd_unit", "container_id", "runtime", "pod_uid", "slurm_job")

# The container runtimes a cgroup path names (None where the path does not say), and the agents agent_kind knows.
Runtime = Literal["docker", "containerd", "cri-o", "podman"]
AgentKind = Literal["torchrun", "ray", "mpi", "supervisord", "vllm"]


class Agent(TypedDict):
    """The nearest live respawning supervisor above a process (find_agent)."""

    pid: int
    comm: str
    cmdline: str  # space-joined
    kind: AgentKind


class Cgroup(TypedDict):
    """The owners named by /proc/PID/cgroup (parse_cgroup); None where no line says."""

    systemd_unit: Optional[str]
    container_id: Optional[str]  # 64 hex
    runtime: Optional[Runtime]
    pod_uid: Optional[str]  # with dashes
    slurm_job: Optional[str]


class Owner(TypedDict, total=False):
    """The `owner` block of a process (owner_of, OWNER_KEYS; docs/owners.md). owner_of fills every key (None where
    the host does not show it); the functions here also take blocks with some keys only (a holder read elsewhere)."""

    systemd_unit: Optional[str]
    unit_restart: Optional[str]  # the unit's Restart= setting ("no", "always", "on-failure", ...)
    container_id: Optional[str]
    runtime: Optional[Runtime]
    pod_uid: Optional[str]
    pod_namespace: Optional[str]
    pod_name: Optional[str]
    slurm_job: Optional[str]
    agent: Optional[Agent]


# owner_of's answers for one scan: ("restart", unit) -> Restart= or None, ("pod", uid) -> (namespace, name).
OwnerCache = Dict[Tuple[str, str], object]
# systemctl's answer: (rc, stdout), or None when it could not run (_run_systemctl).
SystemctlRun = Callable[[List[str]], Optional[Tuple[int, str]]]
SYSTEMCTL_TIMEOUT_S = 5
CONTAINER_PREFIX_MIN = 12
_MAX_ANCESTORS = 256

# Unit types whose cgroup holds processes (systemd.unit(5)); slices only group other units.
_UNIT_RE = re.compile(r"^[^/\s]+\.(?:service|scope|socket|mount|swap)$")
# One path component naming a container, innermost first. Monitors (conmon) are not containers.
_CONTAINER_RES = (
    (re.compile(r"^(?:crio-conmon|libpod-conmon)-[0-9a-f]{64}(?:\.scope)?$"), None),
    (re.compile(r"^docker-([0-9a-f]{64})\.scope$"), "docker"),
    (re.compile(r"^cri-containerd-([0-9a-f]{64})\.scope$"), "containerd"),
    (re.compile(r"^nerdctl-([0-9a-f]{64})\.scope$"), "containerd"),
    (re.compile(r"^crio-([0-9a-f]{64})(?:\.scope)?$"), "cri-o"),
    (re.compile(r"^libpod-(?:payload-)?([0-9a-f]{64})(?:\.scope)?$"), "podman"),
    (re.compile(r"^([0-9a-f]{64})$"), ""),  # cgroupfs: bare id; the runtime is its parent's name, if any
)
_RUNTIMES: Dict[str, Runtime] = {"docker": "docker", "containerd": "containerd", "cri-o": "cri-o", "podman": "podman"}
# Pod UIDs: RFC 4122 UUIDs (36 chars); static pods use a 32-hex config hash.
_POD_SYSTEMD_RE = re.compile(r"^kubepods(?:-(?:burstable|besteffort))?-pod([0-9a-f][0-9a-f_]{31,35})\.slice$")
_POD_CGROUPFS_RE = re.compile(r"^pod([0-9a-f][0-9a-f-]{31,35})$")
_QOS_CGROUPFS = ("kubepods", "burstable", "besteffort")
_SLURM_JOB_RE = re.compile(r"^job_([0-9]+)$")
_SLURM_V1_PARENT_RE = re.compile(r"^uid_[0-9]+$")
_SLURM_V2_PARENT_RE = re.compile(r"^(?:.+_)?slurmstepd(?:_home)?\.scope$")
# Unit type suffixes systemctl knows; a name without one means NAME.service (systemctl's name mangling).
_UNIT_SUFFIX_RE = re.compile(r"\.(?:service|socket|target|device|mount|automount|swap|timer|path|slice|scope)$")
_HEX_RE = re.compile(r"^[0-9a-f]+$")
# The stop command of each runtime, and its option for the seconds between the stop signal and SIGKILL
# (docker-stop(1) `-t`, podman-stop(1) `-t`, nerdctl stop `-t`, crictl stop `--timeout`).
_STOP_TOOLS = {"docker": "docker", "podman": "podman", "containerd": "nerdctl", "cri-o": "crictl"}
_TIMEOUT_OPTION = {"crictl": "--timeout"}
# docker-stop(1) and podman-stop(1): without -t, the stop signal, then SIGKILL after 10 seconds.
RUNTIME_STOP_TIMEOUT_S = 10


def _empty_cgroup() -> Cgroup:
    return Cgroup(systemd_unit=None, container_id=None, runtime=None, pod_uid=None, slurm_job=None)


def empty_owner() -> Owner:
    """The owner block with every piece unknown (None)."""
    return Owner(
        systemd_unit=None,
        unit_restart=None,
        container_id=None,
        runtime=None,
        pod_uid=None,
        pod_namespace=None,
        pod_name=None,
        slurm_job=None,
        agent=None,
    )


def _cgroup_lines(text: str) -> List[Tuple[str, str, str]]:
    """[(hierarchy id, controllers, path)] of a /proc/PID/cgroup text, v2 `0::` line first, then
    the `name=systemd` line, then the others in file order."""
    lines = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        lines.append((parts[0], parts[1], parts[2]))

    def rank(entry: Tuple[str, str, str]) -> int:
        if entry[0] == "0" and entry[1] == "":
            return 0
        if "name=systemd" in entry[1].split(","):
            return 1
        return 2

    return sorted(lines, key=rank)


def _unit_of(components: List[str]) -> Optional[str]:
    """The unit of the system manager that this path is in: the first component that is a unit, below slices only.
    What lies under a unit is the unit's own (a delegated subtree: a user manager's units under user@UID.service, a
    container's own systemd); a path under anything else (`/lxc.payload.c1/...`, `/docker/<id>/...`) or that climbs
    out of the reader's cgroup namespace (`..`) is in no unit of this manager."""
    for component in components:
        if _UNIT_RE.match(component):
            return component
        if not component.endswith(".slice"):
            return None
    return None


def _container_of(components: List[str]) -> Tuple[Optional[str], Optional[Runtime]]:
    for position in range(len(components) - 1, -1, -1):
        component = components[position]
        for pattern, runtime in _CONTAINER_RES:
            found = pattern.match(component)
            if not found:
                continue
            if runtime is None:  # a runtime's monitor: it is not the container
                return None, None
            if runtime == "":
                parent = components[position - 1] if position else ""
                runtime = "docker" if parent == "docker" else None
            return found.group(1), _RUNTIMES.get(runtime or "")
    return None, None


def _pod_of(components: List[str]) -> Optional[str]:
    for position in range(len(components) - 1, -1, -1):
        component = components[position]
        found = _POD_SYSTEMD_RE.match(component)
        if found:
            return found.group(1).replace("_", "-")
        found = _POD_CGROUPFS_RE.match(component)
        if found and position and components[position - 1] in _QOS_CGROUPFS:
            return found.group(1)
    return None


def _slurm_job_of(components: List[str]) -> Optional[str]:
    for position in range(len(components) - 1, 0, -1):
        found = _SLURM_JOB_RE.match(components[position])
        parent = components[position - 1]
        if found and (_SLURM_V1_PARENT_RE.match(parent) or _SLURM_V2_PARENT_RE.match(parent)):
            return found.group(1)
    return None


def parse_cgroup(text: Optional[str]) -> Cgroup:
    """Owners named by the text of /proc/PID/cgroup (cgroup v2, v1 or hybrid).

    Lines are `ID:CONTROLLERS:PATH`: v2 has the single line `0::PATH`, v1 one line per
    hierarchy (`1:name=systemd:PATH`, `4:memory:PATH`...). Each key is taken from the first line
    that names it, in the order: the `0::` line, the `name=systemd` line, the others (Slurm's v1
    plugin writes its job only in the controller hierarchies). The unit is the system manager's
    (_unit_of: below slices only); for the other keys the innermost match wins, so a prefix (a nested
    cgroup namespace, a container) does not matter.

    Returns {"systemd_unit", "container_id" (64 hex), "runtime" ("docker" | "containerd" |
    "cri-o" | "podman" | None), "pod_uid" (with dashes), "slurm_job" (str)}; None where no line
    says.
    """
    result = _empty_cgroup()
    for _hierarchy, _controllers, path in _cgroup_lines(text or ""):
        if result["systemd_unit"] is None:
            result["systemd_unit"] = _unit_of([part for part in path.split("/") if part])
        components = [part for part in path.split("/") if part and part not in (".", "..")]
        if result["container_id"] is None:
            container_id, runtime = _container_of(components)
            if container_id is not None:
                result["container_id"], result["runtime"] = container_id, runtime
        if result["pod_uid"] is None:
            result["pod_uid"] = _pod_of(components)
        if result["slurm_job"] is None:
            result["slurm_job"] = _slurm_job_of(components)
    return result


def read_cgroup(pid: int, proc: str = "/proc") -> Optional[str]:
    """Text of PROC/PID/cgroup, or None when the process is gone or unreadable."""
    try:
        with open("%s/%d/cgroup" % (proc, pid), "r") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def unit_cgroup(text: Optional[str], unit: str) -> Optional[str]:
    """The cgroup of systemd unit `unit` as a /proc/PID/cgroup text shows it: the path up to the innermost
    component named `unit`, from the first line (in parse_cgroup's order) that has one; None when none has.
    "0::/system.slice/cron.service/job" -> "/system.slice/cron.service"."""
    for _hierarchy, _controllers, path in _cgroup_lines(text or ""):
        parts = path.split("/")
        if unit in parts:
            last = len(parts) - 1 - parts[::-1].index(unit)
            return "/".join(parts[: last + 1])
    return None


def container_cgroup(text: Optional[str], container_id: str) -> Optional[str]:
    """The cgroup of container `container_id` as a /proc/PID/cgroup text shows it: the path up to the innermost
    component that names the container (parse_cgroup's forms; a monitor's is not the container), from the first line
    (in parse_cgroup's order) that has one; None when none has.
    "0::/machine.slice/libpod-<id>.scope/container" -> "/machine.slice/libpod-<id>.scope"."""
    for _hierarchy, _controllers, path in _cgroup_lines(text or ""):
        parts = path.split("/")
        for last in range(len(parts) - 1, 0, -1):
            if _container_of(parts[last : last + 1])[0] == container_id:
                return "/".join(parts[: last + 1])
    return None


def cgroup_members(path: str, proc: str = "/proc") -> List[int]:
    """PIDs of the processes in cgroup `path` (as unit_cgroup gives it) or a cgroup below it, read from every
    /proc/PID/cgroup (any of its lines: v2, or a v1 hierarchy). What `systemctl stop` ends with the unit
    (systemd.kill(5): KillMode=control-group, the default)."""
    found = []
    for pid in _proc.list_pids(proc):
        for _hierarchy, _controllers, own in _cgroup_lines(read_cgroup(pid, proc) or ""):
            if own == path or own.startswith(path + "/"):
                found.append(pid)
                break
    return sorted(found)


def pod_names(pod_uid: Optional[str], pods_log_dir: str = "/var/log/pods") -> Tuple[Optional[str], Optional[str]]:
    """(namespace, name) of the pod with UID `pod_uid`, from the kubelet's log directory.

    The kubelet writes one directory per pod, `<pods_log_dir>/<namespace>_<name>_<uid>`
    (pkg/kubelet/kuberuntime BuildPodLogsDirectory, delimiter `_`, which neither names nor
    namespaces may contain). Returns (None, None) when no such directory is there (no kubelet on
    this host, another log directory, the old `/var/log/pods/<uid>` layout).
    """
    if not pod_uid:
        return None, None
    suffix = "_" + pod_uid
    try:
        entries = os.listdir(pods_log_dir)
    except OSError:
        return None, None
    for entry in sorted(entries):
        if entry.endswith(suffix):
            parts = entry[: -len(suffix)].split("_")
            if len(parts) == 2 and all(parts):
                return parts[0], parts[1]
    return None, None


def _run_systemctl(argv: List[str]) -> Optional[Tuple[int, str]]:
    """(rc, stdout) of argv, or None when it cannot run or takes longer than SYSTEMCTL_TIMEOUT_S."""
    # Not AnsibleModule.run_command: it has no timeout, and a systemctl stuck on D-Bus must not hang a reset; and
    # module_utils here run without the module object (the snapshot also runs in benchmarks and tests).
    try:
        result = subprocess.run(  # pylint: disable=ansible-bad-function
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=SYSTEMCTL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.returncode, result.stdout.decode("utf-8", "replace")


def unit_restart(
    unit: Optional[str], systemctl: str = "systemctl", run: Optional[SystemctlRun] = None
) -> Optional[str]:
    """The unit's Restart= setting (`no`, `always`, `on-failure`, ...) or None.

    Runs `systemctl show -p Restart --value -- UNIT` (`run(argv)` -> (rc, stdout) or None replaces
    the subprocess, e.g. with AnsibleModule.run_command). None when systemctl is absent, fails
    (no systemd running), takes longer than SYSTEMCTL_TIMEOUT_S or prints nothing (units other than
    services have no Restart=). systemctl prints `no` for a service it does not know.
    """
    if not unit or not _UNIT_RE.match(unit):
        return None
    result = (run or _run_systemctl)([systemctl, "show", "-p", "Restart", "--value", "--", unit])
    if result is None or result[0] != 0:
        return None
    value = result[1].strip()
    return value if value and "\n" not in value else None


def agent_kind(comm: Optional[str], cmdline: Optional[Iterable[str]]) -> Optional[AgentKind]:
    """Kind of respawning supervisor a process is, from its comm and cmdline, or None.

    torchrun (torch.distributed.elastic: `torchrun`, `python -m torch.distributed.run|launch`),
    ray (`raylet`, processes titled `ray::...`), mpi (`mpirun`, `mpiexec`, `orted`, `prted`,
    `prterun`, `hydra_pmi_proxy`), supervisord, vllm (a `vllm serve` API server: its EngineCore
    and workers end with it).
    """
    args = list(cmdline or ())
    names = [os.path.basename(arg) for arg in args[:3]]
    comm = comm or ""
    if "torchrun" in names or comm == "torchrun":
        return "torchrun"
    for position, arg in enumerate(args[:-1]):
        if arg == "-m" and args[position + 1] in ("torch.distributed.run", "torch.distributed.launch"):
            return "torchrun"
    if comm == "raylet" or "raylet" in names[:1] or (args and args[0].startswith("ray::")):
        return "ray"
    if comm in ("mpirun", "mpiexec", "orted", "prted", "prterun", "hydra_pmi_proxy") or (
        names and names[0] in ("mpirun", "mpiexec", "orted", "prted", "prterun", "hydra_pmi_proxy")
    ):
        return "mpi"
    if comm == "supervisord" or "supervisord" in names[:2]:
        return "supervisord"
    for position, name in enumerate(names):
        if name == "vllm" and position + 1 < len(args) and args[position + 1] == "serve":
            return "vllm"
    return None


def find_agent(
    pid: int,
    read_stat: Callable[[int], Optional[_proc.Stat]] = _proc.read_stat,
    read_cmdline: Callable[[int], Optional[List[str]]] = _proc.read_argv,
) -> Optional[Agent]:
    """The nearest live ancestor of `pid` that is a known respawning supervisor (agent_kind).

    Walks the parent chain from PID's parent up (PID 1 included: supervisord is often a
    container's init); zombies are skipped, they restart nothing. Returns {"pid", "comm",
    "cmdline" (space-joined), "kind"} or None. `read_stat(pid)` -> {"comm", "state", "ppid"} or
    None, `read_cmdline(pid)` -> [str] or None.
    """
    stat = read_stat(pid)
    seen = {pid}
    while stat is not None and len(seen) < _MAX_ANCESTORS:
        parent = stat["ppid"]
        if parent <= 0 or parent in seen:
            return None
        seen.add(parent)
        stat = read_stat(parent)
        if stat is None:
            return None
        if stat["state"] in ("Z", "X"):
            continue
        cmdline = read_cmdline(parent)
        kind = agent_kind(stat["comm"], cmdline)
        if kind is not None:
            return {"pid": parent, "comm": stat["comm"], "cmdline": _proc.join_argv(cmdline or ()), "kind": kind}
    return None


def owner_of(
    pid: int,
    proc: str = "/proc",
    systemctl: str = "systemctl",
    pods_log_dir: str = "/var/log/pods",
    run: Optional[SystemctlRun] = None,
    cache: Optional[OwnerCache] = None,
) -> Owner:
    """The `owner` block of process `pid` (docs/owners.md).

    {"systemd_unit", "unit_restart", "container_id", "runtime", "pod_uid", "pod_namespace",
    "pod_name", "slurm_job", "agent"}; every piece the host does not show is None. unit_restart is
    asked of systemctl for .service units only. `cache` (a dict shared across calls) keeps
    systemctl and pod-directory answers for one scan.
    """
    cgroup = parse_cgroup(read_cgroup(pid, proc) or "")
    owner = empty_owner()
    owner["systemd_unit"] = cgroup["systemd_unit"]
    owner["container_id"], owner["runtime"] = cgroup["container_id"], cgroup["runtime"]
    owner["pod_uid"] = cgroup["pod_uid"]
    owner["slurm_job"] = cgroup["slurm_job"]
    cache = {} if cache is None else cache
    unit = owner["systemd_unit"]
    if unit and unit.endswith(".service"):
        key = ("restart", unit)
        if key not in cache:
            cache[key] = unit_restart(unit, systemctl, run)
        restart = cache[key]
        owner["unit_restart"] = restart if isinstance(restart, str) else None
    pod_uid = owner["pod_uid"]
    if pod_uid:
        key = ("pod", pod_uid)
        if key not in cache:
            cache[key] = pod_names(pod_uid, pods_log_dir)
        names = cache[key]
        owner["pod_namespace"], owner["pod_name"] = names if isinstance(names, tuple) else (None, None)
    owner["agent"] = find_agent(pid, lambda p: _proc.read_stat(p, proc), lambda p: _proc.read_argv(p, proc))
    return owner


def owner_label(owner: Optional[Owner]) -> str:
    """One bounded-cardinality label value naming the owner, for Prometheus: `pod:<uid>`,
    `container:<first 12 hex>`, `slurm_job:<id>`, `unit:<name>` (first that is known), else ""."""
    owner = owner or Owner()
    if owner.get("pod_uid"):
        return "pod:%s" % owner["pod_uid"]
    container_id = owner.get("container_id")
    if container_id:
        return "container:%s" % container_id[:CONTAINER_PREFIX_MIN]
    if owner.get("slurm_job"):
        return "slurm_job:%s" % owner["slurm_job"]
    if owner.get("systemd_unit"):
        return "unit:%s" % owner["systemd_unit"]
    return ""


def owner_words(owner: Optional[Owner]) -> str:
    """The owner of a holder in a few words, in the order of owner_label: "pod NAMESPACE/NAME" (or the pod UID),
    "docker container 4f1c3a9e0b7d" (the runtime where the path says it), "Slurm job 42", "unit vllm@a.service";
    "" when none is known (no owner block, or a block of nulls)."""
    owner = owner or Owner()
    if owner.get("pod_uid"):
        return "pod %s" % (
            "%s/%s" % (owner["pod_namespace"], owner["pod_name"]) if owner.get("pod_name") else owner["pod_uid"]
        )
    container_id = owner.get("container_id")
    if container_id:
        return " ".join(
            word for word in (owner.get("runtime"), "container", container_id[:CONTAINER_PREFIX_MIN]) if word
        )
    if owner.get("slurm_job"):
        return "Slurm job %s" % owner["slurm_job"]
    if owner.get("systemd_unit"):
        return "unit %s" % owner["systemd_unit"]
    return ""


def normalize_unit(name: object) -> str:
    """A unit as systemctl takes it: a name without a type suffix means NAME.service."""
    name = str(name).strip()
    return name if _UNIT_SUFFIX_RE.search(name) else name + ".service"


def container_ref_errors(refs: Iterable[object], known_ids: Iterable[Optional[str]] = ()) -> List[str]:
    """Problems with container references: each must be hex, >= 12 chars (CONTAINER_PREFIX_MIN) and
    at most 64, and a prefix shorter than 64 must not match two of `known_ids`. Returns [str]."""
    errors = []
    known = [cid.lower() for cid in known_ids if cid]
    for ref in refs:
        text = str(ref).strip().lower()
        if not _HEX_RE.match(text) or not CONTAINER_PREFIX_MIN <= len(text) <= 64:
            errors.append(
                "container %r: give the full 64-hex id or a prefix of %d or more hex characters"
                % (ref, CONTAINER_PREFIX_MIN)
            )
            continue
        matching = sorted(set(cid for cid in known if cid.startswith(text)))
        if len(matching) > 1:
            errors.append("container %r is ambiguous: it is a prefix of %s" % (ref, ", ".join(matching)))
    return errors


def pod_ref_matches(ref: object, owner: Owner) -> bool:
    """True when `ref` (a pod UID, with dashes or the systemd driver's `_`, or NAMESPACE/NAME) names
    the owner's pod."""
    text = str(ref).strip()
    if "/" in text:
        namespace, _slash, name = text.partition("/")
        return bool(owner.get("pod_name")) and (namespace, name) == (owner.get("pod_namespace"), owner.get("pod_name"))
    return bool(owner.get("pod_uid")) and text.replace("_", "-").lower() == owner["pod_uid"]


def mismatch(
    owner: Optional[Owner],
    units: Optional[Iterable[object]] = None,
    containers: Optional[Iterable[object]] = None,
    pods: Optional[Iterable[object]] = None,
    slurm_jobs: Optional[Iterable[object]] = None,
) -> Optional[str]:
    """Why `owner` is not selected by these owner filters, or None when it is.

    Each filter left None means "any"; a given list selects owners matching one of its items, and
    every given filter must match. units: unit names (`vllm@a` means `vllm@a.service`); containers:
    full ids or prefixes (check them first with container_ref_errors); pods: UIDs or
    NAMESPACE/NAME; slurm_jobs: job ids. Reasons: "unit not in units", "container not in
    containers", "pod not in pods", "Slurm job not in slurm_jobs".
    """
    owner = owner or Owner()
    if units is not None:
        wanted = set(normalize_unit(unit) for unit in units)
        if owner.get("systemd_unit") not in wanted:
            return "unit not in units"
    if containers is not None:
        cid = owner.get("container_id") or ""
        if not cid or not any(cid.startswith(str(ref).strip().lower()) for ref in containers if str(ref).strip()):
            return "container not in containers"
    if pods is not None:
        if not any(pod_ref_matches(ref, owner) for ref in pods):
            return "pod not in pods"
    if slurm_jobs is not None:
        if owner.get("slurm_job") is None or owner["slurm_job"] not in set(str(job).strip() for job in slurm_jobs):
            return "Slurm job not in slurm_jobs"
    return None


def matches(
    owner: Optional[Owner],
    units: Optional[Iterable[object]] = None,
    containers: Optional[Iterable[object]] = None,
    pods: Optional[Iterable[object]] = None,
    slurm_jobs: Optional[Iterable[object]] = None,
) -> bool:
    """True when every given owner filter selects `owner` (see mismatch)."""
    return mismatch(owner, units=units, containers=containers, pods=pods, slurm_jobs=slurm_jobs) is None


def restarting_unit(owner: Optional[Owner]) -> Optional[str]:
    """The systemd unit that starts this process again (a Restart= policy other than `no`), or None."""
    owner = owner or Owner()
    unit = owner.get("systemd_unit")
    return unit if unit and owner.get("unit_restart") not in (None, "no") else None


def restart_note(owner: Optional[Owner]) -> Optional[str]:
    """Why ending a process with this owner will not last, in words, or None: a unit that restarts it, a container
    or pod (whose runtime restarts it), or a live respawning agent."""
    owner = owner or Owner()
    notes = []
    if owner.get("pod_uid"):
        name = "%s/%s" % (owner["pod_namespace"], owner["pod_name"]) if owner.get("pod_name") else owner["pod_uid"]
        notes.append("it belongs to Kubernetes pod %s, whose kubelet restarts its containers" % name)
    elif container_unit(owner):
        notes.append(
            "it belongs to %s container %s, which systemd unit %s runs"
            % (owner.get("runtime") or "a", (owner.get("container_id") or "")[:12], container_unit(owner))
        )
    elif owner.get("container_id"):
        notes.append(
            "it belongs to %s container %s, whose runtime may restart it"
            % (owner.get("runtime") or "a", (owner.get("container_id") or "")[:12])
        )
    unit = restarting_unit(owner)
    if unit and not container_unit(owner):
        notes.append("systemd unit %s restarts it (Restart=%s)" % (unit, owner.get("unit_restart")))
    agent = owner.get("agent")
    # A live vLLM API server owns its engine and workers but never starts a dead worker again (vLLM shuts the engine
    # down instead): it is named in the owner block, not as a reason why ending the PID will not last.
    if agent and agent["kind"] == "ray":
        # vLLM's Ray executor (vllm/v1/executor/ray_executor_v2.py) runs its workers as actors: processes of the node's
        # raylet, not of the vLLM instance, so ending the instance's session or tree leaves them to the raylet.
        notes.append(
            "its parent raylet PID %s owns it as a Ray actor and may start it again while the actor's job "
            "lives: stop the vLLM instance that created it (its EngineCore is the job's driver; Ray then ends "
            "the job's actors), or run `ray stop`, which ends every Ray process on this host" % agent["pid"]
        )
    elif agent and agent["kind"] != "vllm":
        notes.append(
            "its parent agent PID %s (%s, %s) may start it again" % (agent["pid"], agent["comm"], agent["kind"])
        )
    return "; ".join(notes) or None


def container_unit(owner: Optional[Owner]) -> Optional[str]:
    """The system service that runs this process's container, or None: a container whose cgroup lies inside a
    `.service` unit (quadlet's `CgroupsMode=split`, `<unit>.service/libpod-payload-<id>`; `podman run --cgroups=split`
    in a unit). The unit owns the container: stopping the container alone leaves the unit to start it again
    (Restart=) or to fail. A user's manager (`user@UID.service`, rootless podman) is not such a unit."""
    owner = owner or Owner()
    unit = owner.get("systemd_unit")
    if not owner.get("container_id") or owner.get("pod_uid") or not unit or not unit.endswith(".service"):
        return None
    return None if unit.startswith("user@") else unit


def container_stop_argv(owner: Optional[Owner], timeout_s: Optional[float] = None) -> Optional[List[str]]:
    """The runtime's stop command of this process's container, as argv: ["podman", "stop", "-t", "30", "<12 hex>"]
    (docker, podman, nerdctl; crictl with --timeout); None for no container, a pod's container (the kubelet owns it) or
    a container that a unit runs (container_unit). `timeout_s`: seconds between the stop signal and SIGKILL, whole
    seconds rounded up (the runtimes take an integer); RUNTIME_STOP_TIMEOUT_S when not given."""
    owner = owner or Owner()
    container_id = owner.get("container_id")
    if not container_id or owner.get("pod_uid") or container_unit(owner):
        return None
    tool = _STOP_TOOLS.get(owner.get("runtime") or "") or "docker"
    seconds = RUNTIME_STOP_TIMEOUT_S if timeout_s is None else int(-(-max(timeout_s, 0) // 1))
    return [tool, "stop", _TIMEOUT_OPTION.get(tool, "-t"), str(seconds), container_id[:CONTAINER_PREFIX_MIN]]


def stop_command(owner: Optional[Owner], timeout_s: Optional[float] = None) -> Optional[str]:
    """The command that stops this owner for good, as an operator would type it, or None. A container's is its
    runtime's stop with `timeout_s` seconds before SIGKILL (container_stop_argv); a container that a service unit runs
    (quadlet), `systemctl stop UNIT` (the unit's own stop timeout applies)."""
    owner = owner or Owner()
    if owner.get("pod_uid"):
        if owner.get("pod_name"):
            return "kubectl delete pod -n %s %s" % (owner["pod_namespace"], owner["pod_name"])
        return "kubectl delete pod (the pod with UID %s)" % owner["pod_uid"]
    unit = container_unit(owner)
    if unit:
        return "systemctl stop %s" % unit
    argv = container_stop_argv(owner, timeout_s)
    if argv:
        return " ".join(argv)
    unit = restarting_unit(owner)
    if unit:
        return "systemctl stop %s" % unit
    agent = owner.get("agent")
    if agent and agent.get("kind") == "ray":
        return "ray stop"
    return None
