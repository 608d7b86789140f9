# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_kill
short_description: End exactly the selected processes that hold NVIDIA GPUs
version_added: 0.1.0
description:
  - Ensures that no selected process holds the selected GPUs. Holders are found as in M(gpuops.nvidia.gpu_facts), from
    the driver's process lists plus a fuser-style scan of C(/proc) (fds of every thread, memory mappings) for
    C(/dev/nvidia*), so orphaned vLLM C(VLLM::EngineCore) and C(VLLM::Worker_TP*) processes and children that only
    inherited a device handle are found whatever their names.
  - Sends O(signal) to each selected holder, waits up to O(grace_period) seconds, sends SIGKILL to the ones left,
    and waits up to O(kill_wait) seconds for them to exit. A zombie counts as exited; a process stuck in
    uninterruptible sleep (state D) is reported as unkillable.
  - Each process is pinned before its first signal (a pidfd, checked against the start time seen by the scan;
    where pidfds are unavailable the start time is re-read before every signal), so a PID reused meanwhile is
    never signalled.
  - Never signals itself or its ancestors (the Ansible process chain and the SSH session), PID 1 or kernel threads.
    By default it also leaves alone the GPU daemons nvidia-persistenced, nv-hostengine (DCGM), dcgm-exporter,
    nvidia-fabricmanager, the MPS control daemon and server, and Xorg / Xwayland; O(exclude) adds names, and only
    O(include_protected=true) lifts the default list.
  - When several holders are selected they are signalled together (vLLM's EngineCore and its TP workers end in
    parallel). After the round the GPUs are scanned again and new selected holders (for example children started
    meanwhile) are ended too, for at most 3 rounds.
  - Returns C(changed=true) only when something was signalled, so a second run reports C(changed=false).
  - Bad input (unknown GPU index or UUID, invalid regex, negative times, unknown signal) fails before anything is
    signalled.
  - Without the NVIDIA driver library it works from the C(/proc) scan alone (all GPUs, or GPUs mapped through
    C(/proc/driver/nvidia)) and says so in a warning.
author: gpuops maintainers (@gpuops)
requirements:
  - nvidia-ml-py (module C(pynvml)) and psutil on the managed host
extends_documentation_fragment:
  - gpuops.nvidia.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports in RV(would_signal) what would be signalled and sends nothing.
  diff_mode:
    support: none
options:
  gpus:
    description:
      - GPUs whose holders are selected, as NVML indices or UUIDs. Default is all GPUs; then processes holding
        only C(/dev/nvidiactl) or C(/dev/nvidia-uvm) are selected too.
    type: list
    elements: raw
  pids:
    description: Only these PIDs (of holders of the selected GPUs) are selected.
    type: list
    elements: int
  match:
    description: Only holders whose full command line (C(/proc/PID/cmdline) joined by spaces) matches this Python regex (search).
    type: str
  users:
    description: Only holders owned by these users (names or numeric UIDs).
    type: list
    elements: str
  signal:
    description: First signal to send, by name (V(SIGTERM), V(TERM), V(SIGINT)...) or number.
    type: str
    default: SIGTERM
  grace_period:
    description: Seconds to wait after O(signal) before sending SIGKILL.
    type: float
    default: 10.0
  kill_wait:
    description: Seconds to wait for exit after SIGKILL before reporting a process as a survivor.
    type: float
    default: 5.0
  exclude:
    description: Process names (kernel comm or basename of argv[0]) never to signal, added to the default protected list.
    type: list
    elements: str
    default: []
  include_protected:
    description: Also signal the default protected GPU daemons (nvidia-persistenced, DCGM, fabric manager, MPS, Xorg).
    type: bool
    default: false
  driver_timeout:
    description: Seconds to wait for NVML to answer before going on from the C(/proc) scan alone.
    type: float
    default: 10.0
notes:
  - The module fails when a selected process survives SIGKILL, with the survivors and the reason in RV(survived).
