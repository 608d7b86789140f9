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
  - Sets C(ansible_facts.nvidia) with the driver and NVML versions, every GPU's identity and memory, every
    process holding a GPU's memory (a holder), and every other process with NVIDIA device files open (a device user).
  - Memory comes from NVML (C(nvmlDeviceGetMemoryInfo_v2), which reports reserved memory apart from used memory;
    C(nvmlDeviceGetMemoryInfo) v1 where v2 is missing, whose used memory includes reserved memory).
  - Holding a GPU means holding its memory (docs/attribution.md). A PID in GPU i's process lists
    (C(nvmlDeviceGetComputeRunningProcesses_v3), C(..Graphics..), C(..MPSCompute..)) holds GPU i, with the listed
    memory (each PID once, however many lists name it), once C(/proc) shows it has a context there, a read-write
    shared (C(rw-s)) mapping of GPU i's device file, which NVML clients, C(nvidia-smi) and CUDA-initialized
    processes never have (measured on an H200, driver 580.159.04; docs/attribution.md).
  - The driver lists a context under its creator's PID until the last process holding its handles closes them, and
    (535.113.01 and later) in the caller's PID namespace. A listed PID that is absent here is a creator that has
    exited, one held by a process without a context a reused number (C(exited), reason C(exited) or C(reused)); the
    processes the lists leave out that show a context on GPU i hold its context (C(contexts_of)); the process with
    the reused number is never a holder. On older drivers seen from a container, such a PID may be a host process
    (C(foreign)), never a holder, its memory explained.
  - A fuser-style scan of C(/proc) (the fds of every thread in C(/proc/PID/task/TID/fd), and C(/proc/PID/maps)) finds
    the NVIDIA device files by identity (character major 195, the same file as C(/dev/nvidia*) wherever it is
    mounted, C(nvidia-uvm) and C(nvidia-caps) by name). Memory no listed entry explains (C(memory_unexplained), beyond
    O(max_used_mib)) belongs, on a driver that gives PIDs in the caller's namespace, to another namespace or to
    nobody (C(unexplained_cause)); on older drivers and where memory is unknown the unlisted processes that show a
    context on the GPU hold it. Where nobody shows one, the processes with its device file open are only named as
    C(suspects). Every other process with device files open (NVML exporters and tools, CUDA-initialized processes,
    NCCL workers with every GPU's file open) is a device user.
  - A GPU whose memory NVML does not report (NVML_ERROR_NOT_SUPPORTED, a unified-memory GB10) is judged by its lists
    and device files (C(memory_supported) false, C(memory_source) C(process_lists)).
  - GPUs are matched through the minor number of C(/dev/nvidiaN) (C(nvmlDeviceGetMinorNumber)), never assuming
    minor equals index.
  - NVML runs in a child process bounded by O(driver_timeout), so a wedged driver cannot hang the module. Its first
    C(nvmlInit) has 30 seconds of its own (with persistence mode off it initializes every GPU, seconds on real
    hosts). A child that SIGKILL cannot end (stuck in the driver) is left behind and named in C(scan_problems).
  - Without the NVIDIA driver library the facts say so in C(driver.available) and C(driver.error); memory is
    unknown, so the processes that show a context on a GPU are its holders, from the C(/proc) scan alone.
  - With O(recovery), each GPU's C(recovery) says what the driver advises and what the GPU needs (docs/recovery.md).
author: gpuops maintainers (@gpuops)
extends_documentation_fragment:
  - gpuops.nvidia.attributes
  - gpuops.nvidia.attributes.info_module
  - gpuops.nvidia.attributes.facts
  - gpuops.nvidia.attributes.facts_module
  - gpuops.nvidia.nvml
options:
  driver_timeout:
    description: Seconds to wait for NVML to answer (greater than 0, at most 600) before reporting the driver as hung.
    type: float
    default: 10.0
  max_used_mib:
    description:
      - Tolerance in MiB for memory that the driver's process lists do not explain (used minus listed), per GPU. Beyond
        it, processes that hold the GPU's device file without being listed become its holders. The default, 256, is
        the idle floor that M(gpuops.nvidia.gpu_wait) allows (real drivers attribute a few MiB to a few hundred MiB
        per GPU to no process).
    type: int
    default: 256
  recovery:
    description:
      - Read each GPU's C(recovery) too, the driver's advice (field C(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION),
        C(nvmlDeviceGetRemappedRows), C(nvmlDeviceGetRetiredPagesPendingStatus), C(nvmlDeviceGetPersistenceMode), the
        GPUs on its NVLinks) and the Xid errors of the kernel log (C(/dev/kmsg)).
    type: bool
    default: true
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
            - C(holder_pids) are the holders of this GPU, C(device_user_pids) the device users with its device file
              open. C(driver_processes) are the driver's process lists (C(used_mib) null where NVML reports it as
              not available; C(verified) false when C(/proc) does not confirm the PID). C(explained_mib) is the
              memory the driver attributes to processes and C(unexplained_mib) the used memory no listed process
              explains (null when unknown; for example memory kept by an inherited handle, a leaked context, or
              idle usage of a few MiB); C(memory_unexplained) is true when it exceeds C(tolerance_mib)
              (O(max_used_mib)) or memory is unknown.
            - C(foreign) are the listed PIDs that no process here confirms and that may be another PID namespace's
              (drivers before 535.113.01 seen from a container; C(pid), C(used_mib), C(type), C(reason) C(absent) or
              C(not_holding), C(comm) of the unrelated process with that PID, else null). C(exited) are listed creators
              that have exited (the same keys, C(reason) C(exited), or C(reused) when another process has the number);
              their contexts are held by the device-file holders of the GPU. C(context_groups) are those holders in
              groups that share the open device files of one creator (its forked workers, told by kcmp(2)), each group
              keeping at least one of those contexts alive; [] where the GPU carries none, null where the kernel does
              not tell. C(suspects) are the PIDs of processes holding the device file where a holder is looked for and
              none shows a context (never holders).
            - C(unexplained_cause) says what memory outside the lists is where it counts, C(other_namespace_or_leaked)
              (a driver that lists the caller's PID namespace only, seen from a container), C(leaked) (the same, from
              the initial PID namespace), C(unlisted) (older drivers); null where nothing counts.
            - C(memory_supported) is false where NVML answers NVML_ERROR_NOT_SUPPORTED for memory (a unified-memory
              GPU), and then C(memory_source) is C(process_lists) and C(memory_used_mib) is what the lists charge.
            - C(error) is the NVML error for this GPU (for example a lost GPU), else null.
            - C(recovery) (with O(recovery)) is what the driver advises (docs/recovery.md). C(action) is the driver's
              recovery action (C(none), C(gpu_reset), C(node_reboot), C(drain_p2p), C(drain_and_reset),
              C(recover_imex_domain), C(bus_reset), C(system_reboot); null where the driver has no such field),
              C(remapped_rows) (C(correctable), C(uncorrectable), C(pending), C(failure)), C(retired_pages_pending),
              C(persistence_mode), C(reset_peers) (the indices of the GPUs linked to it directly by NVLink, which a
              reset takes with it), C(nvlink_switch) (a link reaches an NVSwitch), C(xids) (the Xid lines of the kernel
              log for this GPU within the last 24 hours and since its last reset by M(gpuops.nvidia.gpu_reset), with
              C(xid), C(pci), C(age_s), C(text), C(needs) and C(why) for the kinds that need a reset or a reboot),
              C(xid_error) (why the kernel log could not be read, else null), C(needs) (C(reset), C(reboot), C(other)
              or null) with C(why) (the reasons, in words), C(errors) (what the driver did not answer).
            - C(process_list_version) is the version of the process-list calls that answered (C(v3), C(v2) or
              C(v1) on drivers without the C(_v3) calls), C(processes_error) why the lists are partial (the aggregate
              lists of a MIG GPU need root or the mig/monitor capability; the per-instance lists were read instead).
            - C(memory_used_includes_reserved) is true where C(memory_source) is C(nvmlDeviceGetMemoryInfo) (v1) on a
              driver R510 or later, whose used memory includes reserved memory; then
              C(memory_used_excluding_reserved_mib) is null and C(reserved_allowance_mib) (5% of the memory, at most
              1024 MiB) is added to C(tolerance_mib) (docs/attribution.md, "v1 memory").
            - C(mig_mode) (C(current), C(pending); null where the GPU has no MIG) and, when MIG is enabled,
              C(mig_devices), one per MIG instance with C(index), C(uuid) (C(MIG-...)), C(gpu_instance_id),
              C(compute_instance_id), C(name), C(profile), C(memory_total_mib), C(memory_used_mib), C(memory_free_mib),
              C(memory_source), and its holders as for a GPU (C(holder_pids), C(listed_mib), C(unexplained_mib),
              C(memory_unexplained), C(tolerance_mib), C(reserved_allowance_mib), C(foreign), C(exited)). C(driver_processes)
              carry C(gpu_instance_id) and C(compute_instance_id) (null without MIG).
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
              memory_unexplained: false
              tolerance_mib: 256
              foreign: []
              exited: []
              context_groups: []
              suspects: []
              unexplained_cause: null
              memory_supported: true
              holder_pids: [4242]
              device_user_pids: [4242, 5120]
              error: null
        holders:
          description:
            - Every process holding a GPU. C(pid), C(ppid), C(pgid), C(sid), C(user), C(uid), C(comm)
              (the kernel's 15-byte name), C(cmdline) (full C(/proc/PID/cmdline)), C(state) (kernel letter R, S, D,
              Z...), C(start_time) (ISO 8601, UTC), C(start_ticks) (field 22 of C(/proc/PID/stat)) and
              C(kernel_thread) (PF_KTHREAD in its flags; false for any process that holds a device file).
            - C(gpus) are the NVML indices of the GPUs it holds memory on, C(device_gpus) those whose device file it
              has open, C(minors) the C(/dev/nvidiaN) numbers, C(memory_mib) the memory per GPU index where the driver
              reports it (null where not), C(attribution) per GPU index C(driver) (listed by the driver) or
              C(device_file) (shows a context on a GPU that carries an exited creator's context, or memory it may hold),
              C(contexts_of) per GPU index the listed PIDs, exited, whose contexts it holds, C(seen_in) where the
              process was seen (C(driver), C(fd), C(mapping)), C(kind) C(cuda) (it maps a GPU's device file) or C(nvml) (it
              maps none), C(parent) (C(pid), C(comm) and C(cmdline) of its parent, null under init), C(mig) the MIG instances it holds
              per GPU index (a dict of GPU index to a list of MIG UUIDs).
            - C(control_only) is true for a listed process holding no GPU device file; C(thread_only) when only a non-main thread holds the handle.
            - C(owner) says what will start the process again, read on the host with no runtime client
              (docs/owners.md has each path form and its source). Keys, each null where the host does not show it
              (never guessed; all null for a process that is gone) are C(systemd_unit) (the system manager's unit,
              the first C(.service)/C(.scope)/C(.socket)/C(.mount)/C(.swap) of its path in C(/proc/PID/cgroup),
              cgroup v2 or v1 C(name=systemd), below slices only), C(unit_restart) (C(Restart=) of a C(.service) from
              C(systemctl show -p Restart --value), for example C(no), C(always), C(on-failure); null without a
              working systemctl), C(container_id) (the full 64-hex id in the cgroup path), C(runtime) (C(docker),
              C(containerd), C(cri-o) or C(podman), from the path form; null where the path does not say, as with
              containerd's cgroupfs driver), C(pod_uid) (with dashes, from the kubelet's C(kubepods) cgroups),
              C(pod_namespace) and C(pod_name) (from C(/var/log/pods/NAMESPACE_NAME_UID)), C(slurm_job) (the id of
              C(job_ID) under a Slurm cgroup root, v1 or v2 plugin), C(agent) (the nearest live ancestor that is a
              respawning supervisor, C(pid), C(comm), C(cmdline) and C(kind) C(torchrun), C(ray), C(mpi),
              C(supervisord) or C(vllm); null when there is none).
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
              device_gpus: [0, 1]
              minors: [0, 1]
              memory_mib: {"0": 72874}
              attribution: {"0": driver}
              seen_in: [driver, fd]
              kind: cuda
              parent: {"pid": 4100, "comm": "VLLM::EngineCor", "cmdline": "VLLM::EngineCore"}
              control_only: false
              thread_only: false
              owner: {"systemd_unit": "vllm@a.service", "unit_restart": "always", "container_id": null, "runtime": null,
                      "pod_uid": null, "pod_namespace": null, "pod_name": null, "slurm_job": null,
                      "agent": {"pid": 4000, "comm": "vllm", "cmdline": "/usr/bin/python3 /usr/local/bin/vllm serve /models/m",
                                "kind": "vllm"}}
        device_users:
          description:
            - Processes with NVIDIA device files open that hold no GPU's memory (NVML exporters, nvtop, NCCL workers'
              files of other GPUs' devices); they are never signalled by default and never make a GPU "not free". The identity
              fields of C(holders), plus C(device_gpus), C(minors), C(kind) (C(cuda) or C(nvml)), C(seen_in),
              C(thread_only), and C(owner) as for C(holders).
          returned: always
          type: list
          elements: dict
          sample:
            - {"pid": 5120, "comm": "nvidia_gpu_expo", "cmdline": "nvidia_gpu_exporter", "device_gpus": [0, 1],
               "minors": [0, 1], "kind": "nvml", "seen_in": ["fd"], "thread_only": false}
        scan:
          description: C(full) (every process was scanned) or C(listed) (only the PIDs the driver lists).
          returned: always
          type: str
        scan_problems:
          description:
            - One sentence per worker process that did not finish (a /proc scan worker or the NVML worker stuck in
              the driver, left behind after SIGKILL); the processes a scan worker did not read are named. Empty
              normally.
          returned: always
          type: list
          elements: str
        unmapped_minors:
          description: Minor numbers held by some process that no GPU known to NVML has.
          returned: always
          type: list
          elements: int
        index_source:
          description:
            - Where the minor number to index map came from (C(nvml), C(proc_driver), or null when unknown).
            - With C(nvml), a GPU that NVML answers with an error (a lost GPU) gets its minor, UUID and PCI bus id from
              C(/proc/driver/nvidia) where the kernel module lists as many GPUs as NVML and agrees on the other minors.
          returned: always
          type: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _facts_run, _gpus, _outcome


def main() -> None:
    module = AnsibleModule(argument_spec=_facts_run.argument_spec(), supports_check_mode=True)
    _gpus.check_libraries(module, missing_required_lib)
    _outcome.exit_with(module, _facts_run.run(module.params))


if __name__ == "__main__":
    main()
