# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_facts
short_description: NVIDIA GPU memory and the processes holding each GPU, as facts
version_added: 0.1.0
description:
  - Sets C(ansible_facts.nvidia) with the driver and NVML versions, every GPU's identity and memory, and
    every process holding a GPU (a holder).
  - Memory comes from NVML (C(nvmlDeviceGetMemoryInfo_v2), which reports reserved memory apart from used memory;
    C(nvmlDeviceGetMemoryInfo) v1 where v2 is missing, whose used memory includes reserved memory).
  - Holders are the union of the driver's process lists (C(nvmlDeviceGetComputeRunningProcesses_v3),
    C(..Graphics..), C(..MPSCompute..)) and a fuser-style scan of C(/proc) (the fds of every thread in
    C(/proc/PID/task/TID/fd), and C(/proc/PID/maps)) for C(/dev/nvidia*). The scan finds what the driver
    does not list, such as forked children that only inherited a device handle; GPUs are matched through
    the minor number of C(/dev/nvidiaN) (C(nvmlDeviceGetMinorNumber)), never assuming minor equals index.
  - A PID from the driver's lists becomes a holder only when C(/proc) shows that process holding NVIDIA
    device files (inside containers NVML reports host PIDs). Unconfirmed ones are kept per GPU with
    C(verified=false).
  - NVML runs in a child process bounded by O(driver_timeout), so a wedged driver cannot hang the module.
  - Without the NVIDIA driver library the facts say so in C(driver.available) and C(driver.error), and the
    holders still come from the C(/proc) scan.
author: gpuops maintainers (@gpuops)
requirements:
  - nvidia-ml-py (module C(pynvml)) and psutil on the managed host
extends_documentation_fragment:
  - gpuops.nvidia.attributes
  - gpuops.nvidia.attributes.facts
  - gpuops.nvidia.attributes.facts_module
options:
  driver_timeout:
    description: Seconds to wait for NVML to answer before reporting the driver as hung.
    type: float
    default: 10.0
notes:
  - The module's own process and its NVML worker hold the device files while NVML is initialized;
    they are never reported as holders.
seealso:
  - module: gpuops.nvidia.gpu_kill
  - module: gpuops.nvidia.gpu_wait
"""

EXAMPLES = r"""
- name: Read GPU memory and holders
  gpuops.nvidia.gpu_facts:

- name: Show what holds each GPU
  ansible.builtin.debug:
    msg: "GPU {{ item.index }}: {{ item.memory_used_mib }} MiB used, holders {{ item.holder_pids }}"
  loop: "{{ ansible_facts.nvidia.gpus }}"

- name: Fail when memory is used that no process explains
  ansible.builtin.assert:
    that: ansible_facts.nvidia.gpus | map(attribute='unexplained_mib') | select('gt', 256) | list | length == 0
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: dict
  contains:
    nvidia:
      description: NVIDIA GPUs of the host and the processes holding them.
      returned: always
      type: dict
      contains:
        driver:
          description:
            - State of the NVIDIA driver library. C(available) is false when the library is missing
              (C(error) holds the NVML error), or when NVML did not answer within O(driver_timeout) (C(timed_out)).
            - C(driver_version) from C(nvmlSystemGetDriverVersion), C(nvml_version) from C(nvmlSystemGetNVMLVersion),
              C(cuda_driver_version) from C(nvmlSystemGetCudaDriverVersion).
          returned: always
          type: dict
          sample: {"available": true, "error": null, "timed_out": false, "driver_version": "580.95.05",
                   "nvml_version": "13.580.95.05", "cuda_driver_version": 13000}
        gpus:
          description:
            - One entry per GPU, in NVML index order.
            - Memory in MiB from NVML memory info v2 (v1 where v2 is missing, then C(memory_reserved_mib) is null
              and C(memory_used_mib) includes reserved memory; C(memory_source) names the call).
            - C(holder_pids) are the holders of this GPU. C(driver_processes) are the driver's process lists
              (C(used_mib) null where NVML reports it as not available; C(verified) false when C(/proc) does not
              confirm the PID). C(explained_mib) is the memory the driver attributes to processes and
              C(unexplained_mib) the used memory no listed process explains (for example memory kept by
              an inherited handle, a leaked context, or idle usage of a few MiB).
            - C(error) is the NVML error for this GPU (for example a lost GPU), else null.
          returned: always
          type: list
          elements: dict
          sample:
            - index: 0
              minor: 0
              uuid: GPU-5a3e1c2b-0000-4000-8000-000000000000
              name: NVIDIA H100 80GB HBM3
              pci_bus_id: "00000000:18:00.0"
              memory_total_mib: 81559
              memory_used_mib: 72874
              memory_free_mib: 8156
              memory_reserved_mib: 529
              memory_source: nvmlDeviceGetMemoryInfo_v2
              driver_processes: [{"pid": 4242, "used_mib": 72874, "type": "compute", "verified": true}]
              explained_mib: 72874
              unexplained_mib: 0
              holder_pids: [4242]
              error: null
        holders:
          description:
            - Every process holding a GPU. C(pid), C(ppid), C(pgid), C(sid), C(user), C(uid), C(comm)
              (the kernel's 15-byte name), C(cmdline) (full C(/proc/PID/cmdline)), C(state) (kernel letter R, S, D,
              Z...), C(start_time) (ISO 8601, UTC) and C(start_ticks) (field 22 of C(/proc/PID/stat)).
            - C(gpus) are NVML indices, C(minors) the C(/dev/nvidiaN) numbers, C(memory_mib) the memory per GPU
              index where the driver reports it (null where not), C(seen_in) where the process was seen
              (C(driver), C(fd), C(mapping)).
            - C(control_only) is true for a process holding only C(/dev/nvidiactl) or C(/dev/nvidia-uvm) (it
              uses the driver but no single GPU); C(thread_only) when only a non-main thread holds the handle.
          returned: always
          type: list
          elements: dict
          sample:
            - pid: 4242
              ppid: 1
              pgid: 4100
              sid: 4100
              user: root
              uid: 0
              comm: VLLM::Worker_TP
              cmdline: VLLM::Worker_TP0
              state: S
              start_time: "2026-11-29T08:00:00.120000+00:00"
              start_ticks: 123456
              gpus: [0]
              minors: [0]
              memory_mib: {"0": 72874}
              seen_in: [driver, fd]
              control_only: false
              thread_only: false
        unmapped_minors:
          description: Minor numbers held by some process that no GPU known to NVML has.
          returned: always
          type: list
          elements: int
        index_source:
          description: Where the minor number to index map came from (C(nvml), C(proc_driver), or null when unknown).
          returned: always
          type: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuops.nvidia.plugins.module_utils import _gpus


def main():
    module = AnsibleModule(
        argument_spec=dict(driver_timeout=_gpus.SELECTION_ARGS["driver_timeout"]),
        supports_check_mode=True,
    )
    _gpus.check_libraries(module, missing_required_lib)
    try:
        _gpus.check_nonnegative(driver_timeout=module.params["driver_timeout"])
    except _gpus.SelectionError as exc:
        module.fail_json(msg=str(exc))
    inspector = _gpus.Inspector(driver_timeout=module.params["driver_timeout"])
    try:
        view = inspector.snapshot()
    finally:
        inspector.close()
    if not view["driver"]["available"]:
        module.warn("NVIDIA driver library not usable (%s): GPU memory is unknown; holders come from the /proc scan alone"
                    % view["driver"]["error"])
    module.exit_json(changed=False, ansible_facts={"nvidia": view})


if __name__ == "__main__":
    main()
