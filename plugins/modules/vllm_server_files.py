# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_server_files
short_description: Write the files of one vllm_server instance, or say which differ
version_added: 0.2.0
description:
  - Writes the files of one instance of the gpuops.nvidia.vllm_server role in one step, each atomically (a
    temporary file in its directory, then a rename).
  - "C(<config_dir>/<name>.json), the instance's configuration (mode 0600: its environment may hold a secret);
    C(<config_dir>/<name>.env), the API key as C(VLLM_API_KEY=...) (mode 0600, owned by O(owner)), removed when
    O(api_key) is empty; the systemd unit O(unit_file) when given (mode 0644)."
  - In check mode it writes nothing and says which files differ. The role compares this way before it decides to
    restart an instance.
  - The diff shows the configuration and the unit, never the API key.
author: gpuops maintainers (@gpuops)
extends_documentation_fragment: [gpuops.nvidia.attributes, gpuops.nvidia.attributes.full_check]
attributes:
  check_mode:
    details: Writes nothing; RV(changed_files) says what would change.
  diff_mode:
    support: full
    details: The configuration and the unit; the API key file only as changed or not.
options:
  name:
    description: The instance's name.
    type: str
    required: true
  config:
    description: The instance's configuration, written as JSON.
    type: dict
    required: true
  config_dir:
    description: The directory of the configuration and API key files. It must exist.
    type: path
    required: true
  api_key:
    description: The instance's API key; empty for none.
    type: str
    default: ""
  owner:
    description: Owner of the API key file (the user the server runs as).
    type: str
  unit_file:
    description: Path of the instance's systemd unit; not given for a detached server.
    type: path
  unit:
    description: Content of the systemd unit.
    type: str
seealso:
  - module: gpuops.nvidia.vllm_server_host
"""

EXAMPLES = r"""
- name: Write the files of instance qwen
  gpuops.nvidia.vllm_server_files:
    name: qwen
    config: "{{ qwen_config }}"
    config_dir: /etc/vllm
"""

RETURN = r"""
changed_files:
  description: Which files differ (check mode) or were written, of C(configuration), C(API key), C(systemd unit).
  returned: always
  type: list
  elements: str
  sample: [configuration]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_files


def main() -> None:
    module = AnsibleModule(
        argument_spec=_vllm_files.argument_spec(), required_together=[("unit_file", "unit")], supports_check_mode=True
    )
    outcome = _vllm_files.run(
        module.params,
        module.check_mode,
        module._diff,
        lambda path, owner: module.set_owner_if_different(path, owner, False),
    )
    _outcome.exit_with(module, outcome)


if __name__ == "__main__":
    main()
