# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_wait
short_description: Wait until NVIDIA GPUs are really released
version_added: 0.1.0
author: gpuops maintainers (@gpuops)
description:
  - Waits until every selected GPU has no selected holder left and its used memory (NVML memory info v2, C(used),
    which excludes reserved memory), minus the memory of the holders the operator leaves out (O(pids), O(match),
    O(users), the owner filters, O(exclude)), is at or below O(max_used_mib).
  - Holding a GPU means holding its memory (docs/attribution.md); processes that merely have device files open (NVML
    exporters, nvtop, NCCL workers of other GPUs) are device users and never count. O(pids), O(match), O(users),
    O(exclude) and O(include_protected) select holders exactly as in M(gpuops.nvidia.gpu_kill); a holder they leave
    alone is reported (RV(left_alone)) and is not waited for.
  - Where the driver's process lists explain the selected GPUs' memory, each look reads only the listed processes'
    fds; a full C(/proc) scan runs only where memory is unexplained.
  - A selected GPU that the driver answers with an error (a lost GPU) fails the wait, naming the GPU and the next step,
    as soon as the other selected GPUs are released (at the first look when they already are); they are still
    waited for.
  - Holders are found as in M(gpuops.nvidia.gpu_facts). The protected GPU daemons (nvidia-persistenced, DCGM,
    fabric manager, MPS, Xorg, desktop compositors, known by their executable, never by a title; see
    M(gpuops.nvidia.gpu_kill)) and the Ansible process chain are not waited for, but the memory they hold counts, as a GPU
    whose memory a process holds is not free, whatever that process is (docs/attribution.md, "Protected by
    default"). A GPU that only their memory keeps from being free fails the wait at once, naming them and the next
    step, as nothing will end them. To leave such a holder's memory out, name it in O(exclude).
  - Polls every O(poll_interval) seconds with no fixed sleeps, so it returns within one poll interval of the
    release (the driver frees a dead process's memory some time after its last handle closes).
  - On timeout it fails with a report per GPU (RV(gpus)) giving the memory still used, the processes still holding it
    with their state, the memory no process explains, and the next step an operator can take.
  - A driver call that hangs does not hang the module. The first NVML query (which initializes NVML) is bounded by
    O(driver_timeout), each later one by the time left before O(timeout) plus one second.
  - Without the NVIDIA driver library it waits for the holders alone (from the C(/proc) scan) and says so.
extends_documentation_fragment: [gpuops.nvidia.attributes, gpuops.nvidia.attributes.info_module, gpuops.nvidia.nvml,
  gpuops.nvidia.selection]
options:
  gpus:
    description:
      - GPUs to wait for, as NVML indices (ASCII digits), GPU UUIDs or MIG UUIDs (C(MIG-...), that MIG instance only,
        its memory and holders). Omitted, all GPUs; null, an empty list or a blank entry is refused.
    type: list
    elements: raw
  timeout:
    description:
      - Seconds to wait before failing with the report (0 is one look; at most 3600). With O(progress_interval), the
        whole wait over all its slices.
    type: float
    default: 60.0
  progress_interval:
    description:
      - Seconds between two lines of progress (at most 3600). V(0), the default, waits in one module run and prints
        nothing.
      - Greater than 0, the action plugin on the controller runs the module in slices of at most this many seconds,
        each bounded by the time left before O(timeout) on the controller's clock, which counts each slice's module
        start too (0.3-1 s a run). The whole wait ends within O(timeout) plus one slice's start, however small this
        is. After a slice that ended with GPUs still held, where waiting can help (the driver answered, some GPU still
        held answers without an error) and time is left, it prints one line on the controller's output (C(still
        waiting after N s of T s) and, per GPU still held, its used memory in MiB and the PIDs that hold it), then runs
        the next slice.
      - The result is the last slice's, with RV(elapsed_s) the whole wait on the controller's clock, RV(polls) summed
        over all slices, RV(slices), and a message that names the whole time waited.
    type: float
    default: 0.0
  max_used_mib:
    description:
      - Used memory in MiB at or below which a GPU without holders counts as released.
      - The default, 256, tolerates the few MiB an idle GPU reports in NVML v2 C(used). Where only NVML memory info
        v1 answers (driver R510 or later), used memory includes reserved memory, which nothing tells apart, so 5% of the
        GPU's memory, at most 1024 MiB (C(reserved_allowance_mib) in RV(gpus)), is added to the threshold there, and C(memory_note)
        says so (docs/attribution.md, "v1 memory").
    type: int
    default: 256
  poll_interval:
    description:
      - Seconds between two looks at the GPUs. A look costs a few milliseconds of CPU on a node with a few hundred
        processes; with the default the module returns within about 0.05 s of the release there. At most 60.
    type: float
    default: 0.02
  pids:
    description:
      - Only these PIDs count as holders to wait for (the selection of M(gpuops.nvidia.gpu_kill)); other holders are
        left alone and their memory does not make the wait fail. Omitted, any; null, an empty list or a blank entry is refused.
    type: list
    elements: int
  match:
    description:
      - Only holders whose full command line matches this Python regex count (as in M(gpuops.nvidia.gpu_kill)).
        Omitted, any; null, an empty or blank string is refused.
    type: str
  users:
    description: Only holders owned by these users (names or UIDs) count. Omitted, any; null, an empty list or a blank entry is refused.
    type: list
    elements: str
  exclude:
    description:
      - Process names (kernel comm or basename of argv[0]) left out, added to the protected daemons; their memory is
        left out of the release decision too, and named (RV(gpus)). A name is what anyone can give a process, so
        only what the operator names here is left out by name.
    type: list
    elements: str
    default: []
  include_protected:
    description: Count the protected GPU daemons as holders too (as when M(gpuops.nvidia.gpu_kill) ends them).
    type: bool
    default: false
  units:
    description: Only holders in these systemd units count (as in M(gpuops.nvidia.gpu_kill)). Omitted, any; null, an empty list or a blank entry is refused.
    type: list
    elements: str
  containers:
    description: Only holders in these containers (full id or a unique prefix of 12 or more hex characters) count. Omitted, any.
    type: list
    elements: str
  pods:
    description: Only holders in these Kubernetes pods (UID or V(NAMESPACE/NAME)) count. Omitted, any.
    type: list
    elements: str
  slurm_jobs:
    description: Only holders in these Slurm jobs count. Omitted, any.
    type: list
    elements: str
  driver_timeout:
    description:
      - Longest wait in seconds for one NVML query (greater than 0, at most 600); after the first, also bounded by the
        time left before O(timeout) plus one second.
    type: float
    default: 10.0
  return_after:
    description:
      - Return RV(after), the GPUs and all their holders at the last look. V(false) leaves it out (about 6 KB less per
        host with 8 GPUs, for checks across large inventories); RV(gpus) and the message still name what holds the
        selected GPUs. C(playbooks/check_gpus.yml) sets V(false).
    type: bool
    default: true
  recovery:
    description:
      - Also read what the driver advises about each selected GPU after the wait (M(gpuops.nvidia.gpu_facts) C(recovery), with
        its recovery action, rows pending remapping, pages pending retirement, recent Xids of such kinds), and fail
        where one needs a GPU reset, a reboot or another step, naming the GPU, why and the next step (RV(advice)).
      - C(playbooks/check_gpus.yml) sets it.
    type: bool
    default: false
  require_memory:
    description:
      - Fail when the used memory of a selected GPU could not be read (no usable NVIDIA driver library, or a GPU whose
        memory the driver does not report, a unified-memory GB10), even though no holder was found. With V(false) such
        a wait succeeds (RV(memory_checked) is V(false)).
      - C(playbooks/check_gpus.yml) sets it unless C(check_gpus_allow_proc_only) is true.
    type: bool
    default: false
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

