# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_container
short_description: Start and stop a vLLM instance's container with podman or docker
version_added: 0.1.0
description:
  - The container step of the gpuops.nvidia.vllm_server role's start and stop phases, through the runtime's command
    line. Every call of the runtime is bounded (120 seconds; a stop, O(timeout) seconds more).
  - "O(state=started) runs C(RUNTIME) with O(argv) (C(run -d ...), as the role builds it), with O(environment) in the
    runtime's own environment: the command passes each variable by name (C(-e NAME)), so no value is on a command
    line. A container of that O(name) that does not run is removed first; one that runs is refused."
  - "O(state=absent) stops the container (C(RUNTIME stop -t TIMEOUT NAME): the stop signal, SIGKILL after O(timeout)
    seconds) and removes it. What it left on the GPUs outside its PID namespace is M(gpuops.nvidia.gpu_kill)'s."
author: gpuops maintainers (@gpuops)
extends_documentation_fragment:
  - gpuops.nvidia.attributes
attributes:
  check_mode:
    support: full
    details:
      - Starts and stops nothing; reports whether it would.
  diff_mode:
    support: none
options:
  runtime:
    description: The container runtime's command, found on the host's C(PATH).
    type: str
    choices: [podman, docker]
    required: true
  name:
    description: The container's name.
    type: str
    required: true
  state:
    description: V(started) to run the container, V(absent) to stop and remove it.
    type: str
    choices: [started, absent]
    default: started
  argv:
    description: The runtime's arguments that run the container (C(run -d --name NAME ... IMAGE ARGS)), for O(state=started).
    type: list
    elements: str
  environment:
    description: Variables the runtime passes to the container by name.
    type: dict
    default: {}
  timeout:
    description: Seconds between the stop signal and SIGKILL, for O(state=absent).
    type: float
    default: 60.0
"""

EXAMPLES = r"""
- name: Stop vLLM instance qwen's container
  gpuops.nvidia.vllm_container:
    runtime: podman
    name: vllm-qwen
    state: absent
    timeout: 60
"""

RETURN = r"""
container:
  description:
    - "The container as the runtime inspects it (C(id), C(image_id), C(image), C(status), C(running), C(pid): its PID 1
      on the host, C(exit_code), C(health), C(labels)): after the start, or before the stop; null when there was none."
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _container_run


def main() -> None:
    module = AnsibleModule(
        argument_spec=_container_run.argument_spec(),
        required_if=[("state", "started", ("argv",))],
        supports_check_mode=True,
    )
    _outcome.exit_with(module, _container_run.run(module.params, module.check_mode))


if __name__ == "__main__":
    main()
