# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The guard's node_exporter textfile: GPU memory, holders, orphans and vLLM states of one host (docs/guard.md).

Prometheus text exposition format 0.0.4: base units (bytes, seconds), one HELP and TYPE per family, label values
escaped (backslash, double quote, newline). Written atomically: a temporary file in the same directory, then a
rename, so node_exporter never reads half a file.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Tuple, cast

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _nvml, _shapes

if TYPE_CHECKING:
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._orphans import Orphan

# A sample's labels, in order: [(name, value)].
Labels = List[Tuple[str, object]]
# {family (without PREFIX): [(labels, value)]}: what samples() returns and render() writes.
Samples = Dict[str, List[Tuple[Labels, float]]]
# The states of a vLLM instance (_vllm_stall).
VllmState = Literal["healthy", "stalled", "down", "unknown"]

MIB = 1024 * 1024
PREFIX = "gpuops_nvidia_guard_"
TIMESTAMP = PREFIX + "last_run_timestamp_seconds"

# (name, help) in the order written; every family is a gauge.
FAMILIES = (
    ("last_run_timestamp_seconds", "Unix time of the guard's last look at this host."),
    ("driver_ok", "1 when the NVIDIA driver answered the guard's last look in time, else 0."),
    ("driver_translates_pids", "1 when the driver lists PIDs in the caller's PID namespace (535.113.01 and later)."),
    ("gpu_memory_used_bytes", "GPU memory used (NVML memory info v2: reserved memory excluded; v1 includes it)."),
    ("gpu_memory_reserved_bytes", "GPU memory the driver reserves (NVML memory info v2)."),
    ("gpu_memory_unexplained_bytes", "Used GPU memory that no process listed by the driver explains."),
    ("gpu_memory_tolerance_bytes", "Unexplained memory below this is not counted (max_used_mib plus v1 reserved)."),
    ("gpu_holders", "Processes holding the GPU's memory."),
    ("gpu_orphaned_holders", "Holders whose server or job is gone (docs/guard.md)."),
    ("orphan_memory_bytes", "Memory an orphaned holder holds on a GPU, per process (pid, start_ticks: its identity)."),
    (
        "gpu_recovery_action",
        "The driver's recovery action for the GPU (NVML field 230): 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, "
        "4 drain and reset, 5 recover IMEX domain, 6 bus reset, 7 system reboot (docs/recovery.md).",
    ),
    ("gpu_xid_errors", "Xid errors of the GPU in the kernel log within 24 hours and since its last reset, per Xid."),
    ("vllm_state", "State of a vLLM instance: 1 for its state (healthy, stalled, down, unknown), 0 for the others."),
    ("vllm_requests_running", "Requests running in a vLLM instance at the end of the guard's watch."),
)
VLLM_STATES: Tuple[VllmState, ...] = ("healthy", "stalled", "down", "unknown")


def escape(value: object) -> str:
    """A label value as the text format writes it."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Sequence[Tuple[str, object]]) -> str:
    return "{%s}" % ",".join('%s="%s"' % (key, escape(value)) for key, value in pairs) if pairs else ""


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def _gpu_samples(gpu: _shapes.Gpu, orphans: Sequence[Orphan]) -> Samples:
    """{family: [(labels, value)]} of one GPU."""
    ident: Labels = [("gpu", gpu["index"]), ("uuid", gpu.get("uuid") or "")]
    out: Samples = {}
    figures: Mapping[str, Any] = gpu  # read by key name below
    reported = gpu.get("memory_supported") is not False and not gpu.get("error")
    for family, key in (
        ("gpu_memory_used_bytes", "memory_used_mib"),
        ("gpu_memory_reserved_bytes", "memory_reserved_mib"),
        ("gpu_memory_unexplained_bytes", "unexplained_mib"),
        ("gpu_memory_tolerance_bytes", "tolerance_mib"),
    ):
        if reported and figures.get(key) is not None:
            out.setdefault(family, []).append((ident, figures[key] * MIB))
    out.setdefault("gpu_holders", []).append((ident, len(gpu.get("holder_pids") or [])))
    _recovery_samples(ident, figures.get("recovery"), out)
    mine = [orphan for orphan in orphans if gpu["index"] in orphan["gpus"]]
    out.setdefault("gpu_orphaned_holders", []).append((ident, len(mine)))
    # The exited creators' listed memory (MiB), where the driver reports it.
    held = cast(
        Dict[int, int],
        {item["pid"]: item["used_mib"] for item in gpu.get("exited") or [] if item.get("used_mib") is not None},
    )
    for orphan in mine:
        mib = orphan["memory_mib"].get(str(gpu["index"]))
        if mib is None:  # a context shared with others: the exited creator's listed memory
            mib = sum(held.values())
        labels = ident + [
            ("pid", orphan["pid"]),
            ("start_ticks", orphan["start_ticks"]),
            ("comm", orphan["comm"]),
            ("reason", orphan["reason"]),
            ("owner", orphan["owner_label"]),
        ]
        out.setdefault("orphan_memory_bytes", []).append((labels, mib * MIB))
    return out


def _recovery_samples(ident: Labels, recovery: Optional[Mapping[str, Any]], out: Samples) -> None:
    """The driver's recovery action (where it answers) and the count of each Xid, of a look with recovery."""
    if not recovery:
        return
    action = recovery.get("action")
    if action in _nvml.ACTIONS:
        out.setdefault("gpu_recovery_action", []).append((ident, _nvml.ACTIONS.index(action)))
    counts: Dict[int, int] = {}
    for xid in recovery.get("xids") or []:
        counts[xid["xid"]] = counts.get(xid["xid"], 0) + 1
    for number, count in sorted(counts.items()):
        out.setdefault("gpu_xid_errors", []).append((ident + [("xid", number)], count))