- name: Wait up to 10 minutes, with a line of progress every 30 seconds while GPUs are still held
  gpuops.nvidia.gpu_wait:
    timeout: 600
    progress_interval: 30
"""

RETURN = r"""
advice:
  description:
    - With O(recovery), the selected GPUs that need a GPU reset, a reboot or another step, each with C(index), C(needs)
      (C(reset), C(reboot) or C(other)) and C(why) (the reasons, in words); [] where none does.
  returned: with O(recovery), when the GPUs could be read
  type: list
  elements: dict
released:
  description: Whether every selected GPU was released before the timeout.
  returned: always
  type: bool
elapsed_s:
  description: Seconds waited; with O(progress_interval), the whole wait on the controller's clock, the slices' module runs included.
  returned: always
  type: float
polls:
  description: Number of looks at the GPUs (in all slices, with O(progress_interval)).
  returned: always
  type: int
slices:
  description: Number of module runs the wait took (one per slice); a line of progress was printed between two.
  returned: when O(progress_interval) is greater than 0
  type: int
gpus:
  description:
    - Per selected GPU at the last look, C(index), C(uuid), C(memory_used_mib), C(memory_reserved_mib), C(unexplained_mib)
      (used memory the driver's lists do not explain, null when unknown), C(memory_unexplained) (beyond the tolerance
      O(max_used_mib)), C(holders) (selected holders still holding it, with C(pid), C(comm), C(state), C(cmdline), C(user),
      C(memory_mib), C(attribution), C(parent)), C(left_alone) (the same fields plus C(reason) and C(counted), true
      where its memory counts, for a protected holder), C(left_alone_mib) (the memory of those the operator left out,
      the exited creators' contexts they keep included, subtracted), C(protected_mib) (the memory of the protected
      holders, which counts),
      C(foreign) (driver-listed PIDs that no process here confirms, with C(pid), C(used_mib), C(type), C(reason), C(comm)),
      C(exited) (listed creators that have exited, the same keys, as in M(gpuops.nvidia.gpu_facts)), C(kept) (null, or
      the contexts of those creators that holders left alone keep, with C(creators) and their listed memory C(mib), counted in
      C(left_alone_mib), or in C(protected_mib) where a protected holder keeps them, once no selected holder holds such a
      context and they are no more than the groups left alone can hold, else C([]) and 0; C(holders) the left-alone
      processes that hold them; C(shared) the groups of a selected holder and one left alone that share one context,
      which stays until the left-alone ones exit; C(unheld) how many listed contexts no group here can hold, being
      released or held where the look cannot see), C(unexplained_cause) (as in M(gpuops.nvidia.gpu_facts), where the
      memory no process explains counts, else null),
      C(suspects) (PIDs holding the device file where a holder is looked for and none shows a context), C(error),
      C(memory_checked) (false when NVML could not be asked or does not report the memory) and C(released).
    - C(mig_uuid) is null for a whole GPU; for a selected MIG instance the entry has that instance's figures,
      C(mig_uuid) and C(mig_profile). C(reserved_allowance_mib) is added to O(max_used_mib) where used memory includes
      reserved memory (NVML memory info v1), with C(memory_note) saying so; else 0 and null.
    - On failure each GPU not released also has C(next_step), what an operator can do next, and a whole GPU in MIG mode
      C(mig_in_use), its MIG instances that hold memory above O(max_used_mib) or processes (C(uuid), C(profile),
      C(memory_used_mib), C(holder_pids)), which the message names too.
    - Without any index map (no NVML and no C(/proc/driver/nvidia)) there is one entry with C(index) null for all GPUs.
  returned: always
  type: list
  elements: dict
memory_checked:
  description: False when the memory of some selected GPU could not be read (no driver library, a lost GPU, memory
    the driver does not report).
  returned: always
  type: bool
left_alone:
  description:
    - Holders of the selected GPUs that the selection leaves alone (C(pid), C(comm), C(state), C(cmdline), C(user),
      C(memory_mib), C(reason), C(gpu)), one entry per GPU they hold.
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
  returned: when the GPUs could be read (not when an option is invalid) and O(return_after) is true
  type: dict
  sample: {"driver": {"available": true}, "gpus": [{"index": 0, "memory_used_mib": 0, "holder_pids": []}], "holders": [],
           "unmapped_minors": [], "index_source": "nvml"}
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus, _outcome, _wait_run


def main() -> None:
    module = AnsibleModule(argument_spec=_wait_run.argument_spec(), supports_check_mode=True)
    _gpus.check_libraries(module, missing_required_lib)
    _outcome.exit_with(module, _wait_run.run(module.params))


if __name__ == "__main__":
    main()
