# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: guard_ledger
short_description: The guard's rate limit and log of remediations, on the controller
version_added: 0.1.0
description:
  - Used by playbooks/guard_remediate.yml on the controller (docs/guard.md); run it delegated to C(localhost).
  - With O(claim_host), takes the host's remediation slot - at most one remediation per host and mode (check or
    real) per O(interval) seconds - under an exclusive lock on O(state_dir), or says when the last one was.
  - Appends O(entries) to the JSON Lines file O(log), each line with its C(time) (UTC), under the same lock.
  - Signals nothing; touches only O(state_dir) and O(log).
author: gpuops maintainers (@gpuops)
extends_documentation_fragment:
  - gpuops.nvidia.attributes
attributes:
  check_mode:
    support: full
    details:
      - Claims and logs in check mode too; the rate limit and the log are kept apart per mode (O(mode)).
  diff_mode:
    support: none
options:
  state_dir:
    description: Directory of the ledger's state and lock (created when missing).
    type: path
    required: true
  log:
    description: The JSON Lines log file (its directory is created when missing).
    type: path
    required: true
  claim_host:
    description: The host whose slot to claim. Not set, nothing is claimed.
    type: str
  mode:
    description: V(check) or V(remediate); each has its own slots.
    type: str
    choices: [check, remediate]
    default: check
  interval:
    description: Seconds between two remediations of a host in one mode.
    type: float
    default: 3600
  entries:
    description: Log entries (dicts), appended in order after the claim; the claim's refusal is logged as well.
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
- name: Claim the host's slot
  gpuops.nvidia.guard_ledger:
    state_dir: /var/lib/gpuops-nvidia/guard
    log: /var/log/gpuops-nvidia/guard.jsonl
    claim_host: gpu07
    interval: 3600
  delegate_to: localhost
"""

RETURN = r"""
claimed:
  description: Whether the slot was taken (true when O(claim_host) is not set).
  returned: always
  type: bool
refusal:
  description: Why the slot was not taken; null when it was.
  returned: always
  type: str
lines:
  description: The log lines written.
  returned: always
  type: list
  elements: str
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _guard_ledger


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", required=True),
            log=dict(type="path", required=True),
            claim_host=dict(type="str"),
            mode=dict(type="str", choices=["check", "remediate"], default="check"),
            interval=dict(type="float", default=3600.0),
            entries=dict(type="list", elements="dict", default=[]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    _options.refuse_bad_numbers(module, ("interval",))
    now = time.time()
    claimed, refusal, entries = True, None, list(params["entries"])
    try:
        if params["claim_host"]:
            claimed, refusal = _guard_ledger.claim(
                params["state_dir"], params["claim_host"], params["mode"], params["interval"], now
            )
            if refusal:
                entries.append({"host": params["claim_host"], "mode": params["mode"], "refused": refusal})
        lines = _guard_ledger.append(params["state_dir"], params["log"], entries, now) if entries else []
    except OSError as exc:
        module.fail_json(msg="the guard's ledger %s or log %s: %s" % (params["state_dir"], params["log"], exc))
    module.exit_json(
        changed=bool(lines) or (claimed and bool(params["claim_host"])), claimed=claimed, refusal=refusal, lines=lines
    )


if __name__ == "__main__":
    main()
