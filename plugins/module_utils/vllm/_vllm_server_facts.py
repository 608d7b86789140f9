# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM facts the vllm_server role relies on besides the speculative config, per release: the metrics its drain and
acceptance gate read, and the shutdown it expects after the drain's SIGTERM.

One table per fact, keyed by release like _speculative_vllm: the 0.33.0 tables (_BASE) and what another release
changes (_CHANGES; 0.32.0 and 0.34.0 change nothing here). ``make check-vllm-source`` compares each release's
tables with its wheel: vllm/v1/metrics/loggers.py and vllm/v1/spec_decode/metrics.py (metric names and kinds),
vllm/engine/arg_utils.py (--shutdown-timeout), vllm/envs.py (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS),
vllm/v1/executor/multiproc_executor.py (the workers' SIGKILL). The flags the role refuses
(plugin_utils/_vllm_checks.py OWNED) are the same flags in every supported release; the check confirms each one.

release_problems(version, environment, stop_timeout, gate) -> (problems, warnings) of one instance.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Mapping, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_versions import VERSIONS

# A metric's kind, as Prometheus types it.
MetricKind = Literal["gauge", "counter"]
# (problems, warnings): sentences that stop the deployment, and sentences it only reports.
Findings = Tuple[List[str], List[str]]

# Metrics the drain (vllm_drain: the scheduler gauges) and the acceptance gate (vllm_acceptance: the spec-decode
# counters; prometheus_client adds _total to a counter's samples) read, as _metrics_text names them.
DRAIN_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")
GATE_METRICS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
)


class ReleaseFacts(TypedDict):
    """The facts of one release (see _BASE for what each means)."""

    metrics: Dict[str, MetricKind]
    shutdown_timeout_default: int
    worker_shutdown_env: str
    worker_shutdown_default: int
    worker_sigkill_wait: int


class ReleaseChanges(TypedDict, total=False):
    """What a release changes of the 0.33.0 facts."""

    metrics: Dict[str, MetricKind]
    shutdown_timeout_default: int
    worker_shutdown_env: str
    worker_shutdown_default: int
    worker_sigkill_wait: int


_BASE: ReleaseFacts = {
    # {metric: kind} that the release exports, of those the role reads.
    "metrics": {**{name: "gauge" for name in DRAIN_METRICS}, **{name: "counter" for name in GATE_METRICS}},
    # EngineArgs.shutdown_timeout: --shutdown-timeout's default (0: running requests are aborted at SIGTERM).
    "shutdown_timeout_default": 0,
    # vllm/envs.py: when the instance's environment sets it, EngineCore's window after a zero --shutdown-timeout
    # (vllm/v1/engine/utils.py get_engine_process_shutdown_timeout), and what the workers get before their SIGTERM.
    "worker_shutdown_env": "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS",
    "worker_shutdown_default": 5,
    # multiproc_executor.py _ensure_worker_termination: seconds between the workers' SIGTERM and SIGKILL.
    "worker_sigkill_wait": 4,
}
_CHANGES: Dict[str, ReleaseChanges] = {}


def facts(version: str) -> ReleaseFacts:
    """{fact: value} of a release of VERSIONS. Raises KeyError for another version."""
    if version not in VERSIONS:
        raise KeyError("no vLLM facts for %s (known: %s)" % (version, ", ".join(VERSIONS)))
    return {**_BASE, **_CHANGES.get(version, {})}


def _metric_problems(found: ReleaseFacts, version: str, gate: bool) -> Findings:
    """(problems, warnings): metrics the role reads that vLLM `version` does not export as their kind."""
    exported = found["metrics"]
    problems: List[str] = []
    warnings: List[str] = []
    missing = [name for name in GATE_METRICS if exported.get(name) != "counter"]
    if gate and missing:
        problems.append(
            "vLLM %s exports no %s counter: the acceptance gate cannot measure this instance; set "
            "min_acceptance_rate to 0 to deploy it without the gate" % (version, ", ".join(missing))
        )
    missing = [name for name in DRAIN_METRICS if exported.get(name) != "gauge"]
    if missing:
        warnings.append(
            "vLLM %s exports no %s gauge: the drain cannot see this instance's requests and leaves them to "
            "--shutdown-timeout" % (version, ", ".join(missing))
        )
    return problems, warnings


def _worker_shutdown_problems(
    found: ReleaseFacts, version: str, environment: Mapping[str, Any] | None, stop_timeout: float | str | None
) -> list[str]:
    """The instance's VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS against vllm_server_stop_timeout."""
    name = found["worker_shutdown_env"]
    value = (environment or {}).get(name)
    if value in (None, ""):
        return []
    try:
        seconds = int(str(value).strip())
    except ValueError:
        return [
            "environment sets %s=%s: vLLM %s reads it with int() and fails at start: give whole seconds"
            % (name, value, version)
        ]
    window = seconds + found["worker_sigkill_wait"]
    if stop_timeout is not None and window >= float(stop_timeout):
        return [
            "environment sets %s=%d: vLLM %s then takes up to %d s to stop (EngineCore's window of %d s after the "
            "drain's SIGTERM; when the whole session is stopped, %d s for the workers, then their SIGTERM and their "
            "SIGKILL %d s later), which vllm_server_stop_timeout %s cuts short: raise vllm_server_stop_timeout above "
            "%d, or lower %s"
            % (
                name,
                seconds,
                version,
                window,
                seconds,
                seconds,
                found["worker_sigkill_wait"],
                stop_timeout,
                window,
                name,
            )
        ]
    return []


def release_problems(
    version: str, environment: Mapping[str, Any] | None, stop_timeout: float | str | None, gate: bool
) -> Findings:
    """(problems, warnings) of an instance that runs vLLM `version` (a release of VERSIONS) with `environment`,
    stopped within `stop_timeout` seconds, with or without the acceptance gate."""
    found = facts(version)
    problems, warnings = _metric_problems(found, version, gate)
    return problems + _worker_shutdown_problems(found, version, environment, stop_timeout), warnings
