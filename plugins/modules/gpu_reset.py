# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_reset
short_description: Reset NVIDIA GPUs whose memory no process explains, or that the driver says need a reset
version_added: 0.1.0
description:
  - For a selected GPU that no process holds whose used memory is above O(max_used_mib) (a leaked context, memory
    that no process explains), or that the driver says needs a reset (its recovery action, rows pending remapping,
    pages pending retirement, a recent Xid of such a kind; M(gpuops.nvidia.gpu_facts) C(recovery)). Every other
    selected GPU is left alone. docs/recovery.md says when to reset, what this does and refuses, and what only a
    reboot fixes.
  - The GPUs linked to such a GPU directly by NVLink are reset in the same command (nvidia-smi(1) - where a GPU cannot
    be reset alone, its NVLink peers must be reset with it); the preconditions hold for them too.
  - Every precondition is checked and named before anything changes (RV(checks)) - root; the host itself, not a
    container, in the initial PID namespace (or O(own_pid_namespace)); C(nvidia-smi) on PATH; the driver answers each
    GPU; its advice is not a reboot or another step a reset cannot take; no process holds it; every process with its
    device file open is a GPU daemon (C(nvidia-persistenced), C(nv-hostengine), C(dcgm-exporter), the Fabric Manager,
    known by its executable) in a systemd unit; no MIG instance (a reset destroys them). One refused, nothing changes.
  - The steps (RV(steps)) - each daemon's unit stopped (C(systemctl stop)), a look again that nothing else uses the
    GPUs, persistence mode off where it is on (C(nvidia-smi -pm 0 -i UUID)), C(nvidia-smi --gpu-reset -i UUID,...)
    bounded by O(reset_timeout), persistence mode on again, the units started again. A failure before the reset
    undoes what was done, newest first. Then a verification - memory back at idle, no advice of a reset left,
    persistence mode and the units as before.
  - A failed reset maps nvidia-smi's exit code and message to the next step (a node reboot, with the Slurm drain
    command). In check mode it lists the steps and changes nothing.
author: gpuops maintainers (@gpuops)
requirements:
  - nvidia-ml-py >= 12.535.108 (module C(pynvml)) and psutil on the managed host; C(nvidia-smi) and C(systemctl)
extends_documentation_fragment:
  - gpuops.nvidia.attributes
options:
  gpus:
    description: GPUs to consider, as NVML indices or GPU UUIDs. Omitted, all GPUs; null or an empty list is refused.
    type: list
    elements: raw
  max_used_mib:
    description: Used memory (MiB, reserved memory excluded) at or below which a GPU that no process holds is idle.
    type: int
    default: 256
  reset_timeout:
    description: Seconds C(nvidia-smi --gpu-reset) may take (greater than 0, at most 3600); past it, the next step is a reboot.
    type: float
    default: 60.0
  command_timeout:
    description: Seconds each other command may take (C(systemctl stop) and C(start), C(nvidia-smi -pm)); greater than 0, at most 3600.
    type: float
    default: 120.0
  driver_timeout:
    description: Seconds to wait for NVML to answer (greater than 0, at most 600).
    type: float
    default: 10.0
  own_pid_namespace:
    description:
      - Accept a PID namespace that is not the initial one as the host's, where it holds every process of the machine
        (a systemd-nspawn or LXC system container with the GPUs). Elsewhere processes of other PID namespaces that use
        a GPU are invisible to the C(/proc) scan, and the driver's own refusal is then the last guard.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    details: Lists every step and the preconditions, and changes nothing.
  diff_mode:
    support: none
seealso:
  - module: gpuops.nvidia.gpu_facts
  - module: gpuops.nvidia.gpu_kill
"""

EXAMPLES = r"""
- name: Reset the GPUs whose memory no process explains, after the holders were ended
  gpuops.nvidia.gpu_reset:
  become: true
"""

RETURN = r"""
candidates:
  description: The selected GPUs a reset is for, by index (a string), with why.
  returned: always
  type: dict
  sample: {"0": "30000 MiB used that no process explains"}
gpus:
  description: The GPUs to reset, the candidates and their NVLink peers.
  returned: always
  type: list
  elements: int
checks:
  description: Every precondition (C(name), C(ok), C(gpus), C(why)), in the order checked.
  returned: always
  type: list
  elements: dict
steps:
  description: The steps (C(step), C(what), C(command), C(undo)), in order; in check mode what would be done.
  returned: always
  type: list
  elements: dict
done:
  description: The steps done, in words.
  returned: when something was run
  type: list
  elements: str
undone:
  description: The steps undone after a failure (C(what), C(error) null where the undo worked).
  returned: when something was run
  type: list
  elements: dict
gpus_after:
  description: Each reset GPU after the reset (C(index), C(memory_used_mib), C(recovery)).
  returned: after a reset
  type: list
  elements: dict
next_step:
  description: The operator's next step after a refusal or a failure.
  returned: on failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpu_reset, _gpus, _options, _outcome


def main() -> None:
    module = AnsibleModule(argument_spec=_gpu_reset.argument_spec(), supports_check_mode=True)
    _gpus.check_libraries(module, missing_required_lib)
    _options.refuse_bad_numbers(module, _gpu_reset.NUMBERS, **_options.bounds(_options.GPU, _gpu_reset.NUMBERS))
    result = _gpu_reset.run(module.params, module.check_mode)
    _outcome.exit_with(module, _outcome.Outcome(result, failed=result.pop("failed")))


if __name__ == "__main__":
    main()
