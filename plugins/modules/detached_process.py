# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: detached_process
short_description: Start and stop a long-running process without a service manager, with a pidfile and a log file
version_added: 0.1.0
description:
  - For hosts without systemd (containers, rented GPU hosts where servers are started with C(nohup)), runs a
    command detached from Ansible and ends it, and everything it started, reliably.
  - O(state=started) starts O(argv) in a new session (C(setsid)), with stdin on C(/dev/null) and stdout and stderr
    appended to O(log_file), and writes O(pidfile) with the PID and the process start time (field 22 of
    C(/proc/PID/stat)), which identifies the process even after its PID is reused. When the process of the
    pidfile is still running nothing is done.
  - O(state=stopped) sends SIGTERM to every process of that session (the leader and all its descendants, also
    those that outlived it, such as vLLM's C(VLLM::EngineCore) and C(VLLM::Worker_TP*) after the API server was
    SIGKILLed), waits up to O(grace_period) seconds, sends SIGKILL to those left and waits up to O(kill_wait)
    seconds. Each process is pinned by a pidfd before it is signalled, as in M(gpuops.nvidia.gpu_kill). The
    pidfile is removed once nothing survived.
  - Processes that left the session (started their own with C(setsid)) are not found; on GPU hosts follow with
    M(gpuops.nvidia.gpu_kill) on the process's GPUs.
  - The module does not compare O(argv) or O(environment) with those of a running process; stop it first to
    apply new ones (RV(running_cmdline) shows what runs).
author: gpuops maintainers (@gpuops)
extends_documentation_fragment: [gpuops.nvidia.attributes, gpuops.nvidia.attributes.no_diff]
attributes:
  check_mode:
    details:
      - Starts and signals nothing; reports whether it would, and RV(would_signal) for O(state=stopped).
options:
  state:
    description: V(started) to have the process running, V(stopped) to have it and its session ended.
    type: str
    choices: [started, stopped]
    default: started
  argv:
    description: The command and its arguments. Required with O(state=started).
    type: list
    elements: str
  pidfile:
    description: Path of the pidfile (its directory must exist).
    type: path
    required: true
  log_file:
    description:
      - File receiving stdout and stderr (appended; created with mode 0640; its directory must exist). Each start
        first appends a line with the time and the command. Required with O(state=started).
    type: path
  environment:
    description: Environment variables for the process, set after those of O(environment_files).
    type: dict
    default: {}
  environment_files:
    description:
      - Files of C(KEY=VALUE) lines read on the managed host at start, as systemd's C(EnvironmentFile=) (comments
        with C(#) or C(;), optional quotes). Keeps secrets such as an API key out of module arguments.
    type: list
    elements: path
    default: []
  inherit_environment:
    description: Start from the environment of the module's process (as a shell's C(nohup) would); V(false) starts from an empty one.
    type: bool
    default: true
  cwd:
    description: Working directory of the process.
    type: path
    default: /
  grace_period:
    description:
      - Seconds between SIGTERM and SIGKILL with O(state=stopped), as O(gpuops.nvidia.gpu_kill#module:grace_period).
      - A finite number, 0 or more.
    aliases: [stop_timeout]
    type: float
    default: 30.0
  kill_wait:
    description: Seconds to wait for exit after SIGKILL before failing.
    type: float
    default: 10.0
notes:
  - The process runs as the user the module runs as (use C(become_user) to choose it).
seealso:
  - module: gpuops.nvidia.gpu_kill
  - name: setsid(2)
    description: Sessions and process groups.
    link: https://man7.org/linux/man-pages/man2/setsid.2.html
"""

EXAMPLES = r"""
- name: Start vLLM detached, as nohup would, with a pidfile and a log file
  gpuops.nvidia.detached_process:
    argv: [/opt/vllm/bin/vllm, serve, /models/Qwen3-32B, --port, "8000", --tensor-parallel-size, "4"]
    environment:
      CUDA_VISIBLE_DEVICES: "0,1,2,3"
    environment_files: [/etc/vllm/qwen.env]
    pidfile: /var/lib/vllm/qwen.pid
    log_file: /var/log/vllm/qwen.log
  register: server

- name: Stop it and everything it started, giving it 60 s to shut down
  gpuops.nvidia.detached_process:
    state: stopped
    pidfile: /var/lib/vllm/qwen.pid
    grace_period: 60
"""

RETURN = r"""
pid:
  description: PID of the session leader (the process started), or null when there is none.
  returned: always
  type: int
  sample: 4242
start_ticks:
  description: Start time of RV(pid) in clock ticks since boot, as in the pidfile.
  returned: when O(state=started) and the process runs (not in check mode when it had to be started)
  type: int
log_offset:
  description: Size of O(log_file) in bytes before this start wrote to it, where the new process's lines begin.
  returned: when the process was started (not in check mode)
  type: int
running_cmdline:
  description: Command line of the process that was already running (nothing was started).
  returned: when O(state=started) and the process was already running
  type: str
would_signal:
  description:
    - In check mode with O(state=stopped), the session's processes that would be signalled, each with C(pid), C(ppid),
      C(comm), C(cmdline) and C(start_ticks); RV(signalled), RV(exited), RV(survived) and RV(not_signalled) list
      processes in the same form.
  returned: when O(state=stopped)
  type: list
  elements: dict
  sample: [{"pid": 4242, "ppid": 1, "comm": "vllm", "cmdline": "/opt/vllm/bin/vllm serve ...", "start_ticks": 81234}]
signalled:
  description: Processes signalled, with C(signals) (names sent in order) and C(exited_after_s) for those that exited.
  returned: when O(state=stopped)
  type: list
  elements: dict
exited:
  description: Signalled processes that exited, with C(exited_after_s) (seconds from the first signal).
  returned: when O(state=stopped)
  type: list
  elements: dict
survived:
  description: Processes still alive after SIGKILL, with C(state) and C(reason).
  returned: when O(state=stopped)
  type: list
  elements: dict
not_signalled:
  description: Processes of the session that were not signalled because they exited, or their PID was reused, first.
  returned: when O(state=stopped)
  type: list
  elements: dict
elapsed_s:
  description: Seconds the module took.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _detached_run


def main() -> None:
    module = AnsibleModule(
        argument_spec=_detached_run.argument_spec(),
        required_if=[("state", "started", ("argv", "log_file"))],
        supports_check_mode=True,
    )
    _outcome.exit_with(module, _detached_run.run(module.params, module.check_mode))


if __name__ == "__main__":
    main()
