# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_drain
short_description: Wait until a vLLM server has no request in flight, then SIGTERM its main process
version_added: 0.1.0
description:
  - Polls C(GET /metrics) until vLLM's scheduler gauges C(vllm:num_requests_running) and C(vllm:num_requests_waiting)
    are both 0, or O(timeout) seconds pass. Run it after the server was taken out of routing (a load balancer, a
    gateway); while clients keep sending, the gauges never reach 0 and the wait takes the whole O(timeout).
  - With O(pid) or O(pidfile) it then sends SIGTERM to that process alone (the API server, C(vllm serve)), pinned by
    a pidfd so a reused PID is never hit, and waits up to O(grace_period) seconds for it to exit (with O(pidfile),
    for every process of its session, EngineCore and the workers included). On SIGTERM vLLM 0.33 stops taking requests and
    lets the running ones finish for up to its C(--shutdown-timeout) seconds (0, the default, aborts them at once).
    Nothing is SIGKILLed; what is left is for M(gpuops.nvidia.detached_process), systemd or M(gpuops.nvidia.gpu_kill).
  - A server on whose port nothing listens has nothing to drain (reported, not a failure). One that does not
    answer C(/metrics) within O(request_timeout), cuts the connection, or answers with an HTTP 5xx, is reported as
    not drained; the stop goes ahead, and what is in flight is left to C(--shutdown-timeout). So is it for a server
    started with C(--disable-log-stats), which exports no C(vllm:) metric (with a warning).
  - Fails before anything is signalled when the server cannot be asked. That is a host that does not resolve or
    cannot be reached, a failed TLS handshake (a certificate not trusted, see O(validate_certs), or V(https) to a
    plain http port), an answer that is not HTTP, an HTTP 4xx (a wrong O(url) or O(api_key)), or a server that does
    not serve O(served_model_name). V(http) to an https port is not always told apart. A server that cuts the
    connection instead of answering (as uvicorn does) reads as one that does not answer.
  - Fails after the stop only when the main process survives O(grace_period) with O(fail_on_survivors).
author: gpuops maintainers (@gpuops)
extends_documentation_fragment: [gpuops.nvidia.attributes, gpuops.nvidia.attributes.full_check, gpuops.nvidia.vllm_server]
attributes:
  check_mode:
    details:
      - Reads the gauges once and signals nothing.
  diff_mode:
    support: N/A
    details:
      - Reports no diff.
options:
  served_model_name:
    description:
      - Any name the server serves (C(--served-model-name)); omitted, every engine's gauges count.
      - vLLM 0.33 labels its metrics with the first served name only, so another name of the server is read under
        the first one, found in C(GET /v1/models). A name the server does not serve fails, and nothing is signalled.
    type: str
    aliases: [model]
  timeout:
    description: Seconds to wait for the gauges to reach 0. V(0) looks once.
    type: float
    default: 60.0
  poll_interval:
    description: Seconds between two readings of C(/metrics).
    type: float
    default: 1.0
  request_timeout:
    default: 10.0
  pid:
    description: PID of the server's main process (the API server; for systemd, the unit's C(MainPID)) to SIGTERM after the drain. V(0) means none.
    type: int
  pidfile:
    description: Instead of O(pid), the pidfile written by M(gpuops.nvidia.detached_process); the whole session is waited for.
    type: path
  start_ticks:
    description:
      - With O(pid), the start time of that process as read before (clock ticks since boot, field 22 of
        C(/proc/PID/stat)). When the PID now names another process, or none, nothing is signalled.
    type: int
  tree:
    description:
      - With O(pid), for a server that no session or unit of its own ends (one started by hand). After the SIGTERM of
        O(pid) alone, wait up to O(grace_period) seconds for it and for every process of its tree at the time of the
        signal (EngineCore, workers), then SIGKILL those left and wait up to O(kill_wait) seconds.
    type: bool
    default: false
  kill_wait:
    description: With O(tree), seconds to wait after the SIGKILL of what was left.
    type: float
    default: 10.0
  grace_period:
    description:
      - Seconds to wait after SIGTERM for the process (session) to exit. Make it longer than the server's C(--shutdown-timeout).
    type: float
    default: 60.0
    aliases: [stop_timeout]
  fail_on_survivors:
    description: Fail when processes are left after O(grace_period) (otherwise only C(stop.left) in RV(stop) lists them).
    type: bool
    default: false
notes:
  - Metric names and the shutdown behaviour follow vLLM 0.33 (C(vllm/v1/metrics/loggers.py), C(vllm/v1/engine/core.py)).
seealso:
  - module: gpuops.nvidia.vllm_ready
  - module: gpuops.nvidia.detached_process
  - name: vLLM production metrics
    description: The scheduler gauges.
    link: https://docs.vllm.ai/en/latest/usage/metrics.html
"""

EXAMPLES = r"""
- name: Take the server out of the load balancer
  ansible.builtin.uri:
    url: http://lb.example.com/api/backends/gpu07-8000/disable
    method: POST

- name: Let its requests finish (2 minutes at most), then SIGTERM it
  gpuops.nvidia.vllm_drain:
    url: http://127.0.0.1:8000
    served_model_name: qwen3-32b
    timeout: 120
    pidfile: /var/lib/vllm/qwen.pid
    grace_period: 90
  register: drained

- name: Say how many requests were still running at the stop
  ansible.builtin.debug:
    msg: "{{ drained.running }} running, {{ drained.waiting }} waiting after {{ drained.drain_s }} s"
"""

RETURN = r"""
drained:
  description: Whether no request was running or waiting at the end of the wait (also true when the server did not answer).
  returned: always
  type: bool
running_at_start:
  description: C(vllm:num_requests_running) at the first reading (null when unknown).
  returned: always
  type: int
waiting_at_start:
  description: C(vllm:num_requests_waiting) at the first reading (null when unknown).
  returned: always
  type: int
running:
  description: Requests running at the last reading, that is at the stop (null when unknown).
  returned: always
  type: int
  sample: 0
waiting:
  description: Requests waiting at the last reading (null when unknown).
  returned: always
  type: int
drain_s:
  description: Seconds the drain took.
  returned: always
  type: float
polls:
  description: Readings of C(/metrics).
  returned: always
  type: int
reachable:
  description: Whether the server answered C(/metrics).
  returned: always
  type: bool
metrics:
  description: Whether C(/metrics) had the scheduler gauges (false with C(--disable-log-stats)).
  returned: always
  type: bool
metrics_model_name:
  description: The C(model_name) label the gauges were read under (the server's first served name; null without O(served_model_name) or answer).
  returned: always
  type: str
stop:
  description:
    - The SIGTERM of the main process, with O(pid) or O(pidfile) (null otherwise, and in check mode).
    - C(signalled) (bool), C(pid), C(exited) (nothing left), C(stop_s) (seconds from SIGTERM to exit), C(left) (C(pid), C(comm)),
      C(killed) (with O(tree), the processes of the tree that got SIGKILL, C(pid) and C(comm)).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _drain_run


def main() -> None:
    module = AnsibleModule(
        argument_spec=_drain_run.argument_spec(), mutually_exclusive=[("pid", "pidfile")], supports_check_mode=True
    )
    _outcome.exit_with(module, _drain_run.run(module.params, module.check_mode))


if __name__ == "__main__":
    main()
