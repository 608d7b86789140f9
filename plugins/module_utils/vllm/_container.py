# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A vLLM instance's container on its host, through its runtime's command line (podman or docker): look at it, start
it, stop it. Every call is bounded (RUNTIME_TIMEOUT_S; a stop, its timeout more). Also the GPU names of the host's
CDI specs.

`podman|docker container inspect NAME` prints a JSON list (podman-container-inspect(1), docker's `inspect`):
"Id", "Image" (the image ID), "State": {"Status", "Running", "Pid", "ExitCode", "Health": {"Status"}} (podman 4.3
names it "Healthcheck" where docker says "Health"), "Config": {"Labels"}; podman adds "ImageName", docker has
"Config.Image".
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _stop_owners

RUNTIME_TIMEOUT_S = 120  # one look, a start, a removal; a stop gets its timeout more
# Where the NVIDIA container toolkit writes CDI specs: `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`, and
# the nvidia-cdi-refresh service (toolkit 1.18) /var/run/cdi/nvidia.yaml (CDI spec: the default spec directories).
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
_CDI_KIND_RE = re.compile(r"""^\s*["']?kind["']?\s*:\s*["']?([^"'\s,]+)""", re.M)
_CDI_NAME_RE = re.compile(r"""^\s*-?\s*["']?name["']?\s*:\s*["']?([^"'\s,]+)""", re.M)

# _stop_owners.run_bounded(argv, timeout_s, environment) -> (rc, stdout, stderr); rc None when it did not end in time.
Result = Tuple[Optional[int], str, str]


class ContainerError(Exception):
    """The runtime failed or did not answer; the message says which command and what it wrote."""


def _failure(argv: List[str], rc: Optional[int], out: str, err: str, timeout_s: float) -> str:
    """`<command> failed (rc N): <what the runtime wrote>`, or `<command> failed: no answer within T s`; the command
    is shown up to its sixth word."""
    command = " ".join(argv[:6]) + (" ..." if len(argv) > 6 else "")
    if rc is None:
        return "%s failed: no answer within %s s" % (command, timeout_s)
    return "%s failed (rc %s): %s" % (command, rc, (err.strip() or out.strip() or "no error text")[-500:])


def _checked(argv: List[str], timeout_s: float, environment: Optional[Mapping[str, str]] = None) -> str:
    rc, out, err = _stop_owners.run_bounded(argv, timeout_s, environment)
    if rc != 0:
        raise ContainerError(_failure(argv, rc, out, err, timeout_s))
    return out


def _state(found: Mapping[str, Any]) -> Dict[str, Any]:
    state = found.get("State") or {}
    health = state.get("Health") or state.get("Healthcheck") or {}
    config = found.get("Config") or {}
    return {
        "id": found.get("Id"),
        "image_id": str(found.get("Image") or "").split(":", 1)[-1] or None,
        "image": found.get("ImageName") or config.get("Image"),
        "status": state.get("Status"),
        "running": bool(state.get("Running")),
        "pid": int(state.get("Pid") or 0),
        "exit_code": state.get("ExitCode"),
        "health": health.get("Status") or None,
        "labels": config.get("Labels") or {},
    }


def inspect(runtime: str, name: str) -> Optional[Dict[str, Any]]:
    """The container `name`: {"id", "image_id" (hex, no "sha256:"), "image", "status", "running", "pid" (its PID 1 on
    the host, 0 when it does not run), "exit_code", "health", "labels"}, or None when there is none of that name."""
    argv = [runtime, "container", "inspect", name]
    rc, out, err = _stop_owners.run_bounded(argv, RUNTIME_TIMEOUT_S)
    if rc != 0:
        if rc is not None and re.search(r"no such (container|object)", err + out, re.I):
            return None
        raise ContainerError(_failure(argv, rc, out, err, RUNTIME_TIMEOUT_S))
    found = json.loads(out or "[]")
    return _state(found[0]) if found else None


def image_id(runtime: str, image: str) -> Optional[str]:
    """The ID (hex) of `image` on this host, or None when the host does not have it (nothing is pulled)."""
    argv = [runtime, "image", "inspect", "--format", "{{.Id}}", image]
    rc, out, err = _stop_owners.run_bounded(argv, RUNTIME_TIMEOUT_S)
    if rc != 0:
        if rc is not None and re.search(r"(no such|not known|unknown|failed to find)", err + out, re.I):
            return None
        raise ContainerError(_failure(argv, rc, out, err, RUNTIME_TIMEOUT_S))
    return out.strip().split(":", 1)[-1] or None


def _cdi_spec_names(path: str, text: str) -> List[str]:
    """The device names of one CDI spec: JSON read as JSON; YAML with two patterns, the spec's `kind` and each
    device's `name` (no YAML parser is sure to be on the host)."""
    if path.endswith(".json"):
        try:
            spec = json.loads(text)
        except ValueError:
            return []
        kind = spec.get("kind") if isinstance(spec, dict) else None
        devices = spec.get("devices") if isinstance(spec, dict) else None
        if not kind or not isinstance(devices, list):
            return []
        return ["%s=%s" % (kind, d["name"]) for d in devices if isinstance(d, dict) and d.get("name") is not None]
    kind = _CDI_KIND_RE.search(text)
    return ["%s=%s" % (kind.group(1), name) for name in _CDI_NAME_RE.findall(text)] if kind else []


def cdi_names(dirs: Tuple[str, ...] = CDI_DIRS) -> List[str]:
    """The fully qualified device names (`nvidia.com/gpu=0`) of the CDI specs in `dirs` (.yaml, .json)."""
    names = []
    for directory in dirs:
        for path in sorted(glob.glob(os.path.join(directory, "*.yaml")) + glob.glob(os.path.join(directory, "*.json"))):
            try:
                with open(path, "r") as handle:
                    names += _cdi_spec_names(path, handle.read())
            except (OSError, UnicodeDecodeError):
                continue
    return sorted(set(names))


def start(runtime: str, name: str, argv: List[str], environment: Mapping[str, str]) -> Dict[str, Any]:
    """Remove a container `name` that does not run (a stopped one keeps its name), then `RUNTIME run -d ...` with
    `environment` in the runtime's own environment (the run passes each variable by name). Returns inspect's."""
    found = inspect(runtime, name)
    if found is not None:
        if found["running"]:
            raise ContainerError(
                "container %s runs already (ID %s): stop it first" % (name, str(found["id"] or "unknown")[:12])
            )
        _checked([runtime, "rm", "-f", name], RUNTIME_TIMEOUT_S)
    _checked([runtime] + list(argv), RUNTIME_TIMEOUT_S, {k: str(v) for k, v in environment.items()})
    started = inspect(runtime, name)
    if started is None:
        raise ContainerError("%s run returned, but there is no container %s" % (runtime, name))
    return started


def stop(runtime: str, name: str, timeout_s: float) -> Optional[Dict[str, Any]]:
    """`RUNTIME stop -t N NAME` (the stop signal, SIGKILL after N seconds), then remove it. Returns what inspect said
    before the stop (None: there was no such container, nothing done)."""
    found = inspect(runtime, name)
    if found is None:
        return None
    seconds = int(-(-max(timeout_s, 0) // 1))
    try:
        if found["running"]:
            _checked([runtime, "stop", "-t", str(seconds), name], seconds + RUNTIME_TIMEOUT_S)
        _checked([runtime, "rm", "-f", name], RUNTIME_TIMEOUT_S)
    except ContainerError as exc:
        raise ContainerError(
            "%s; container %s (ID %s) may still run on its GPUs: look with `%s ps -a --filter name=%s`, stop it, "
            "then run again" % (exc, name, str(found["id"] or "unknown")[:12], runtime, name)
        ) from exc
    return found
