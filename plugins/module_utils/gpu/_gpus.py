# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One view of the host's GPUs and their holders: the snapshot.

Shared by gpu_facts, gpu_kill and gpu_wait: `Inspector.snapshot()` asks NVML (bounded by a
deadline), scans /proc (all of it, or only the PIDs the driver lists where their memory explains
the GPUs), reads the identity of the processes found, and hands everything to the pure
`_holders.merge`. What is selected among the holders is decided in `_select`.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import pwd
import traceback
from typing import TYPE_CHECKING, Any, Callable, Collection, Dict, List, Optional, Set, Tuple, cast

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _holders, _nvml, _options, _proc, _shapes

if TYPE_CHECKING:
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._procscan import DeviceHandles

# _procscan (the /proc device-file scan), _owners and _recovery are imported where a look uses them: Ansible ships
# module_utils as source, compiled on every module run, and a look at a clean host (most runs across an inventory)
# scans nothing and describes no owner.

# psutil describes holders only: a look that finds none (a clean host, most runs across an inventory) does not
# import it (about 8 ms of the module's CPU); its presence is checked here, the import is in Inspector.snapshot.
PSUTIL_IMPORT_ERROR = None if importlib.util.find_spec("psutil") else "No module named 'psutil'"

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR: Optional[str] = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None

# Options shared by every module that selects GPUs and asks the driver.
SELECTION_ARGS = dict(gpus=dict(type="list", elements="raw"), **_options.spec(_options.GPU, "driver_timeout"))
# Used memory (MiB) that the driver's lists may leave unexplained on a GPU before processes that only hold its
# device file count as its holders: the idle floor of max_used_mib (docs/attribution.md).
DEFAULT_TOLERANCE_MIB = int(_options.default("max_used_mib"))
# The inode of the initial PID namespace: fixed by the kernel (include/linux/proc_ns.h PROC_PID_INIT_INO).
PROC_PID_INIT_INO = 0xEFFFFFFC


def initial_pid_namespace(proc: str = "/proc") -> bool:
    """True when the processes of `proc` see the initial PID namespace (the host's, not a container's):
    stat of PROC/self/ns/pid gives the namespace's inode."""
    try:
        return os.stat(os.path.join(proc, "self", "ns", "pid")).st_ino == PROC_PID_INIT_INO
    except OSError:
        return False


def missing_libraries() -> List[Tuple[str, str]]:
    """[(package name, traceback)] of the Python libraries this host lacks."""
    missing = []
    if PYNVML_IMPORT_ERROR:
        missing.append(("nvidia-ml-py", PYNVML_IMPORT_ERROR))
    if PSUTIL_IMPORT_ERROR:
        missing.append(("psutil", PSUTIL_IMPORT_ERROR))
    return missing


def check_libraries(module: Any, missing_required_lib: Callable[[str], str]) -> None:
    """Fail the module with Ansible's missing-library message, naming this host's interpreter."""
    import socket
    import sys

    for package, trace in missing_libraries():
        module.fail_json(
            msg="%s (host %s, interpreter %s)" % (missing_required_lib(package), socket.gethostname(), sys.executable),
            exception=trace,
        )


def minor_map(
    driver: Optional[_shapes.Reading], proc: str = "/proc"
) -> Tuple[List[_shapes.GpuTable], Optional[_shapes.IndexSource]]:
    """Index/minor table of the GPUs: [{"index", "minor", "uuid", "name", "pci_bus_id"}] and its source.

    From NVML when the driver answered (nvmlDeviceGetMinorNumber); otherwise from the kernel
    module's /proc/driver/nvidia/gpus/*/information (indices in PCI bus order, NVML's default);
    otherwise [] (no mapping: GPUs can then only be selected all together).
    Returns (gpus, source) with source "nvml", "proc_driver" or None.
    """
    if driver and driver.get("available"):
        gpus: List[Dict[str, Any]] = [
            {k: gpu.get(k) for k in ("index", "minor", "uuid", "name", "pci_bus_id")} for gpu in driver["gpus"]
        ]
        if any(gpu["minor"] is None for gpu in gpus):
            _complete_from_proc_driver(gpus, proc)
        return cast(List[_shapes.GpuTable], gpus), "nvml"
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _procscan

    gpus = cast(List[Dict[str, Any]], _procscan.proc_driver_minors(proc))
    if gpus:
        for index, gpu in enumerate(gpus):
            gpu["index"] = index
        return cast(List[_shapes.GpuTable], gpus), "proc_driver"
    return [], None


