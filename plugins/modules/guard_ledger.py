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
  - With O(claim_hosts), takes each host's remediation slot - at most one remediation per host and mode (check or
    real) per O(interval) seconds - under an exclusive lock on O(state_dir), or says when the last one was.
  - Appends O(entries) and O(decided) to the JSON Lines file O(log), each line with its C(time) (UTC), under the
    same lock.
  - With O(take_inbox), takes the webhook calls that the rulebook's source C(gpuops.nvidia.guard_webhook) wrote to
    O(state_dir)/inbox (RV(calls)), and logs a line for each call it rejected.
  - With O(screen), refuses and logs, without a look at the host, the processes of a host whose slot is taken and
    the processes decided within O(interval) seconds (O(decided)); RV(hosts) is what is left to look at.
  - Signals nothing; touches only O(state_dir) and O(log).
author: gpuops maintainers (@gpuops)
extends_documentation_fragment: [gpuops.nvidia.attributes, gpuops.nvidia.attributes.no_diff]
attributes:
  check_mode:
    details:
      - Claims and logs in check mode too; the rate limit and the log are kept apart per mode (O(mode)).
options:
  state_dir:
    description: Directory of the ledger's state and lock (created when missing).
    type: path
    required: true
  log:
    description: The JSON Lines log file (its directory is created when missing).
    type: path
    required: true
  claim_hosts:
    description: The hosts whose slots to claim (RV(claimed), RV(refusals)).
    type: list
    elements: str
    default: []
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
    description: Log entries (dicts), appended in order after the claim.
    type: list
    elements: dict
    default: []
  decided:
    description:
      - Log entries of processes that a look refused (C(host), C(mode), C(pid), C(start_ticks), C(why)), appended
        after O(entries). Each is decided for O(interval) seconds - O(screen) then refuses it without a look.
    type: list
    elements: dict
    default: []
  take_inbox:
    description: Take the webhook calls waiting in O(state_dir)/inbox (RV(calls)); each rejected call is logged.
    type: bool
    default: false
  screen:
    description:
      - "The processes each host is asked to free (C({HOST: [{pid, start_ticks, alerts}]}), the C(hosts) of the
        filter C(gpuops.nvidia.guard.plan)). Those of a host whose slot in O(mode) is taken, and those decided
        within O(interval) seconds, are refused and logged; RV(hosts) keeps the rest."
    type: dict
"""

EXAMPLES = r"""
- name: Claim the host's slot
  gpuops.nvidia.guard_ledger:
    state_dir: /var/lib/gpuops-nvidia/guard
    log: /var/log/gpuops-nvidia/guard.jsonl
    claim_hosts: [gpu07]
    interval: 3600
  delegate_to: localhost
"""

RETURN = r"""
claimed:
  description: The hosts of O(claim_hosts) whose slot was taken.
  returned: always
  type: list
  elements: str
refusals:
  description: "The hosts of O(claim_hosts) whose slot was not taken, and why (C({HOST: why}))."
  returned: always
  type: dict
calls:
  description: The payloads of the webhook calls taken from the inbox, oldest first (empty without O(take_inbox)).
  returned: always
  type: list
  elements: dict
hosts:
  description: O(screen) less what it refused (empty without O(screen)).
  returned: always
  type: dict
lines:
  description: The log lines written.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _guard_ledger, _outcome


def main() -> None:
    module = AnsibleModule(argument_spec=_guard_ledger.argument_spec(), supports_check_mode=True)
    _outcome.exit_with(module, _guard_ledger.run(module.params))


if __name__ == "__main__":
    main()
