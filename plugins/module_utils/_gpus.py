# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One view of the host's GPUs and their holders, GPU selection, and protection rules.

Shared by gpu_facts, gpu_kill and gpu_wait: `Inspector.snapshot()` asks NVML (bounded by
a deadline) and scans /proc, then merges both; `select_gpus()` turns the `gpus` option into
NVML indices; `protection()` says why a holder must never be signalled.
"""
from __future__ import annotations

import os
import re
import traceback

from ansible_collections.gpuops.nvidia.plugins.module_utils import _holders, _nvml, _procscan

try:
    import psutil
except ImportError:
    psutil = None
    PSUTIL_IMPORT_ERROR = traceback.format_exc()
else:
    PSUTIL_IMPORT_ERROR = None

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None

# Daemons that hold GPUs legitimately; never signalled unless the operator says so explicitly.
# Matched against the process name (comm) and the basename of argv[0].
PROTECTED_NAMES = (
    "nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "nv-fabricmanager", "nvidia-fabricmanager",
    "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "Xorg", "Xwayland", "X",
    "nvidia-device-plugin", "gpu-feature-discovery", "nvidia-mig-manager", "nvidia-smi",
)

# Options shared by every module that selects GPUs and asks the driver.
SELECTION_ARGS = dict(
    gpus=dict(type="list", elements="raw"),
    driver_timeout=dict(type="float", default=10.0),
)


class SelectionError(ValueError):
    """Bad input: an unknown GPU, an invalid regex, a negative time... Nothing was signalled."""


def missing_libraries():
    """[(package name, traceback)] of the Python libraries this host lacks."""
    missing = []
    if PYNVML_IMPORT_ERROR:
        missing.append(("nvidia-ml-py", PYNVML_IMPORT_ERROR))
    if PSUTIL_IMPORT_ERROR:
        missing.append(("psutil", PSUTIL_IMPORT_ERROR))
    return missing


def check_libraries(module, missing_required_lib):
    """Fail the module with Ansible's missing-library message, naming this host's interpreter."""
    import socket
    import sys
    for package, trace in missing_libraries():
        module.fail_json(msg="%s (host %s, interpreter %s)" % (missing_required_lib(package), socket.gethostname(), sys.executable),
                         exception=trace)


def check_nonnegative(**values):
    """Raise SelectionError naming each option whose value (seconds, MiB) is negative."""
    bad = ["%s=%s" % (name, value) for name, value in sorted(values.items()) if value is not None and value < 0]
    if bad:
        raise SelectionError("must not be negative: %s" % ", ".join(bad))


class Inspector:
    """Snapshots of GPUs and holders for one module run.

    Inspector(driver_timeout=10.0, proc="/proc"); snapshot() -> dict (see `snapshot`); close().
    The NVML worker is started on the first snapshot and kept for the next ones.
    """

    def __init__(self, driver_timeout=10.0, proc="/proc"):
        self.proc = proc
        self.driver_timeout = driver_timeout
        self._query = _nvml.DriverQuery(pynvml)

    def own_pids(self):
        """This process and its NVML worker: they hold device files but are not holders."""
        return {os.getpid(), self._query.pid} - {None}

    def read_driver(self, timeout=None):
        """NVML reading (see _nvml.read_driver) with the driver's state as a dict; never raises on driver trouble."""
        try:
            return self._query.read(self.driver_timeout if timeout is None else min(timeout, self.driver_timeout))
        except _nvml.NvmlTimeout as exc:
            return {"available": False, "error": str(exc), "timed_out": True, "gpus": [],
                    "driver_version": None, "nvml_version": None, "cuda_driver_version": None}

    def snapshot(self, timeout=None):
        """Ask NVML, scan /proc, merge.

        Returns _holders.merge()'s dict plus "driver": {"available", "error", "timed_out", "driver_version",
        "nvml_version", "cuda_driver_version"}.
        """
        driver = self.read_driver(timeout)
        scan = _procscan.scan_holders(self.proc, skip_pids=self.own_pids())
        view = _holders.merge(driver, scan, psutil, self.proc, exclude_pids=self.own_pids())
        view["driver"] = {key: driver.get(key) for key in ("available", "error", "driver_version", "nvml_version", "cuda_driver_version")}
        view["driver"]["timed_out"] = bool(driver.get("timed_out"))
        return view

    def close(self):
        self._query.close()


