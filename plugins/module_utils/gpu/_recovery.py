# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whether each GPU needs a reset or a reboot, from what the driver advises (docs/recovery.md).

The driver's advice is read in the NVML worker (_nvml.read_advice, where a reading asks for it): the recovery action,
remapped rows, retired pages pending, persistence mode and the GPUs at the far end of its NVLinks. `recovery` runs on
the host after the merge: it adds the Xid errors of the kernel log (_kernel_log) and decides what each GPU needs, with
the reasons. Python 3.9.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _kernel_log, _shapes

# What each action asks of the collection: a GPU reset it can do, a reboot it can only name, or another step.
_ACTION_NEEDS: Dict[str, _shapes.RecoveryNeed] = {
    "gpu_reset": "reset",
    "drain_and_reset": "reset",
    "node_reboot": "reboot",
    "system_reboot": "reboot",
    "drain_p2p": "other",
    "recover_imex_domain": "other",
    "bus_reset": "other",
}
# Xids older than this are not "recent": they stay in the kernel log until the next boot.
XID_WINDOW_S = 24 * 3600
# Where gpu_reset notes each GPU's last reset (seconds since boot): Xids logged before it were dealt with. A tmpfs
# on every systemd host, emptied at boot as the kernel log is.
RESETS_FILE = "/run/gpuops-nvidia/gpu_resets.json"


def last_resets(path: str = RESETS_FILE) -> Dict[str, float]:
    """{PCI address (0000:18:00): seconds since boot} of the GPUs gpu_reset reset since boot; {} where none."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return {str(key): float(value) for key, value in data.items()} if isinstance(data, dict) else {}


def note_reset(pci_keys: List[str], now_s: float, path: str = RESETS_FILE) -> None:
    """Note that the GPUs at `pci_keys` were reset at `now_s` (seconds since boot)."""
    data = last_resets(path)
    data.update({key: now_s for key in pci_keys})
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    temporary = "%s.%d.tmp" % (path, os.getpid())
    with open(temporary, "w") as handle:
        json.dump(data, handle)
    os.replace(temporary, path)


def _needs(advice: Mapping[str, Any], xids: List[_shapes.Xid]) -> Tuple[Optional[_shapes.RecoveryNeed], List[str]]:
    """What the GPU needs (reboot before other before reset; None: nothing) and why, in words."""
    reasons: List[Tuple[_shapes.RecoveryNeed, str]] = []
    action = advice.get("recovery_action")
    if action in _ACTION_NEEDS:
        reasons.append((_ACTION_NEEDS[action], "the driver's recovery action is %s" % action))
    rows = advice.get("remapped_rows") or {}
    if rows.get("failure"):
        reasons.append(("other", "row remapping failed (the GPU needs service: NVIDIA's field diagnostics)"))
    if rows.get("pending"):
        reasons.append(("reset", "rows are pending remapping, which a GPU reset applies"))
    if advice.get("retired_pages_pending"):
        reasons.append(("reset", "pages are pending retirement, which a GPU reset applies"))
    for xid in xids:
        if xid["needs"]:
            reasons.append((xid["needs"], "Xid %d %.0f s ago: %s" % (xid["xid"], xid["age_s"], xid["why"])))
    for need in ("reboot", "other", "reset"):
        if any(kind == need for kind, _why in reasons):
            return need, [why for _kind, why in reasons]
    return None, []


def recovery(
    gpus: List[Dict[str, Any]],
    advice: List[_shapes.DriverAdvice],
    proc: str = "/proc",
    kmsg: str = _kernel_log.KMSG,
    resets_file: str = RESETS_FILE,
) -> None:
    """Give each GPU of a merged view its "recovery": the driver's advice, the NVLink peers a reset takes with it,
    the recent Xids of the kernel log, and what it needs with why (docs/recovery.md)."""
    records, log_error = _kernel_log.read(kmsg)
    now_s = _kernel_log.uptime_s(proc) or 0.0
    resets = last_resets(resets_file)
    all_xids = _kernel_log.xids(records, now_s)
    by_bus = {_kernel_log.pci_key(gpu.get("pci_bus_id")): gpu["index"] for gpu in gpus}
    by_index = {item["index"]: item for item in advice}
    for gpu in gpus:
        key = _kernel_log.pci_key(gpu.get("pci_bus_id"))
        since = max(now_s - XID_WINDOW_S, resets.get(key or "", -1.0))
        xids = [x for x in all_xids if x["pci"] == key and now_s - x["age_s"] > since]
        gpu["recovery"] = _gpu_recovery(by_index.get(gpu["index"]), xids, log_error, by_bus)


def _gpu_recovery(
    own: Optional[_shapes.DriverAdvice],
    xids: List[_shapes.Xid],
    log_error: Optional[str],
    by_bus: Mapping[Optional[str], int],
) -> _shapes.Recovery:
    need, why = _needs(own or {}, xids)
    peers = [_kernel_log.pci_key(peer) for peer in (own["nvlink_peers"] if own else [])]
    return {
        "action": own["recovery_action"] if own else None,
        "remapped_rows": own["remapped_rows"] if own else None,
        "retired_pages_pending": own["retired_pages_pending"] if own else None,
        "persistence_mode": own["persistence_mode"] if own else None,
        "reset_peers": sorted(by_bus[peer] for peer in peers if peer in by_bus),
        "nvlink_switch": bool(own and own["nvlink_switch"]),
        "xids": xids,
        "xid_error": log_error,
        "needs": need,
        "why": why,
        "errors": list(own["errors"]) if own else ["the driver did not answer"],
    }


def needing(gpus: List[Dict[str, Any]], indices: List[int]) -> List[Dict[str, Any]]:
    """[{"index", "needs", "why"}] of the GPUs of `indices` whose "recovery" says they need something."""
    return [
        {"index": gpu["index"], "needs": gpu["recovery"]["needs"], "why": gpu["recovery"]["why"]}
        for gpu in gpus
        if gpu["index"] in indices and (gpu.get("recovery") or {}).get("needs")
    ]


def advice_words(advice: Sequence[Mapping[str, Any]], host: str = "") -> str:
    """Each GPU that needs something, with why and the next step, on one line (check_gpus, gpu_wait)."""
    limit = " -l %s" % host if host else ""
    steps = {
        "reset": "ansible-playbook gpuops.nvidia.reset_gpus%s -e reset_gpus_gpu_reset=true (docs/recovery.md)" % limit,
        "reboot": "reboot the node, drained first (docs/schedulers.md)",
        "other": "the step the driver names (docs/recovery.md); a reset cannot take it",
    }
    words = {"reset": "a GPU reset", "reboot": "a reboot", "other": "another step"}
    return "; ".join(
        "GPU %d needs %s: %s; next: %s"
        % (item["index"], words[item["needs"]], "; ".join(item["why"]), steps[item["needs"]])
        for item in advice
    )
