# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_guard
short_description: Write a host's GPU memory, orphaned holders and vLLM engine states as a node_exporter textfile
version_added: 0.1.0
description:
  - One look at the host, as M(gpuops.nvidia.gpu_facts) takes it (the driver's process lists and a scan of
    C(/proc), with each holder's owner), turned into Prometheus gauges for node_exporter's textfile collector.
  - Per GPU, memory used, reserved and unexplained (bytes), the holders and the orphaned holders. A holder is
    orphaned when its server or job is gone (docs/guard.md) - vLLM engine processes whose API server has exited, a
    holder whose systemd service is inactive or failed, whose Kubernetes pod is gone or whose Slurm job has ended,
    and a holder of an exited creator's context.
  - Per orphan and GPU, C(gpuops_nvidia_guard_orphan_memory_bytes) with the labels C(pid) and C(start_ticks) (the
    start time in clock ticks since boot, field 22 of C(/proc/PID/stat)), which name the process exactly, so that a
    remediation can end that process and no other (M(gpuops.nvidia.gpu_kill)'s O(gpuops.nvidia.gpu_kill#module:pid_start_ticks)).
  - Per vLLM instance of O(vllm_instances), its state - V(stalled) when C(/health) answers 200 while requests run
    and C(vllm:generation_tokens_total) does not move for O(stall_seconds); V(healthy) when tokens come or no
    request runs; V(down) when C(/health) does not answer 200; V(unknown) when C(/metrics) lacks the figures. The
    instances are watched at the same time, so the module takes at most O(stall_seconds) plus the requests'
    deadlines; an idle instance, or one that generates, is judged at once.
  - Signals nothing and changes nothing on the host but the textfile.
  - The result's C(msg) is the look in one line - per GPU its orphaned holders and the MiB that no listed process
    explains, then the state of each vLLM instance.
author: gpuops maintainers (@gpuops)
extends_documentation_fragment: [gpuops.nvidia.attributes, gpuops.nvidia.attributes.no_diff]
attributes:
  check_mode:
    details:
      - Looks and watches as usual; writes no textfile, and says whether it would change.
options:
  gpus:
    description: V(false) watches the vLLM instances only (C(playbooks/check_vllm.yml)); no GPU is looked at.
    type: bool
    default: true
  textfile:
    description:
      - Absolute path of the textfile on the host, in node_exporter's C(--collector.textfile.directory), ending in
        C(.prom). Written atomically. Not set, nothing is written and the text is returned.
      - Its directory must exist and be writable; otherwise the module fails before it looks, naming that directory.
    type: path
  inventory_hostname:
    description:
      - The host's name in the inventory, added as the label C(inventory_hostname) to each orphan's series, so that
        an alert names the host to remediate as Ansible knows it.
    type: str
  vllm_instances:
    description:
      - The vLLM instances of the host to watch. Each has C(name) (the label C(vllm_instance)), C(url) (as the host
        reaches it, for example V(http://127.0.0.1:8000)), and optionally C(api_key) and C(validate_certs).
    type: list
    elements: dict
    default: []
  stall_seconds:
    description: Seconds without a generated token, with requests running, after which an instance is V(stalled).
    type: float
    default: 30
  request_timeout:
    description: Deadline of each HTTP request to an instance, in seconds.
    type: float
    default: 5
  driver_timeout:
    description: Seconds the NVIDIA driver may take to answer (greater than 0, at most 600).
    type: float
    default: 10
  max_used_mib:
    description: Unexplained memory up to this many MiB is not counted (reported as the tolerance).
    type: int
    default: 256
"""

EXAMPLES = r"""
- name: Write the guard's textfile beside the reset's
  gpuops.nvidia.gpu_guard:
    textfile: /var/lib/prometheus/node-exporter/gpuops_nvidia_guard.prom
    inventory_hostname: "{{ inventory_hostname }}"
    vllm_instances:
      - {name: qwen, url: "http://127.0.0.1:8000"}
    stall_seconds: 30
"""

RETURN = r"""
orphans:
  description: The orphaned holders, by PID.
  returned: always
  type: list
  elements: dict
  contains:
    pid: {description: "PID", type: int}
    start_ticks: {description: "start time in clock ticks since boot (field 22 of /proc/PID/stat)", type: int}
    comm: {description: "process name", type: str}
    reason: {description: "why it is orphaned (vllm_server_exited, unit_inactive, slurm_job_ended, pod_gone, exited_creator)", type: str}
    owner_label: {description: "its owner as a label value (docs/owners.md)", type: str}
    gpus: {description: "GPU indices it holds", type: list, elements: int}
    memory_mib: {description: "MiB it holds per GPU index (null where it shares an exited creator's context)", type: dict}
vllm:
  description: The state of each instance of O(vllm_instances), in order.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: the instance's name
      type: str
    url:
      description: its URL
      type: str
    state:
      description: healthy, stalled, down or unknown
      type: str
    reason:
      description: why, in words
      type: str
    requests_running:
      description: requests running at the last reading (null when not read)
      type: int
    generation_tokens:
      description: "vllm:generation_tokens_total at the last reading (null when not read)"
      type: float
    watched_s:
      description: seconds watched
      type: float
metrics:
  description: The textfile's text.
  returned: always
  type: str
textfile:
  description: Where the text was written; null when O(textfile) is not set or in check mode.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus, _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _guard


def main() -> None:
    module = AnsibleModule(argument_spec=_guard.argument_spec(), supports_check_mode=True)
    if module.params["gpus"]:
        _gpus.check_libraries(module, missing_required_lib)
    _outcome.exit_with(module, _guard.run(module.params, module.check_mode))


if __name__ == "__main__":
    main()
