# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_ready
short_description: Wait until a vLLM server is healthy, serves its model and completes a request
version_added: 0.1.0
description:
  - Polls a vLLM OpenAI-compatible server until C(GET /health) answers 200, C(GET /v1/models) lists
    O(served_model_name) and one completion of O(completion_max_tokens) tokens succeeds.
  - vLLM binds its port early but only listens once the model is loaded (minutes for large models, more with a
    cold C(torch.compile) cache), so refused connections count as "still loading" until O(timeout).
  - With O(pid) or O(pidfile) the wait ends as soon as that process exits (a crash during loading), instead of
    waiting out O(timeout).
  - A 4xx answer from C(/v1/models) or the completion (wrong API key, prompt longer than C(--max-model-len))
    ends the wait at once.
  - With O(timeout=0) it looks once, which tells whether a running server is healthy.
author: gpuops maintainers (@gpuops)
extends_documentation_fragment:
  - gpuops.nvidia.attributes
  - gpuops.nvidia.vllm_server
  - gpuops.nvidia.attributes.INFO_MODULE
options:
  served_model_name:
    description: Model name the server must list in C(/v1/models) (C(--served-model-name), else the model path).
    type: str
    required: true
    aliases: [model]
  timeout:
    description: Seconds to wait before failing.
    type: float
    default: 600.0
  poll_interval:
    description: Seconds between two looks.
    type: float
    default: 2.0
  request_timeout:
    default: 30.0
  pid:
    description:
      - PID of the server process (the API server) to watch; the module fails as soon as it exits.
      - V(0) says that no server process runs (as systemd's C(MainPID) of an inactive unit); the module then fails at once.
    type: int
  pidfile:
    description:
      - Instead of O(pid), the pidfile of a server started by M(gpuops.nvidia.detached_process) (PID and start time).
        A missing pidfile, or one whose process is not running, fails at once with RV(process_exited).
    type: path
  completion_max_tokens:
    description: Tokens to generate in the check completion (prompt V(Hello), temperature 0); V(0) skips it.
    type: int
    default: 4
notes:
  - The module fails when the server is not ready; RV(ready) and RV(last_error) say how far it got.
seealso:
  - module: gpuops.nvidia.vllm_acceptance
  - module: gpuops.nvidia.detached_process
"""

EXAMPLES = r"""
- name: Wait up to 30 minutes for a large model to load, failing at once if the server dies
  gpuops.nvidia.vllm_ready:
    url: http://127.0.0.1:8000
    served_model_name: qwen3-32b
    api_key: "{{ vault_vllm_api_key }}"
    pid: "{{ server.pid }}"
    timeout: 1800
    poll_interval: 5

- name: Is the server healthy right now? (one look)
  gpuops.nvidia.vllm_ready:
    url: http://127.0.0.1:8000
    served_model_name: qwen3-32b
    timeout: 0
  register: probe
  failed_when: false
"""

RETURN = r"""
ready:
  description: Whether the server was ready.
  returned: always
  type: bool
stage:
  description: The last check reached, V(health), V(models), V(completion) or V(ready).
  returned: always
  type: str
last_error:
  description: "What the last check saw when it was not ready (for example V(GET /health: Connection refused))."
  returned: always
  type: str
healthy_after_s:
  description: Seconds until C(/health) answered 200 with the model listed, or null.
  returned: always
  type: float
elapsed_s:
  description: Seconds waited in all.
  returned: always
  type: float
attempts:
  description: Number of looks.
  returned: always
  type: int
models:
  description: Model names listed by C(/v1/models) at the last look that got them.
  returned: always
  type: list
  elements: str
completion:
  description: The check completion, with C(text), C(completion_tokens) and C(elapsed_s); null when not ready or O(completion_max_tokens=0).
  returned: always
  type: dict
process_exited:
  description: Whether the process O(pid) (O(pidfile)) exited, or was not running, before the server was ready.
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _ready_run


def main() -> None:
    module = AnsibleModule(
        argument_spec=_ready_run.argument_spec(), mutually_exclusive=[("pid", "pidfile")], supports_check_mode=True
    )
    _outcome.exit_with(module, _ready_run.run(module.params))


if __name__ == "__main__":
    main()