def select_gpus(requested, view):
    """NVML indices selected by the `gpus` option (indices or UUIDs; None/empty = all).

    Returns a sorted list of indices, or None for "all GPUs" (which also works when no
    index <-> minor map is known). Raises SelectionError for an unknown index or UUID,
    or when specific GPUs are asked for but neither NVML nor /proc/driver/nvidia can map them.
    """
    if not requested:
        return None
    if not view["gpus"]:
        raise SelectionError("cannot select GPUs %s: no NVML and no /proc/driver/nvidia here to map indices to "
                             "minor numbers; select all GPUs (omit gpus)" % (list(requested),))
    by_uuid = {gpu["uuid"]: gpu["index"] for gpu in view["gpus"] if gpu.get("uuid")}
    indices = {gpu["index"] for gpu in view["gpus"]}
    selected = set()
    for item in requested:
        text = str(item).strip()
        if text.isdigit() and int(text) in indices:
            selected.add(int(text))
        elif text in by_uuid:
            selected.add(by_uuid[text])
        else:
            raise SelectionError("unknown GPU %r: this host has indices %s and UUIDs %s"
                                 % (item, sorted(indices), sorted(by_uuid)))
    return sorted(selected)


def compile_match(pattern):
    """Compile the `match` regex, or raise SelectionError with the regex error."""
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise SelectionError("invalid regex in match %r: %s" % (pattern, exc))


def ancestors(pid=None, proc="/proc"):
    """PIDs of `pid` (default: this process) and all its ancestors up to PID 1."""
    chain = set()
    current = os.getpid() if pid is None else pid
    while current and current not in chain:
        chain.add(current)
        stat = _procscan.read_stat(current, proc)
        current = stat["ppid"] if stat else 0
    return chain


def protection(holder, own_chain, exclude=(), include_protected=False):
    """Why `holder` must not be signalled, or None.

    Never: PID 1, kernel threads, this process and its ancestors (the Ansible process chain
    and the SSH session). By default also the daemons of PROTECTED_NAMES and the names in
    `exclude`; `include_protected=True` lifts PROTECTED_NAMES (never `exclude`).
    """
    pid = holder["pid"]
    if pid == 1:
        return "PID 1 (init)"
    if pid in own_chain:
        return "this module or one of its ancestors (Ansible, the SSH session)"
    if holder.get("kernel_thread"):
        return "kernel thread"
    excluded = _matching_names(holder, exclude)
    if excluded:
        return "excluded by the exclude option (%s)" % ", ".join(excluded)
    daemons = [] if include_protected else _matching_names(holder, PROTECTED_NAMES)
    if daemons:
        return "protected GPU daemon (%s)" % ", ".join(daemons)
    return None


def _matching_names(holder, names):
    """The names in `names` that are this process's name: its comm (which the kernel cuts to
    15 bytes) or the basename of its argv[0]."""
    comm = holder.get("comm") or ""
    cmdline = holder.get("cmdline") or ""
    argv0 = os.path.basename(cmdline.split(" ", 1)[0]) if cmdline else ""
    return sorted({name for name in names if name and (comm == name[:15] or argv0 == name)})


def holders_of(view, indices):
    """Holders of the selected GPUs, from a snapshot.

    indices None (all GPUs) also takes the control-only holders (processes that hold only
    /dev/nvidiactl or /dev/nvidia-uvm: they use the driver, and may own UVM memory, but no
    single GPU); specific indices take the holders of any of those GPUs.
    """
    if indices is None:
        return list(view["holders"])
    wanted = set(indices)
    return [h for h in view["holders"] if wanted & set(h["gpus"])]
