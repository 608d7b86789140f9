# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a host has for the vllm_server role, read in one pass: its checks then run on the controller.

read_host(request, inspector, systemctl) -> dict; the keys are documented in plugins/modules/vllm_server_host.py.
Every look here only reads: files, /proc, NVML (through `inspector`) and HTTP GETs to the servers.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import (
    _container,
    _detached,
    _http,
    _readiness,
    _speculative_parse,
    _vllm_files,
    _vllm_servers,
    _vllm_versions,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_address import local_url

if TYPE_CHECKING:
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._gpus import Inspector
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._shapes import Snapshot
    from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._readiness import ProcessArg
    from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_files import FileState
    from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_servers import Server
    from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_versions import VersionRead

# The module's parameters (vllm_server_host), as AnsibleModule gives them.
Request = Mapping[str, Any]
# systemctl(unit) -> {LoadState, ActiveState, MainPID} of a unit ({} when systemctl cannot tell).
Systemctl = Callable[[str], Mapping[str, str]]

SYSTEMD_BOOTED = "/run/systemd/system"  # sd_booted(3): systemd runs when this directory exists


class Running(TypedDict):
    """One look at the server of a deployed instance (probe_running)."""

    ready: bool
    process_exited: bool
    last_error: Optional[str]
    pid: int


class PathState(TypedDict):
    """What a path is (_stat)."""

    exists: bool
    isdir: bool
    executable: bool


class HostRead(TypedDict):
    """What read_host returns; plugins/modules/vllm_server_host.py's RETURN says what each key means."""

    systemd: bool
    nvidia: Snapshot
    deployed: Dict[str, Dict[str, Any]]
    running: Dict[str, Running]
    ports: Dict[str, Optional[str]]
    servers: List[Dict[str, Any]]
    files: Dict[str, Dict[str, Optional[FileState]]]
    paths: Dict[str, PathState]
    vllm_versions: Dict[str, VersionRead]
    drafters: List[Dict[str, Any]]
    missing_dirs: List[str]
    containers: Dict[str, Optional[Dict[str, Any]]]
    images: Dict[str, Optional[str]]
    cdi: List[str]


def read_deployed(config_dir: str) -> dict[str, dict[str, Any]]:
    """{name: configuration} of the <name>.json files the role wrote in `config_dir`; unreadable ones are left out."""
    deployed: Dict[str, Dict[str, Any]] = {}
    try:
        names = sorted(name for name in os.listdir(config_dir) if name.endswith(".json"))
    except OSError:
        return deployed
    for name in names:
        try:
            with open(os.path.join(config_dir, name), "rb") as handle:
                config = json.loads(handle.read().decode("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and config.get("name"):
            deployed[config["name"]] = config
    return deployed


def _api_key(path: str) -> str | None:
    """The key of a <name>.env file the role wrote (VLLM_API_KEY=...), or None."""
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VLLM_API_KEY="):
            return line.split("=", 1)[1].strip() or None
    return None


def _server_process(
    name: str, config: Mapping[str, Any], request: Request, systemctl: Systemctl, container: Optional[Mapping[str, Any]]
) -> ProcessArg:
    """The running server's process as wait_ready takes it: a (PID, start_ticks) pair from the pidfile of a detached
    server, the MainPID of an active systemd unit, or the PID 1 of a running container (`container`: its inspect);
    (0, 0) when none runs."""
    if config.get("container"):
        return ((container or {}).get("pid") or 0) if (container or {}).get("running") else (0, 0)
    if config.get("service_manager") == "systemd":
        status = systemctl("%s%s.service" % (request["unit_prefix"], name))
        return (int(status.get("MainPID") or 0) if status.get("ActiveState") == "active" else 0) or (0, 0)
    try:
        return _detached.read_pidfile(os.path.join(request["state_dir"], "%s.pid" % name)) or (0, 0)
    except _detached.DetachedError:
        return (0, 0)


def probe_running(
    name: str,
    config: Mapping[str, Any],
    request: Request,
    systemctl: Systemctl,
    container: Optional[Mapping[str, Any]] = None,
) -> Running:
    """One look at the server of a deployed instance where its deployed configuration put it."""
    process = _server_process(name, config, request, systemctl, container)
    client = _http.Client(
        local_url(config.get("host"), config.get("port")),
        _api_key(os.path.join(request["config_dir"], "%s.env" % name)),
        request["request_timeout"],
    )
    result = _readiness.wait_ready(
        client, config.get("served_model_name") or name, 0, process=process, completion_max_tokens=0
    )
    pid = process[0] if isinstance(process, tuple) else process
    return {
        "ready": result["ready"],
        "process_exited": result["process_exited"],
        "last_error": result["last_error"],
        "pid": pid or 0,
    }


def probe_port(entry: Mapping[str, Any], request: Request) -> str | None:
    """What answers on the port an instance takes anew: None when the connection is refused (free), else what was
    seen (a server that is not this instance)."""
    client = _http.Client(local_url(entry.get("host"), entry["port"]), None, request["request_timeout"])
    result = _readiness.wait_ready(client, entry.get("served_model_name") or entry["name"], 0, completion_max_tokens=0)
    error = str(result["last_error"] or "")
    return None if "Connection refused" in error else (error or "it answers /health")


def _stat(path: str) -> PathState:
    """Whether `path` exists, is a directory, is an executable file."""
    return {
        "exists": os.path.exists(path),
        "isdir": os.path.isdir(path),
        "executable": os.path.isfile(path) and os.access(path, os.X_OK),
    }


def read_drafter(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The drafter config.json that the speculative-config check reads for `entry` ({model, drafter_config})."""
    found = dict(entry, path=None, config=None, error=None)
    try:
        found["path"], found["config"] = _speculative_parse.read_drafter(
            entry.get("model"), entry.get("drafter_config")
        )
    except _speculative_parse.SpeculativeConfigError as exc:
        found["error"] = str(exc)
    return found


def file_states(name: str, request: Request) -> dict[str, FileState | None]:
    """The state (_vllm_files.state) of each file of instance `name`, by what it is."""
    return {
        "configuration": _vllm_files.state(os.path.join(request["config_dir"], "%s.json" % name)),
        "API key": _vllm_files.state(os.path.join(request["config_dir"], "%s.env" % name)),
        "systemd unit": _vllm_files.state(
            os.path.join(request["systemd_dir"], "%s%s.service" % (request["unit_prefix"], name))
        ),
    }


def _records(
    deployed: Mapping[str, Mapping[str, Any]],
    request: Request,
    containers: Optional[Mapping[str, Optional[Mapping[str, Any]]]] = None,
) -> Dict[str, Dict[str, Any]]:
    """What the role keeps of each deployed instance's server: the (PID, start ticks) of its pidfile while that
    process runs, its unit's name, and its container's ID."""
    records: Dict[str, Dict[str, Any]] = {}
    for name in deployed:
        try:
            pidfile = _detached.read_pidfile(os.path.join(request["state_dir"], "%s.pid" % name))
        except _detached.DetachedError:
            pidfile = None
        records[name] = {
            "pidfile": list(pidfile) if pidfile is not None and pidfile.alive() else None,
            "unit": "%s%s.service" % (request["unit_prefix"], name),
            "container": ((containers or {}).get(name) or {}).get("id"),
        }
    return records


def read_servers(
    deployed: Mapping[str, Mapping[str, Any]],
    request: Request,
    snapshot: Snapshot,
    containers: Optional[Mapping[str, Optional[Mapping[str, Any]]]] = None,
) -> List[Dict[str, Any]]:
    """The vLLM API servers of the host (_vllm_servers.find_servers), each with "recorded_by": the deployed instance
    whose record it is, or None for a server this role did not start."""
    records = _records(deployed, request, containers)
    servers: List[Server] = _vllm_servers.find_servers(snapshot)
    return [dict(server, recorded_by=_vllm_servers.recorded(server, records)) for server in servers]


def read_host(request: Request, inspector: Inspector, systemctl: Systemctl) -> HostRead:
    """Everything the role's validate and compare phases need from the host, in one pass (see the module's RETURN).

    `request`: the module's parameters. `inspector`: a _gpus.Inspector. `systemctl(unit)`: {LoadState, ActiveState,
    MainPID} of a unit."""
    deployed = read_deployed(request["config_dir"])
    ports: Dict[str, Optional[str]] = {}
    for entry in request["instances"]:
        if str((deployed.get(entry["name"]) or {}).get("port")) != str(entry["port"]):
            ports[entry["name"]] = probe_port(entry, request)
    snapshot = inspector.snapshot(tolerance_mib=request["max_used_mib"])
    containers = read_containers(deployed)
    return {
        "systemd": os.path.isdir(SYSTEMD_BOOTED),
        "nvidia": snapshot,
        "deployed": deployed,
        "running": {
            entry["name"]: probe_running(
                entry["name"], deployed[entry["name"]], request, systemctl, containers.get(entry["name"])
            )
            for entry in request["instances"]
            if entry["name"] in deployed
        },
        "ports": ports,
        "servers": read_servers(deployed, request, snapshot, containers),
        "files": {entry["name"]: file_states(entry["name"], request) for entry in request["instances"]},
        "paths": {path: _stat(path) for path in request["paths"]},
        "vllm_versions": {path: _vllm_versions.read_version(path) for path in request.get("executables") or []},
        "drafters": [read_drafter(entry) for entry in request["drafters"]],
        "missing_dirs": [
            path
            for path in (request["config_dir"], request["state_dir"], request["log_dir"])
            if not os.path.isdir(path)
        ],
        "containers": containers,
        "images": read_images(request.get("images") or []),
        "cdi": _container.cdi_names() if request.get("images") else [],
    }


def read_containers(deployed: Mapping[str, Mapping[str, Any]]) -> Dict[str, Optional[Dict[str, Any]]]:
    """The container of each deployed instance that a runtime runs (its configuration's "container": runtime and
    name), as _container.inspect gives it: None where there is none of that name; {"error"} where the runtime failed."""
    found: Dict[str, Optional[Dict[str, Any]]] = {}
    for name, config in deployed.items():
        container = config.get("container")
        if not isinstance(container, dict):
            continue
        try:
            found[name] = _container.inspect(str(container.get("runtime")), str(container.get("name")))
        except (_container.ContainerError, ValueError) as exc:
            found[name] = {"error": str(exc), "running": False, "pid": 0, "id": None}
    return found


def read_images(images: List[Mapping[str, Any]]) -> Dict[str, Optional[str]]:
    """{"RUNTIME IMAGE": its ID on this host, or None when the host does not have it} of each ({runtime, image})."""
    found: Dict[str, Optional[str]] = {}
    for entry in images:
        key = "%s %s" % (entry.get("runtime"), entry.get("image"))
        try:
            found[key] = _container.image_id(str(entry.get("runtime")), str(entry.get("image")))
        except _container.ContainerError:
            found[key] = None
    return found
