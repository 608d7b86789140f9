# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The vllm_server role's plan, on the controller: what it asks the host, and what it deploys.

host_request(instances, settings) -> the parameters of gpuops.nvidia.vllm_server_host
plan(instances, host, settings) -> {"problems", "warnings", "manager", "instances": {name: entry}}

`host` is the vllm_server_host result with "name" (the inventory host) added. `settings` are the role variables
without their vllm_server_ prefix (roles/vllm_server/tasks/validate.yml passes them). An entry holds the
configuration written to <name>.json ("cfg", with "argv"), its systemd unit ("unit", or None), the URL the new server
answers at ("url"), what is deployed now ("old", or None, and "old_url", "old_unit"), the acceptance gate ("gate",
"min_rate"), which files differ ("changed") and the reasons to restart ("reasons": those files, and what the look at
the running server found, "probe"; "running", "pid").
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, cast

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative import (
    SpeculativeResult,
    validate_speculative_config,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_parse import SpeculativeConfigError
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_vllm import batch_class, releases_with
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_files, _vllm_server_facts, _vllm_versions
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_address import local_host, local_url
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_container, _vllm_unmanaged
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._vllm_checks import (
    CONTROL,
    GpuRef,
    Gpus,
    Instance,
    Settings,
    number_settings_problems,
    port_problems,
    vllm_server_check,
)

# The vllm_server_host result with "name", the inventory host, added.
Host = Mapping[str, Any]
UNIT_HEADER = "# Ansible managed: written by the gpuops.nvidia.vllm_server role"


def _given(instance: Instance, key: str, default: Any) -> Any:
    """The instance's value for key, or `default` where it is missing or empty (Jinja's default(x, true))."""
    value = instance.get(key)
    return value if value not in (None, "", [], {}) and value is not False else default


def _executable(instance: Instance, settings: Settings) -> Any:
    return _given(instance, "vllm_executable", settings["vllm_executable"])


def _manager(instance: Instance, settings: Settings) -> str:
    """The instance's service manager (its own, else the role's; auto as the plan resolved it)."""
    return _vllm_container.manager_of(instance, str(settings.get("resolved_manager") or settings["service_manager"]))


def _contained(instance: Instance, settings: Settings) -> bool:
    return _manager(instance, settings) in _vllm_container.RUNTIMES


def _on_host(instance: Instance, settings: Settings, path: object) -> Optional[str]:
    """Where a path the instance names (its model, its drafter) lies on the host (a container's: through its volumes)."""
    return _vllm_container.host_path(instance, path, _manager(instance, settings))


def _spec_model(instance: Instance) -> Any:
    """The model of the instance's speculative config (None without one)."""
    spec = instance.get("speculative_config")
    return spec.get("model") if isinstance(spec, dict) else None


def _drafter(instance: Instance) -> Optional[str]:
    """The checkpoint the instance's speculative config drafts with, as the instance names it: its model, or for MTP
    without one the target model (vLLM's SpeculativeConfig.__post_init__ then drafts with the target's own MTP
    layers). None where there is none to read: ngram, no speculative config, a model that is no path."""
    spec = instance.get("speculative_config")
    if not isinstance(spec, dict) or spec.get("method") == "ngram":
        return None
    model = spec.get("model")
    if model is None and (spec.get("method") == "mtp" or releases_with("mtp_methods", spec.get("method"))):
        target = instance.get("model")
        # The target's checkpoint on the host: a Hugging Face id is not a path to read (drafter_config gives one).
        model = target if isinstance(target, str) and target.startswith("/") else None
    return model if isinstance(model, str) and model else None


def _drafter_config(instance: Instance, settings: Settings) -> Any:
    """The drafter config the host reads: the instance's drafter_config, else the drafter's config.json where the
    module would not find it from the model alone: through the volume that holds it (a container's), the target's
    (MTP without a model). None for a drafter in no volume (_drafter_outside refuses it)."""
    given = instance.get("drafter_config")
    drafter = _drafter(instance)
    if given or drafter is None or (drafter == _spec_model(instance) and not _contained(instance, settings)):
        return given
    found = _on_host(instance, settings, drafter)
    return found.rstrip("/") + "/config.json" if found else None


def _drafter_outside(instance: Instance, settings: Settings) -> Optional[List[str]]:
    """Problems of a container's drafter in none of its volumes (vLLM in the container cannot load it; it is not read
    at the host path of that name); None where no volume is missing."""
    drafter = _drafter(instance)
    if drafter is None or _on_host(instance, settings, drafter) is not None:
        return None
    if drafter == _spec_model(instance):
        return ["speculative_config model %s is in no volume of the container" % drafter]
    return []  # MTP from the target model: _path_problems says that the model is in no volume


def _min_rate(instance: Instance, settings: Settings) -> float:
    rate = instance.get("min_acceptance_rate")
    return float(settings["min_acceptance_rate"] if rate is None else rate)


def _gate(instance: Instance, settings: Settings) -> bool:
    return bool(instance.get("speculative_config")) and _min_rate(instance, settings) > 0


def host_request(instances: Optional[Sequence[Any]], settings: Settings) -> Dict[str, Any]:
    """What vllm_server_host reads: the instances' addresses, the model directories and executables to look for, and
    the drafters of the speculative configs."""
    instances = [instance for instance in instances or [] if isinstance(instance, dict)]
    paths = [
        _on_host(instance, settings, instance["model"])
        for instance in instances
        if str(instance.get("model") or "").startswith("/")
    ]
    executables = [str(_executable(instance, settings)) for instance in instances if not _contained(instance, settings)]
    paths += executables
    paths += [volume["src"] for i in instances if _contained(i, settings) for volume in _vllm_container.volumes_of(i)]
    drafters = [
        {"model": _spec_model(instance), "drafter_config": _drafter_config(instance, settings)}
        for instance in instances
        if _drafter(instance) is not None and _drafter_outside(instance, settings) is None
    ]
    images = [
        {"runtime": _manager(instance, settings), "image": str(instance.get("image"))}
        for instance in instances
        if _contained(instance, settings) and instance.get("image")
    ]
    request = {
        # An instance whose port is refused (plan) is not asked about: nothing is probed at port -1.
        "instances": [
            {
                "name": str(instance.get("name")),
                "host": str(_given(instance, "host", "0.0.0.0")),
                "port": str(instance.get("port")),
                "served_model_name": str(_given(instance, "served_model_name", instance.get("name"))),
            }
            for instance in instances
            if not port_problems(instance)
        ],
        "paths": sorted(set(str(path) for path in paths if path)),
        "images": images,
        # whose vLLM release to read (_vllm_versions.read_version)
        "executables": sorted(set(path for path in executables if path.startswith("/"))),
        "drafters": drafters,
        "config_dir": settings["config_dir"],
        "state_dir": settings["state_dir"],
        "log_dir": settings["log_dir"],
        "unit_prefix": settings["unit_prefix"],
        "systemd_dir": settings["systemd_dir"],
    }
    # A refused vllm_server_gpu_max_used_mib (the plan says why) is not passed on: the host is read with the module's
    # default.
    used = (settings.get("numbers") or {}).get("gpu_max_used_mib")
    if used is not None and not number_settings_problems({"gpu_max_used_mib": used}):
        request["max_used_mib"] = used
    return request


def _reader(drafters: Optional[Sequence[Mapping[str, Any]]]) -> Callable[[Any, Any], Tuple[Any, Any]]:
    """A drafter reader for validate_speculative_config over what vllm_server_host read on the host."""

    def read(model: Any, drafter_config: Any) -> Tuple[Any, Any]:
        for found in drafters or []:
            if found.get("model") == model and found.get("drafter_config") == drafter_config:
                if found.get("error"):
                    raise SpeculativeConfigError(found["error"])
                return found["path"], found["config"]
        raise SpeculativeConfigError("the drafter config of %s was not read on the host" % model)

    return read


def _release(instance: Instance, settings: Settings, host: Host) -> Tuple[Optional[str], List[str], List[str]]:
    """(release of _vllm_versions.VERSIONS whose facts apply or None, problems, warnings) of the instance's vLLM,
    from the version vllm_server_host read for its executable."""
    executable = str(_executable(instance, settings))
    read = (host.get("vllm_versions") or {}).get(executable) or {}
    if _contained(instance, settings):
        # The image's vLLM is not run to ask it: the instance says which release its image runs.
        executable = "image %s" % instance.get("image")
        read = {"version": instance.get("vllm_version"), "source": "the instance's vllm_version"}
        if not read["version"]:
            return (
                None,
                [
                    "vllm_version is required with service_manager %s: the release the image runs "
                    "(`vllm --version` in the image prints it)" % _manager(instance, settings)
                ],
                [],
            )
    if not read.get("version"):
        if not (host.get("paths") or {}).get(executable, {}).get("executable"):
            return None, [], []  # _path_problems says that the executable is missing
        return None, ["cannot tell which vLLM %s runs: %s" % (executable, read.get("error") or "it was not read")], []
    found = _vllm_versions.resolve(read["version"])
    if found["problem"]:
        return None, ["%s (%s, read from %s)" % (found["problem"], executable, read.get("source"))], []
    problems, warnings = _vllm_server_facts.release_problems(
        cast(str, found["facts"]), instance.get("environment"), settings.get("stop_timeout"), _gate(instance, settings)
    )
    return found["facts"], problems, warnings + ([found["warning"]] if found["warning"] else [])


def _gpu_class(refs: Optional[Sequence[GpuRef]], nvidia: Mapping[str, Any]) -> Optional[str]:
    """The GPU class whose batch defaults vLLM takes for an instance on the GPUs `refs` (vllm_server_check's): that of
    the first, CUDA device 0 of the server (_speculative_vllm.batch_class); None for a MIG instance or a GPU NVML did
    not describe."""
    first = refs[0] if refs else None
    for gpu in nvidia.get("gpus") or [] if isinstance(first, int) else []:
        if gpu.get("index") == first:
            return batch_class(gpu.get("name"), gpu.get("memory_total_mib"))
    return None


def _speculative(
    instance: Instance, settings: Settings, drafters: Any, release: Optional[str], gpu_class: Optional[str] = None
) -> Tuple[Optional[SpeculativeResult], List[str]]:
    """(validation result or None, problems) of the instance's speculative config, as vLLM `release` reads it on a
    GPU of `gpu_class` (_gpu_class)."""
    spec = instance.get("speculative_config")
    outside = _drafter_outside(instance, settings)
    if outside is not None:
        return None, outside
    if not spec or release is None:
        return None, []
    environment = instance.get("environment") or {}
    try:
        result = validate_speculative_config(
            spec,
            drafter_config=_drafter_config(instance, settings) or None,
            target_num_layers=instance.get("target_num_layers") or None,
            extra_args=instance.get("extra_args") or [],
            environment=environment,
            acceptance_gate=_gate(instance, settings),
            reader=_reader(drafters),
            vllm_version=release,
            gpu_class=gpu_class,
        )
    except SpeculativeConfigError as exc:
        return None, [str(exc)]
    problems = [
        "environment sets %s=%s, but the speculative config needs %s=%s (vllm_speculative_config): remove it "
        "from environment" % (key, environment[key], key, value)
        for key, value in sorted(result["environment"].items())
        if key in environment and str(environment[key]) != str(value)
    ]
    return result, problems


def _path_problems(instance: Instance, settings: Settings, host: Host, names: Sequence[Any] = ()) -> List[str]:
    paths = host.get("paths") or {}
    problems = []
    model = str(instance.get("model") or "")
    contained = _contained(instance, settings)
    problems += _vllm_container.container_problems(instance, _manager(instance, settings), settings)
    if contained:
        problems += _container_problems(instance, settings, host)
    on_host = _on_host(instance, settings, model) if model.startswith("/") else None
    if model.startswith("/") and on_host is None:
        problems.append("model %s is in no volume of the container" % model)
    elif on_host and not (paths.get(on_host) or {}).get("exists"):
        problems.append(
            "model %s does not exist on %s%s" % (model, host.get("name"), " (%s)" % on_host if on_host != model else "")
        )
    executable = str(_executable(instance, settings))
    found = paths.get(executable) or {}
    if executable.startswith("/") and not contained and not found.get("executable"):
        problems.append(
            "%s %s on %s"
            % (executable, "is not executable" if found.get("exists") else "does not exist", host.get("name"))
        )
    answer = (host.get("ports") or {}).get(str(instance.get("name")))
    if answer and not _vllm_unmanaged.port_taken_by(instance, host):  # _vllm_unmanaged.findings names that server
        problems.append(_port_problem(instance, settings, host, answer, names))
    return problems


def _container_problems(instance: Instance, settings: Settings, host: Host) -> List[str]:
    """A container instance's image on the host (nothing is pulled), and its volumes' sources."""
    manager = _manager(instance, settings)
    problems = []
    image = instance.get("image")
    if image and (host.get("images") or {}).get("%s %s" % (manager, image)) is None:
        problems.append(
            "image %s is not on %s (%s image inspect): the role pulls nothing; pull or load it first"
            % (image, host.get("name"), manager)
        )
    for volume in _vllm_container.volumes_of(instance):
        if volume["src"].startswith("/") and not ((host.get("paths") or {}).get(volume["src"]) or {}).get("exists"):
            problems.append("volume source %s does not exist on %s" % (volume["src"], host.get("name")))
    return problems


def _port_problem(instance: Instance, settings: Settings, host: Host, answer: Any, names: Sequence[Any]) -> str:
    """Why the port an instance takes anew is refused: `answer` came from it. Where an instance this role deployed
    under another name listens there (a rename), it is named: the look sent no API key, so its answer says little."""
    port = str(instance.get("port"))
    owners = [
        (name, config)
        for name, config in sorted((host.get("deployed") or {}).items())
        if name != instance.get("name") and str(config.get("port")) == port
    ]
    if not owners:
        return (
            "port %s is already used on %s by a server that is not this instance (%s): stop it or choose "
            "another port" % (port, host.get("name"), answer)
        )
    name, config = owners[0]
    used = "port %s is used by instance %s, deployed by this role (%s/%s.json)" % (
        port,
        name,
        settings["config_dir"],
        name,
    )
    if name in names:
        return used + ", which moves in this run: deploy in two steps (move %s first)" % name
    if config.get("service_manager") == "systemd":
        where = "its unit %s%s.service" % (settings["unit_prefix"], name)
    else:
        where = "the session of the PID in %s/%s.pid" % (settings["state_dir"], name)
    return (
        used + " and not in vllm_server_instances (renamed?): stop it first (%s) and remove its files, or choose "
        "another port" % where
    )


def config_of(
    instance: Instance, gpus: List[GpuRef], spec: Optional[SpeculativeResult], manager: str, settings: Settings
) -> Dict[str, Any]:
    """The configuration of an instance as deployed (<name>.json), with its command line."""
    dp = int(_given(instance, "data_parallel_size", 1))
    cfg = {
        "name": instance["name"],
        "model": instance["model"],
        "served_model_name": _given(instance, "served_model_name", instance["name"]),
        "host": _given(instance, "host", "0.0.0.0"),
        "port": int(instance["port"]),
        "gpus": gpus,
        "data_parallel_size": dp,
        "tensor_parallel_size": int(_given(instance, "tensor_parallel_size", len(instance["gpus"]) // dp)),
        "gpu_memory_utilization": float(_given(instance, "gpu_memory_utilization", 0.9)),
        "max_model_len": instance.get("max_model_len"),
        "speculative_config": spec["speculative_config"] if spec else None,
        "extra_args": _given(instance, "extra_args", []),
        "environment": {"CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        "api_key_file": ("%s/%s.env" % (settings["config_dir"], instance["name"])) if instance.get("api_key") else None,
        "vllm_executable": _executable(instance, settings),
        "service_manager": manager,
        "user": settings["user"],
        "log_file": "%s/%s.log" % (settings["log_dir"], instance["name"]),
    }
    cfg["environment"].update(spec["environment"] if spec else {})
    cfg["environment"].update(instance.get("environment") or {})
    if manager in _vllm_container.RUNTIMES:
        cfg["vllm_executable"] = "vllm"  # the image's entrypoint: vllm serve
        cfg["vllm_version"] = instance.get("vllm_version")
    argv = [
        cfg["vllm_executable"],
        "serve",
        cfg["model"],
        "--host",
        cfg["host"],
        "--port",
        str(cfg["port"]),
        "--served-model-name",
        cfg["served_model_name"],
        "--tensor-parallel-size",
        str(cfg["tensor_parallel_size"]),
        "--gpu-memory-utilization",
        str(cfg["gpu_memory_utilization"]),
    ]
    if dp > 1:
        argv += ["--data-parallel-size", str(dp)]
    if cfg["max_model_len"]:
        argv += ["--max-model-len", str(cfg["max_model_len"])]
    if spec:
        argv += ["--speculative-config", spec["speculative_config_json"]]
    if instance.get("shutdown_timeout") is not None:
        argv += ["--shutdown-timeout", str(int(instance["shutdown_timeout"]))]
    cfg["argv"] = argv + list(cfg["extra_args"])
    return cfg


def container_of(cfg: Dict[str, Any], instance: Instance, settings: Settings, host: Host) -> Dict[str, Any]:
    """The configuration of a container instance (cfg with its "container" block: runtime, name, image, volumes,
    shm_size, GPU options, options, the configuration's digest and the command that runs it)."""
    runtime = cfg["service_manager"]
    options = list(settings.get("container_options") or []) + list(instance.get("container_options") or [])
    # A container sees only the GPUs it is given, numbered from 0 (NVML and CUDA enumerate the device files they can
    # open), by CDI name or by device file alike: CUDA_VISIBLE_DEVICES counts them from 0 (a MIG UUID stays).
    gpu_args = _vllm_container.gpu_args(cfg["gpus"], host.get("nvidia") or {}, list(host.get("cdi") or []))
    if all(isinstance(gpu, int) for gpu in cfg["gpus"]):
        cfg["environment"]["CUDA_VISIBLE_DEVICES"] = ",".join(str(n) for n in range(len(cfg["gpus"])))
    cfg["container"] = {
        "runtime": runtime,
        "name": _new_container_name(cfg["name"], settings),
        "image": instance["image"],
        "volumes": _vllm_container.volumes_of(instance),
        "shm_size": instance.get("shm_size") or None,
        "gpu_args": gpu_args,
        "options": options,
    }
    cfg["container"]["digest"] = _vllm_container.config_digest(cfg)
    cfg["container"]["run_argv"] = _vllm_container.run_argv(cfg, settings, cfg["container"])
    return cfg


def _quote(word: object, exec_line: bool = False) -> str:
    """systemd quoting: a double-quoted word with \\ and " escaped, % doubled (specifiers), and in ExecStart= $ doubled
    (variables). systemd.service(5) "Command lines", systemd.unit(5) "Specifiers"."""
    word = str(word).replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return '"%s"' % (word.replace("$", "$$") if exec_line else word)


def unit_text(cfg: Mapping[str, Any], settings: Settings) -> str:
    """The systemd unit of a configuration. Stopping ends the whole process tree (KillMode=control-group): SIGTERM to
    every process of the unit (API server, EngineCore, TP workers) at once, SIGKILL to those left after
    TimeoutStopSec; KillMode=process would leave EngineCore and the workers holding the GPUs."""
    lines = [
        UNIT_HEADER,
        "# vLLM instance %s, written by the gpuops.nvidia.vllm_server role from %s/%s.json."
        % (cfg["name"], settings["config_dir"], cfg["name"]),
        "[Unit]",
        "Description=vLLM %s: %s on GPUs %s, port %s"
        % (
            cfg["name"],
            str(cfg["served_model_name"]).replace("%", "%%"),
            ",".join(str(gpu) for gpu in cfg["gpus"]),
            cfg["port"],
        ),
        "Documentation=https://docs.vllm.ai/",
        "After=network-online.target",
        "Wants=network-online.target",
        "StartLimitIntervalSec=600",
        "StartLimitBurst=3",
        "",
        "[Service]",
        "Type=exec",
        "User=%s" % cfg["user"],
        "WorkingDirectory=%s" % settings["state_dir"],
    ]
    lines += ["Environment=%s" % _quote("%s=%s" % (name, value)) for name, value in sorted(cfg["environment"].items())]
    if cfg["api_key_file"]:
        lines.append("EnvironmentFile=%s" % cfg["api_key_file"])
    lines += [
        "ExecStart=%s" % " ".join(_quote(word, exec_line=True) for word in cfg["argv"]),
        "",
        "KillMode=control-group",
        "KillSignal=SIGTERM",
        "SendSIGKILL=yes",
        "TimeoutStopSec=%s" % settings["stop_timeout"],
        "Restart=on-failure",
        "RestartSec=30",
        "StandardOutput=append:%s" % cfg["log_file"],
        "StandardError=inherit",
        "LimitNOFILE=65536",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectSystem=full",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    # The checks refuse control characters before anything stops; a line that still has one is not written.
    for line in lines:
        if CONTROL.search(line):
            raise ValueError("%s: a line of its systemd unit has a control character" % cfg["name"])
    return "\n".join(lines) + "\n"


def _probe_reasons(running: Optional[Mapping[str, Any]]) -> List[str]:
    """Reasons to restart from the look at the running server (None: not deployed, so not running)."""
    if not running or running.get("process_exited"):
        return ["not running"]
    if not running.get("ready"):
        return ["not healthy (%s)" % running.get("last_error")]
    return []


def _address(config: Mapping[str, Any]) -> List[Any]:
    """(host, port) where a check on the host reaches a server of `config`: loopback for the wildcard addresses."""
    return [local_host(config.get("host")), config.get("port")]


def changed_files(instance: Instance, cfg: Dict[str, Any], unit: Optional[str], host: Host) -> List[str]:
    """Which of the instance's files differ from what the host has (compared as vllm_server_files compares)."""
    found = (host.get("files") or {}).get(instance["name"]) or {}
    wanted = [
        ("configuration", _vllm_files.config_text(cfg), _vllm_files.CONFIG_MODE),
        ("API key", _vllm_files.key_text(instance.get("api_key")), _vllm_files.KEY_MODE),
    ]
    if unit is not None:
        wanted.append(("systemd unit", unit, _vllm_files.FILE_MODE))
    return [what for what, content, mode in wanted if _vllm_files.differs(found.get(what), content, mode)]


def _entry(
    instance: Instance,
    cfg: Dict[str, Any],
    host: Host,
    settings: Settings,
    spec: Optional[SpeculativeResult],
    replaces: List[Dict[str, Any]],
) -> Dict[str, Any]:
    name = instance["name"]
    old = (host.get("deployed") or {}).get(name)
    current = old or cfg
    systemd = cfg["service_manager"] == "systemd"
    running = (host.get("running") or {}).get(name)
    unit = unit_text(cfg, settings) if systemd else None
    changed = changed_files(instance, cfg, unit, host)
    return {
        "name": name,
        "cfg": cfg,
        "unit": unit,
        "changed": changed,
        "reasons": ["%s changed" % what for what in changed]
        + (_probe_reasons(running) if old or not replaces else [])  # not deployed: the server replaced is what runs
        + (_container_reasons(cfg, host, running) if cfg.get("container") else [])
        + [
            "vLLM server PID %s not started by this role%s"
            % (server["pid"], " (still starting)" if server.get("starting") else "")
            for server in replaces
        ],
        "url": local_url(cfg["host"], cfg["port"]),
        "old": old,
        "old_url": local_url(current.get("host"), current.get("port")),
        "old_served_model_name": current.get("served_model_name") or name,
        "old_manager": current.get("service_manager") or cfg["service_manager"],
        "old_unit": unit_text(old, settings) if old and old.get("service_manager") == "systemd" else None,
        "old_container": _container_name(current, settings),
        "gate": bool(spec) and _gate(instance, settings),
        "min_rate": _min_rate(instance, settings),
        "address": _address(cfg),
        "old_address": _address(current),
        "probe": _probe_reasons(running),
        "running": running is not None and bool(running) and not running.get("process_exited"),
        "pid": (running or {}).get("pid", 0),
        # vLLM servers this role did not start that the instance replaces (_vllm_unmanaged.replaced)
        "replaces": replaces,
    }


def _new_container_name(name: str, settings: Settings) -> str:
    """The name a container instance's container gets: `<unit prefix><name>`."""
    return "%s%s" % (settings["unit_prefix"], name)


def _container_name(cfg: Mapping[str, Any], settings: Settings) -> str:
    """The name of the container that runs `cfg`: the one its deployment recorded (a later vllm_server_unit_prefix
    does not rename it), else the one it would get."""
    recorded = (cfg.get("container") or {}).get("name")
    return str(recorded) if recorded else _new_container_name(str(cfg.get("name")), settings)


def _container_reasons(cfg: Mapping[str, Any], host: Host, running: Optional[Mapping[str, Any]]) -> List[str]:
    """Reasons to restart a running container of the instance: its image's ID on the host differs from the one it
    runs (the tag moved), or its digest label from the deployed configuration's (changed outside the role; a changed
    configuration is a reason of its own)."""
    if not running or running.get("process_exited"):
        return []
    container = cfg["container"]
    found = (host.get("containers") or {}).get(cfg["name"]) or {}
    if not found.get("running"):
        return []
    reasons = []
    image = (host.get("images") or {}).get("%s %s" % (container["runtime"], container["image"]))
    if image and found.get("image_id") and found["image_id"] != image:
        reasons.append(
            "image %s is %s on the host, the container runs %s"
            % (container["image"], image[:12], found["image_id"][:12])
        )
    label = (found.get("labels") or {}).get(_vllm_container.DIGEST_LABEL)
    deployed = (((host.get("deployed") or {}).get(cfg["name"]) or {}).get("container") or {}).get("digest")
    if deployed and label != deployed:
        reasons.append(
            "container %s carries %s, not the deployed configuration's"
            % (container["name"], "configuration %s" % str(label)[:12] if label else "no configuration label")
        )
    return reasons


def plan(instances: Optional[Sequence[Instance]], host: Host, settings: Settings) -> Dict[str, Any]:
    """The checks of every instance and, when all pass, what each deploys (see the module docstring)."""
    manager = settings["service_manager"]
    if manager == "auto":
        manager = "systemd" if host.get("systemd") else "detached"
    settings = dict(settings, resolved_manager=manager)
    checks = vllm_server_check(instances, host, settings)
    problems, warnings = list(checks["problems"]), []
    specs = {}
    nvidia = host.get("nvidia") or {}
    if not (nvidia.get("driver") or {}).get("available"):
        warnings.append(
            "%s: the NVIDIA driver library did not answer (%s): GPU indices are not checked and GPU UUIDs "
            "cannot be used" % (host.get("name"), (nvidia.get("driver") or {}).get("error") or "no driver")
        )
    listed = list(instances or [])
    replaces: Dict[Any, List[Dict[str, Any]]] = {}
    gpus = Gpus(nvidia)
    for instance in listed:
        found = _path_problems(instance, settings, host, [other.get("name") for other in listed])
        unmanaged, replaces[instance.get("name")] = _vllm_unmanaged.findings(
            instance, checks["gpus"].get(instance.get("name")), host, gpus, settings
        )
        found += unmanaged
        if _contained(instance, settings):
            found += _vllm_container.gpu_problems(
                checks["gpus"].get(instance.get("name")) or [], nvidia, list(host.get("cdi") or [])
            )
        release, release_problems, release_warnings = _release(instance, settings, host)
        gpu_class = _gpu_class(checks["gpus"].get(instance.get("name")), nvidia)
        spec, spec_problems = _speculative(instance, settings, host.get("drafters"), release, gpu_class)
        specs[instance.get("name")] = spec
        warnings += [
            "instance %s: %s" % (instance.get("name"), warning)
            for warning in release_warnings + (spec["warnings"] if spec else [])
        ]
        found += release_problems + spec_problems
        if found:
            problems.append("instance %s: %s" % (instance.get("name"), "; ".join(found)))
    entries: Dict[str, Any] = {}
    result = {"problems": problems, "warnings": warnings, "manager": manager, "instances": entries}
    if problems:
        return result
    for instance in listed:
        cfg = config_of(
            instance, checks["gpus"][instance["name"]], specs[instance["name"]], _manager(instance, settings), settings
        )
        if _contained(instance, settings):
            cfg = container_of(cfg, instance, settings, host)
        entries[instance["name"]] = _entry(
            instance, cfg, host, settings, specs[instance["name"]], replaces[instance["name"]]
        )
    return result