seealso:
  - module: gpuops.nvidia.gpu_facts
  - module: gpuops.nvidia.gpu_wait
"""

EXAMPLES = r"""
- name: End everything that holds any GPU (orphaned vLLM engines and workers included)
  gpuops.nvidia.gpu_kill:

- name: End the holders of GPUs 0-3 only, giving them 30 s to shut down
  gpuops.nvidia.gpu_kill:
    gpus: [0, 1, 2, 3]
    grace_period: 30

- name: End only vLLM processes of user svc-llm on one GPU, by UUID
  gpuops.nvidia.gpu_kill:
    gpus: [GPU-5a3e1c2b-0000-4000-8000-000000000000]
    match: 'VLLM::|vllm serve'
    users: [svc-llm]

- name: Dry run in check mode
  gpuops.nvidia.gpu_kill:
  check_mode: true
  register: plan
"""

RETURN = r"""
would_signal:
  description: In check mode, the selected holders that would be signalled (same fields as the holders of gpu_facts).
  returned: always
  type: list
  elements: dict
signalled:
  description:
    - Holders that were signalled, each with C(signals), the signal names sent in order, and C(exited_after_s)
      (seconds from the first signal to the observed exit) for those that exited.
  returned: always
  type: list
  elements: dict
  sample: [{"pid": 4242, "comm": "VLLM::EngineCor", "cmdline": "VLLM::EngineCore", "gpus": [0], "signals": ["SIGTERM"]}]
exited:
  description: Signalled holders that exited, with C(exited_after_s), seconds from the first signal to the observed exit.
  returned: always
  type: list
  elements: dict
survived:
  description: Signalled holders still alive after SIGKILL, with C(state) and C(reason) (for example unkillable in state D).
  returned: always
  type: list
  elements: dict
protected:
  description: Holders of the selected GPUs that were left alone, with C(reason).
  returned: always
  type: list
  elements: dict
not_signalled:
  description: Selected holders that were not signalled because they exited, or their PID was reused, before the signal.
  returned: always
  type: list
  elements: dict
not_holding:
  description: PIDs from O(pids) that hold none of the selected GPUs (nothing to do for them).
  returned: always
  type: list
  elements: int
gpus:
  description: The selected NVML indices, or null for all GPUs.
  returned: always
  type: list
  elements: int
driver:
  description: State of the NVIDIA driver library, as in gpu_facts.
  returned: always
  type: dict
elapsed_s:
  description: Seconds the module spent signalling and waiting.
  returned: always
  type: float
before:
  description:
    - The GPUs and their holders as read before anything was signalled, in the structure of the C(nvidia) facts
      of M(gpuops.nvidia.gpu_facts) (C(driver), C(gpus) with memory in MiB and C(holder_pids), C(holders),
      C(unmapped_minors), C(index_source)), so that a play needs no separate gpu_facts task before the kill.
  returned: when the GPUs could be read (not when an option is invalid)
  type: dict
  sample: {"driver": {"available": true}, "gpus": [{"index": 0, "memory_used_mib": 72874, "holder_pids": [4242]}],
           "holders": [{"pid": 4242, "comm": "VLLM::Worker_TP", "gpus": [0]}], "unmapped_minors": [], "index_source": "nvml"}