def _complete_from_proc_driver(gpus: List[Dict[str, Any]], proc: str) -> None:
    """Fill in the minor, UUID, name and PCI bus id of the GPUs that NVML answered with an error from the kernel
    module's /proc/driver/nvidia/gpus. A GPU that fell off the bus (Xid 79) is counted by NVML, which then answers
    every call on it with NVML_ERROR_GPU_IS_LOST ("Unable to determine the device handle for GPU ...: GPU is lost"),
    while the kernel module keeps its entry; without its minor, the processes that hold its device file could not
    be told. The kernel's list is in PCI bus order, as NVML enumerates; it is used only where it has as many GPUs as
    NVML and agrees with NVML on the minor of every GPU that answered."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _procscan

    known = _procscan.proc_driver_minors(proc)
    if len(known) != len(gpus) or any(gpu["minor"] not in (None, entry["minor"]) for gpu, entry in zip(gpus, known)):
        return
    for gpu, entry in zip(gpus, known):
        if gpu["minor"] is None:
            for key in ("minor", "uuid", "name", "pci_bus_id"):
                if gpu[key] is None:
                    gpu[key] = entry[key]


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def process_details(psutil: Any, pid: int, proc: str = "/proc") -> Optional[_shapes.Process]:
    """Identity and description of one process, or None when it is gone.

    Returns {"pid", "ppid", "pgid", "sid", "comm", "state", "start_ticks"} from /proc/PID/stat,
    and {"user", "uid", "cmdline" (str: /proc/PID/cmdline joined by spaces, trailing blanks removed, "" for a zombie),
    "start_time" (ISO 8601, UTC)} from psutil (None where access is denied).
    """
    # One source per fact. /proc/PID/stat (_proc.read_stat) for the identity: ppid, pgid, sid, state and the
    # start ticks that pin a PID; psutil has no start ticks, and the scan, pidfiles and the kill loop use the same
    # reader. psutil for the description of a process on GPU hosts, in one oneshot(): uid, create time (boot time
    # plus the start ticks, which psutil reads once and caches) and cmdline, with its per-process errors (gone,
    # zombie, access denied) mapped below. The modules that run without psutil (detached_process, vllm_drain) and
    # the owner walk read cmdline from /proc with _proc.read_argv/read_cmdline.
    stat = _proc.read_stat(pid, proc)
    if stat is None:
        return None
    details = cast(Dict[str, Any], stat)
    details.update(pid=pid, user=None, uid=None, cmdline=None, start_time=None)
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            details["uid"] = process.uids().real
            details["user"] = _user(details["uid"])
            details["start_time"] = datetime.datetime.fromtimestamp(
                process.create_time(), datetime.timezone.utc
            ).isoformat()
        try:
            details["cmdline"] = _proc.join_argv(process.cmdline())
        except psutil.ZombieProcess:
            details["cmdline"] = ""
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        pass
    return cast(_shapes.Process, details)


def context_groups(view: Dict[str, Any], proc: str = "/proc") -> None:
    """Give each GPU of a merged `view` its "context_groups": the holders of its exited creators' contexts, grouped by
    the device files they share (_shared_files.groups: one group per creator whose files they inherited); [] where
    it carries none, None where the kernel does not tell. One holder needs no kcmp."""
    for gpu in view["gpus"]:
        key = str(gpu["index"])
        pids = [h["pid"] for h in view["holders"] if key in (h.get("contexts_of") or {})]
        if len(pids) < 2:
            gpu["context_groups"] = [pids] if pids else []
            continue
        from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _shared_files

        gpu["context_groups"] = _shared_files.groups(pids, proc)


class Inspector:
    """Snapshots of GPUs and holders for one module run.

    Inspector(driver_timeout=10.0, proc="/proc"); snapshot() -> dict (see `snapshot`); close().
    The NVML worker is started on the first snapshot and kept for the next ones.
    """

    def __init__(self, driver_timeout: float = _options.default("driver_timeout"), proc: str = "/proc") -> None:
        self.proc = proc
        self.driver_timeout = driver_timeout
        self._query = _nvml.DriverQuery(pynvml)

    def own_pids(self) -> Set[int]:
        """This process and its NVML worker: they hold device files but are not holders."""
        return cast(Set[int], {os.getpid(), self._query.pid} - {None})

    def read_driver(self, timeout: Optional[float] = None, advice: bool = False) -> _shapes.Reading:
        """NVML reading (see _nvml.read_driver) with the driver's state as a dict; never raises on driver trouble."""
        try:
            return self._query.read(
                self.driver_timeout if timeout is None else min(timeout, self.driver_timeout), advice=advice
            )
        except (_nvml.NvmlTimeout, _nvml.NvmlWorkerError) as exc:
            return {
                "available": False,
                "error": str(exc),
                "timed_out": isinstance(exc, _nvml.NvmlTimeout),
                "gpus": [],
                "driver_version": None,
                "nvml_version": None,
                "cuda_driver_version": None,
            }

    def snapshot(
        self,
        timeout: Optional[float] = None,
        scope: _shapes.Scope = "full",
        indices: Optional[Collection[int]] = None,
        tolerance_mib: int = DEFAULT_TOLERANCE_MIB,
        owners: Optional[bool] = None,
        recovery: bool = False,
    ) -> _shapes.Snapshot:
        """Ask NVML, scan /proc, merge (see _holders.merge), with "driver", "index_source" and "scan" added.

        scope "full" scans every process (facts: device users are reported too). scope "listed" scans only the
        PIDs the driver lists when their memory explains every GPU of `indices` (None = all): ending and waiting
        then need no full /proc scan; any GPU with unexplained or unknown memory makes it a full scan.
        "scan" says which was done ("full" or "listed").
        `owners` (default: with a full scan) adds each holder's and device user's `owner` block (_owners.owner_of:
        systemd unit and its Restart=, container, pod, Slurm job, respawning agent); the waits' repeated looks skip it.
        `recovery` gives each GPU its "recovery" (_recovery.recovery: the driver's advice, the Xids of the kernel log,
        what it needs); the waits' looks skip it.
        """
        driver = self.read_driver(timeout, advice=recovery)
        table, index_source = minor_map(driver, self.proc)
        own = self.own_pids()
        # Where the lists' numbers are another namespace's, a process here is never found by its number: scan all.
        foreign = _holders.numbers_foreign(driver, initial_pid_namespace(self.proc))
        listed = _listed_pids(driver, indices, tolerance_mib) if scope == "listed" and not foreign else None
        view = self._merge(driver, table, own, listed, tolerance_mib)
        if listed is not None and any(gpu["exited"] for gpu in view["gpus"]):
            # A listed creator has exited (or its number was reused): its context's holders are found by a full scan.
            listed = None
            view = self._merge(driver, table, own, None, tolerance_mib)
        described = view["holders"] + view["device_users"]
        if described and (owners or (owners is None and listed is None)):
            # Imported here: a look without owners (every poll of a wait, check_gpus) or without processes (a clean
            # host) spares the module the compilation of _owners, which Ansible ships as source.
            from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._owners import owner_of

            cache: Dict[Any, Any] = {}
            for process in described:
                process["owner"] = owner_of(process["pid"], self.proc, cache=cache)
        context_groups(view, self.proc)
        for holder in view["holders"]:
            holder["parent"] = self._parent(holder["ppid"]) if holder["ppid"] > 1 else None
        view["index_source"] = index_source
        view["scan"] = "full" if listed is None else "listed"
        view["driver"] = {key: driver.get(key) for key in _shapes.DRIVER_KEYS}
        view["driver"]["timed_out"] = bool(driver.get("timed_out"))
        if recovery:
            from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _recovery

            _recovery.recovery(view["gpus"], driver.get("advice", []), self.proc)
        return cast(_shapes.Snapshot, view)

    def _parent(self, ppid: int) -> Optional[_shapes.Parent]:
        """A holder's parent: its PID, comm and command line (what tells a torchrun agent or a Ray raylet from
        vLLM's EngineCore in the next step's words); None where it is gone."""
        stat = _proc.read_stat(ppid, self.proc)
        if stat is None:
            return None
        return {"pid": ppid, "comm": stat["comm"], "cmdline": _proc.read_cmdline(ppid, self.proc)}

    def _merge(
        self,
        driver: _shapes.Reading,
        table: List[_shapes.GpuTable],
        own: Set[int],
        listed: Optional[Set[int]],
        tolerance_mib: int,
    ) -> Dict[str, Any]:
        """Scan /proc (every process, or the `listed` PIDs) and merge it with the reading."""
        problems: List[str] = []
        scan = _scan(self.proc, own, listed, problems)
        wanted = set(scan) | {item["pid"] for gpu in driver.get("gpus", []) for item in gpu.get("processes", [])}
        processes = {}
        if wanted - own:
            import psutil
        for pid in sorted(wanted - own):
            details = process_details(psutil, pid, self.proc)
            if details is not None:
                processes[pid] = details
        modes = [gpu.get("mig_mode") for gpu in driver.get("gpus", [])]
        caps = None
        if any(mode.get("current") for mode in modes if mode):
            from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _procscan

            caps = _procscan.cap_map(self.proc)
        view = cast(
            Dict[str, Any],
            _holders.merge(
                driver,
                table,
                scan,
                processes,
                tolerance_mib,
                exclude_pids=own,
                caps=caps,
                initial_pidns=initial_pid_namespace(self.proc),
            ),
        )
        # Scan workers that did not finish (a process stuck in the driver), and NVML workers left behind.
        view["scan_problems"] = problems + [
            "the NVML worker (PID %d) was left behind, stuck in the driver" % pid for pid in self._query.left_behind
        ]
        return view

    def close(self) -> Optional[int]:
        return self._query.close()


def _scan(proc: str, own: Set[int], listed: Optional[Set[int]], problems: List[str]) -> Dict[int, DeviceHandles]:
    """The /proc scan of a look (_procscan): every process but `own` (listed None), or the `listed` PIDs; {} where the
    driver lists none (nothing to scan: _procscan is not imported)."""
    if listed is not None and not listed - own:
        return {}
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _procscan

    if listed is None:
        return _procscan.scan_holders(proc, skip_pids=own, problems=problems)
    return _procscan.scan_pids(sorted(listed - own), proc)


def _listed_pids(driver: _shapes.Reading, indices: Optional[Collection[int]], tolerance_mib: int) -> Optional[Set[int]]:
    """The PIDs the driver lists on any GPU when its lists explain the memory of every GPU of `indices` (None = all,
    _holders.lists_explain); else None (a full scan is needed)."""
    if not driver.get("available") or not driver.get("gpus"):
        return None
    pids: Set[int] = set()
    for gpu in driver["gpus"]:
        pids.update(item["pid"] for item in gpu.get("processes", []))
        if (indices is None or gpu["index"] in indices) and not _holders.lists_explain(gpu, driver, tolerance_mib):
            return None
    return pids
