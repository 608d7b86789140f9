# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_wait
short_description: Wait until NVIDIA GPUs are really released
version_added: 0.1.0
description:
  - Waits until every selected GPU has no holder left and its used memory (NVML memory info v2, C(used), which
    excludes reserved memory) is at or below O(max_used_mib).
  - Holders are found as in M(gpuops.nvidia.gpu_facts). The protected GPU daemons (nvidia-persistenced, DCGM,
    fabric manager, MPS, Xorg; see M(gpuops.nvidia.gpu_kill)) and the Ansible process chain do not count, as they
    hold the device files of healthy GPUs too.
  - Polls every O(poll_interval) seconds with no fixed sleeps, so it returns within one poll interval of the
    release (the driver frees a dead process's memory some time after its last handle closes).
  - On timeout it fails with a report per GPU (RV(gpus)) giving the memory still used, the processes still holding it
    with their state, the memory no process explains, and the next step an operator can take.
  - A driver call that hangs does not hang the module. The first NVML query (which initializes NVML) is bounded by
    O(driver_timeout), each later one by the time left before O(timeout) plus one second.
  - Without the NVIDIA driver library it waits for the holders alone (from the C(/proc) scan) and says so.
author: gpuops maintainers (@gpuops)
requirements:
  - nvidia-ml-py (module C(pynvml)) and psutil on the managed host
extends_documentation_fragment:
  - gpuops.nvidia.attributes
  - gpuops.nvidia.attributes.info_module
options:
  gpus:
    description: GPUs to wait for, as NVML indices or UUIDs. Default is all GPUs.
    type: list
    elements: raw
  timeout:
    description: Seconds to wait before failing with the report.
    type: float
    default: 60.0
  max_used_mib:
    description:
      - Used memory in MiB at or below which a GPU without holders counts as released.
      - The default, 256, tolerates the few MiB an idle GPU reports in NVML v2 C(used). Where only NVML memory info
        v1 exists, used memory includes reserved memory (often several hundred MiB), so raise it there.
    type: int
    default: 256
  poll_interval:
    description:
      - Seconds between two looks at the GPUs. A look costs a few milliseconds of CPU on a node with a few hundred
        processes; with the default the module returns within about 0.05 s of the release there.
    type: float
    default: 0.02
  exclude:
    description: Process names that do not count as holders, added to the protected daemons.
    type: list
    elements: str
    default: []
  driver_timeout:
    description: Longest wait in seconds for one NVML query; after the first, also bounded by the time left before O(timeout) plus one second.
    type: float
    default: 10.0
seealso:
  - module: gpuops.nvidia.gpu_kill
  - module: gpuops.nvidia.gpu_facts
"""

EXAMPLES = r"""
- name: Wait up to 2 minutes for every GPU to be released
  gpuops.nvidia.gpu_wait:
    timeout: 120

- name: Wait for GPUs 4-7 with a stricter threshold
  gpuops.nvidia.gpu_wait:
    gpus: [4, 5, 6, 7]
    max_used_mib: 64
    timeout: 30
"""

RETURN = r"""
released:
  description: Whether every selected GPU was released before the timeout.
  returned: always
  type: bool
elapsed_s:
  description: Seconds waited.
  returned: always
  type: float
polls:
  description: Number of looks at the GPUs.
  returned: always
  type: int
gpus:
  description:
    - Per selected GPU at the last look, C(index), C(uuid), C(memory_used_mib), C(memory_reserved_mib), C(unexplained_mib)
      (used memory the driver attributes to no process), C(holders) (C(pid), C(comm), C(state), C(cmdline), C(user),
      C(memory_mib)), C(memory_checked) (false when NVML could not be asked) and C(released).
    - On failure each GPU not released also has C(next_step), what an operator can do next.
    - Without any index map (no NVML and no C(/proc/driver/nvidia)) there is one entry with C(index) null for all GPUs.
  returned: always
  type: list
  elements: dict
driver:
  description: State of the NVIDIA driver library at the last look, as in gpu_facts.
  returned: always
  type: dict
after:
  description:
    - The GPUs and their holders at the last look, in the structure of the C(nvidia) facts of M(gpuops.nvidia.gpu_facts)
      (C(driver), C(gpus) with memory in MiB and C(holder_pids), C(holders), C(unmapped_minors), C(index_source)), so that
      a play needs no separate gpu_facts task to report the outcome. Unlike RV(gpus), it covers every GPU and every
      holder, protected daemons included.
  returned: when the GPUs could be read (not when an option is invalid)
  type: dict
  sample: {"driver": {"available": true}, "gpus": [{"index": 0, "memory_used_mib": 0, "holder_pids": []}], "holders": [],
           "unmapped_minors": [], "index_source": "nvml"}
"""

import gc

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuops.nvidia.plugins.module_utils import _gpus, _wait


def main():
    module = AnsibleModule(
        argument_spec=dict(
            timeout=dict(type="float", default=60.0),
            max_used_mib=dict(type="int", default=_wait.DEFAULT_MAX_USED_MIB),
            poll_interval=dict(type="float", default=_wait.DEFAULT_POLL_INTERVAL_S),
            exclude=dict(type="list", elements="str", default=[]),
            **_gpus.SELECTION_ARGS
        ),
        supports_check_mode=True,
    )
    _gpus.check_libraries(module, missing_required_lib)
    params = module.params
    inspector = _gpus.Inspector(driver_timeout=params["driver_timeout"])
    try:
        try:
            _gpus.check_nonnegative(timeout=params["timeout"], max_used_mib=params["max_used_mib"],
                                    poll_interval=params["poll_interval"], driver_timeout=params["driver_timeout"])
            # The first look initializes NVML (seconds on some drivers): it may take the whole driver_timeout.
            indices = _gpus.select_gpus(params["gpus"], inspector.snapshot())
        except _gpus.SelectionError as exc:
            module.fail_json(msg=str(exc))
        result = _wait.wait_released(inspector, indices, params["timeout"], params["max_used_mib"],
                                     params["poll_interval"], params["exclude"])
        result["after"] = result.pop("view")
    finally:
        inspector.close()
    # The process ends right after the result: spare it the final garbage collection of every imported
    # object, which delays the module's return by 20-60 ms.
    gc.freeze()
    if not result["driver"]["available"] and not result["driver"]["timed_out"]:
        module.warn("NVIDIA driver library not usable (%s): waited for holders from the /proc scan alone; "
                    "memory release is not confirmed" % result["driver"]["error"])
    if result["released"]:
        module.exit_json(changed=False, msg="released after %.2f s" % result["elapsed_s"], **result)
    stuck = [gpu for gpu in result["gpus"] if not gpu["released"]]
    for gpu in stuck:
        gpu["next_step"] = _wait.next_step(gpu)
    if result["driver"]["timed_out"]:
        msg = "the NVIDIA driver stopped answering (%s); GPU memory release could not be confirmed" % result["driver"]["error"]
    else:
        msg = "%s: %s" % ("not free" if params["timeout"] == 0 else "not released after %.1f s" % result["elapsed_s"],
                          "; ".join(_describe(gpu) for gpu in stuck))
    module.fail_json(msg=msg, changed=False, **result)


def _describe(gpu):
    holders = ", ".join("PID %s %s (state %s)" % (h["pid"], h["comm"], h["state"]) for h in gpu["holders"]) or "no holder"
    return "GPU %s: %s MiB used, %s MiB unexplained, held by %s; next: %s" % (
        "all" if gpu["index"] is None else gpu["index"], gpu["memory_used_mib"], gpu["unexplained_mib"], holders, gpu["next_step"])


if __name__ == "__main__":
    main()