"""

import gc
import pwd
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuops.nvidia.plugins.module_utils import _gpus, _terminate

_ROUNDS = 3


def select_targets(view, params, indices, regex, own_chain):
    """Split the holders of the selected GPUs into (targets, protected, not_holding PIDs)."""
    users = set(params["users"] or ())
    pids = set(params["pids"] or ())
    targets, protected = [], []
    candidates = _gpus.holders_of(view, indices)
    for holder in candidates:
        if pids and holder["pid"] not in pids:
            continue
        if regex is not None and not regex.search(holder["cmdline"] or ""):
            continue
        if users and holder["user"] not in users and str(holder["uid"]) not in users:
            continue
        reason = _gpus.protection(holder, own_chain, params["exclude"], params["include_protected"])
        if reason:
            protected.append(dict(holder, reason=reason))
        else:
            targets.append(holder)
    not_holding = sorted(pids - {h["pid"] for h in candidates})
    return targets, protected, not_holding


def _known_user(name):
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def main():
    module = AnsibleModule(
        argument_spec=dict(
            pids=dict(type="list", elements="int"),
            match=dict(type="str"),
            users=dict(type="list", elements="str"),
            signal=dict(type="str", default="SIGTERM"),
            grace_period=dict(type="float", default=10.0),
            kill_wait=dict(type="float", default=5.0),
            exclude=dict(type="list", elements="str", default=[]),
            include_protected=dict(type="bool", default=False),
            **_gpus.SELECTION_ARGS
        ),
        supports_check_mode=True,
    )
    _gpus.check_libraries(module, missing_required_lib)
    params = module.params
    inspector = _gpus.Inspector(driver_timeout=params["driver_timeout"])
    started = time.monotonic()
    try:
        try:
            _gpus.check_nonnegative(grace_period=params["grace_period"], kill_wait=params["kill_wait"],
                                    driver_timeout=params["driver_timeout"])
            regex = _gpus.compile_match(params["match"])
            sig = _terminate.parse_signal(params["signal"])
            view = inspector.snapshot()
            indices = _gpus.select_gpus(params["gpus"], view)
        except ValueError as exc:  # SelectionError and unknown signals
            module.fail_json(msg="nothing was signalled: %s" % exc)
        if not view["driver"]["available"]:
            module.warn("NVIDIA driver library not usable (%s): holders come from the /proc scan alone"
                        % view["driver"]["error"])
        unknown_users = [u for u in params["users"] or () if not u.isdigit() and not _known_user(u)]
        if unknown_users:
            module.warn("no such user on this host: %s (selects no process)" % ", ".join(unknown_users))
        own_chain = _gpus.ancestors()
        result = dict(changed=False, gpus=indices, driver=view["driver"], would_signal=[], signalled=[], exited=[],
                      survived=[], not_signalled=[], protected=[], not_holding=[], before=view)
        seen = set()
        for _round in range(_ROUNDS):
            targets, protected, not_holding = select_targets(view, params, indices, regex, own_chain)
            targets = [t for t in targets if (t["pid"], t["start_ticks"]) not in seen]
            if _round == 0:
                result["protected"], result["not_holding"] = protected, not_holding
            if not targets:
                break
            if module.check_mode:
                result["would_signal"] = targets
                result["changed"] = True
                break
            seen.update((t["pid"], t["start_ticks"]) for t in targets)
            outcome = _terminate.end_processes(targets, sig, params["grace_period"], params["kill_wait"])
            for key in ("signalled", "exited", "survived", "not_signalled"):
                result[key].extend(outcome[key])
            result["changed"] = result["changed"] or bool(outcome["signalled"])
            if outcome["survived"]:
                break
            view = inspector.snapshot()
    finally:
        inspector.close()
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    # The process ends right after the result: spare it the final garbage collection of every imported
    # object, which delays the module's return by 20-60 ms.
    gc.freeze()
    if result["survived"]:
        module.fail_json(msg="%d selected process(es) survived SIGKILL: %s" % (
            len(result["survived"]), "; ".join("PID %s (%s): %s" % (s["pid"], s["comm"], s["reason"]) for s in result["survived"])),
            **result)
    if module.check_mode:
        result["msg"] = "would signal %d process(es)%s" % (len(result["would_signal"]), "".join(
            ", %s (%s)" % (t["pid"], t["comm"]) for t in result["would_signal"]))
    else:
        result["msg"] = "signalled %d process(es), %d exited" % (len(result["signalled"]), len(result["exited"]))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