def samples(
    snapshot: _shapes.Snapshot,
    orphans: Sequence[Orphan],
    vllm: Iterable[Mapping[str, Any]],
    translating: Optional[bool],
    now: float,
    host: Optional[str] = None,
) -> Samples:
    """{family: [(labels [(key, value)], value)]} of one look. `vllm`: [{"name", "url", "state",
    "requests_running"}]; `host`: the inventory hostname, added to the orphans' labels (the remediation's limit)."""
    out: Samples = {"last_run_timestamp_seconds": [([], round(now, 3))]}
    driver_ok = not (snapshot.get("driver") or {}).get("timed_out") and bool(snapshot.get("gpus"))
    out["driver_ok"] = [([], 1 if driver_ok else 0)]
    if translating is not None:
        out["driver_translates_pids"] = [([], 1 if translating else 0)]
    for gpu in snapshot.get("gpus") or []:
        if gpu.get("index") is None:
            continue
        for family, items in _gpu_samples(gpu, orphans).items():
            out.setdefault(family, []).extend(items)
    if host is not None:
        out["orphan_memory_bytes"] = [
            (labels + [("inventory_hostname", host)], value) for labels, value in out.get("orphan_memory_bytes", [])
        ]
    for instance in vllm:
        ident: Labels = [("vllm_instance", instance["name"]), ("url", instance["url"])]
        for state in VLLM_STATES:
            out.setdefault("vllm_state", []).append(
                (ident + [("state", state)], 1 if instance["state"] == state else 0)
            )
        if instance.get("requests_running") is not None:
            out.setdefault("vllm_requests_running", []).append((ident, instance["requests_running"]))
    return out


def render(found: Samples) -> str:
    """The textfile of `samples`' result: every family in FAMILIES order, HELP and TYPE only where it has samples."""
    lines: List[str] = []
    for family, help_text in FAMILIES:
        if not found.get(family):
            continue
        name = PREFIX + family
        lines += ["# HELP %s %s" % (name, help_text), "# TYPE %s gauge" % name]
        lines += ["%s%s %s" % (name, _labels(labels), _number(value)) for labels, value in found[family]]
    return "\n".join(lines) + "\n"


def without_timestamp(text: Optional[str]) -> str:
    """`text` less the line of the last run's time: what tells whether the figures changed."""
    return "\n".join(line for line in (text or "").splitlines() if not line.startswith(TIMESTAMP + " "))


def read(path: str) -> Optional[str]:
    try:
        with open(path, "r") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def unwritable(path: str) -> List[str]:
    """Why the textfile `path` cannot be written, named by the directory asked for ([] where it can): its directory
    is missing (node_exporter's --collector.textfile.directory is another, or not made yet), not a directory, or not
    writable."""
    directory = os.path.dirname(path) or "."
    if not os.path.exists(directory):
        why = "does not exist"
    elif not os.path.isdir(directory):
        why = "is not a directory"
    elif not os.access(directory, os.W_OK | os.X_OK):
        why = "is not writable"
    else:
        return []
    return ["textfile %s cannot be written: its directory %s %s" % (path, directory, why)]


def write(path: str, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` atomically (a temporary file in its directory, then rename). Raises OSError."""
    directory = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
