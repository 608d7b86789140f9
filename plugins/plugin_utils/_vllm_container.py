# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The vllm_server role's containers, on the controller: what an instance run by podman or docker may ask, and the
command that runs it (docs/vllm_server.md, "Containers").

An instance with service_manager podman or docker runs `RUNTIME run -d IMAGE <vLLM arguments>`: the image's entrypoint
is `vllm serve` (vllm-project/vllm docker/Dockerfile, stage vllm-openai: ENTRYPOINT ["vllm", "serve"]), so the
arguments are the role's `vllm serve` arguments without the executable and `serve`. What the role sets itself:

- the container's name (`<unit prefix><name>`) and two labels: the instance, and the SHA-256 of its configuration
  (config_digest), which the compare phase reads back from the running container;
- the host's network (`port` means what it means for a process on the host), and the host's IPC namespace or, with
  shm_size, a /dev/shm of that size (PyTorch shares tensors between tensor-parallel processes through it: vLLM's
  "Using Docker" page);
- the GPUs: their CDI names (`nvidia.com/gpu=<index>`) where the host has a CDI spec that names them, else the device
  files (`/dev/nvidia<minor>`, nvidiactl, nvidia-uvm, nvidia-uvm-tools);
- the environment by name only (`-e NAME`: the runtime takes the value from its own environment, which the module
  sets), and the API key through `--env-file` (the key file, mode 0600): no value is on a command line;
- the stop timeout (`--stop-timeout`, vllm_server_stop_timeout) and the runtime's restart policy (`--restart
  on-failure:3`), the supervision where no unit runs the container.

Refused before anything stops: an image or a volume path that starts with `-` or holds a space or control character,
volume paths that are not absolute, options that break the container's bounds or the role's settings
(`--privileged`, `--pid=host`, `--name`, `--network`, ...), and, from the look at the host (plan), a missing image.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._vllm_checks import CONTROL, CONTROL_TEXT

RUNTIMES = ("podman", "docker")
DIGEST_LABEL = "gpuops.nvidia.config-digest"
INSTANCE_LABEL = "gpuops.nvidia.instance"
RESTART = "on-failure:3"
# The device files a CUDA process opens besides its GPUs' (NVIDIA container toolkit, "CDI support": the spec's
# deviceNodes of every GPU).
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")

# Options the role refuses in container_options, with why. The role sets the first group itself; the second breaks
# what a reset and a redeploy rely on.
REFUSED_OPTIONS = {
    "--name": "the role names the container <unit prefix><name>",
    "--network": "the role runs the container on the host's network, so that port means what it means on the host",
    "--net": "the role runs the container on the host's network, so that port means what it means on the host",
    "--ipc": "the role sets the IPC namespace: give shm_size for a /dev/shm of the container's own",
    "--shm-size": "use the instance's shm_size",
    "--device": "the role passes the instance's GPUs: use gpus",
    "--gpus": "the role passes the instance's GPUs: use gpus",
    "--env": "use environment (the role passes it by name, never its value on a command line)",
    "-e": "use environment (the role passes it by name, never its value on a command line)",
    "--env-file": "use environment and api_key",
    "--volume": "use volumes",
    "-v": "use volumes",
    "--mount": "use volumes",
    "--label": "the role labels the container with its configuration's digest",
    "-l": "the role labels the container with its configuration's digest",
    "--restart": "the role sets the restart policy",
    "--rm": "the role keeps the container until its next stop",
    "--detach": "the role runs the container detached",
    "-d": "the role runs the container detached",
    "--entrypoint": "the image's entrypoint runs vllm serve; set image",
    "--stop-timeout": "the role sets it from vllm_server_stop_timeout",
    "--privileged": "it gives the container every device and capability of the host",
    "--pid": "--pid=host puts the container's processes in the host's PID namespace: what its API server leaves is "
    "not ended with the container (pid_namespaces(7)), and a stop of the container leaves them on the GPUs",
    "--cgroupns": "the reset finds a container's processes by their cgroup",
    "--cgroup-parent": "the reset finds a container's processes by the cgroup its runtime gives them",
}
_IMAGE_RE = re.compile(r"^[^\s-][^\s]*$")
_SHM_RE = re.compile(r"^[0-9]+[bkmgBKMG]?$")
_VOLUME_MODES = ("ro", "rw")


def manager_of(instance: Mapping[str, Any], default: str) -> str:
    """The instance's service manager: its own service_manager, else the role's (after auto was resolved)."""
    value = instance.get("service_manager")
    return str(value) if value not in (None, "") else default


def volumes_of(instance: Mapping[str, Any]) -> List[Dict[str, str]]:
    """The instance's volumes as [{"src", "dest", "mode"}]: each entry "SRC:DEST[:ro|rw]" or {src, dest, mode}; mode
    ro unless said. Entries that cannot be read are left out (volume_problems names them)."""
    found = []
    for entry in instance.get("volumes") or []:
        if isinstance(entry, str):
            parts = entry.split(":")
            if len(parts) in (2, 3):
                found.append({"src": parts[0], "dest": parts[1], "mode": parts[2] if len(parts) == 3 else "ro"})
        elif isinstance(entry, dict):
            found.append(
                {
                    "src": str(entry.get("src", "")),
                    "dest": str(entry.get("dest", "")),
                    "mode": str(entry.get("mode", "ro")),
                }
            )
    return found


def _word_problem(what: str, value: str) -> Optional[str]:
    if not value:
        return "%s is empty" % what
    if value.startswith("-"):
        return "%s %r starts with -: the runtime would read it as an option" % (what, value)
    if re.search(r"\s", value):
        return "%s %r has a space" % (what, value)
    return None


def volume_problems(instance: Mapping[str, Any]) -> List[str]:
    """Why the instance's volumes cannot be used: each must be "SRC:DEST[:ro|rw]" or {src, dest, mode}, both paths
    absolute, without ":" or ",", a space, or a leading "-"."""
    raw = instance.get("volumes")
    if raw in (None, []):
        return []
    if not isinstance(raw, list):
        return ["volumes must be a list of SRC:DEST[:ro|rw] entries"]
    problems = []
    for position, entry in enumerate(raw):
        where = "volumes[%d]" % position
        if isinstance(entry, str) and len(entry.split(":")) not in (2, 3):
            problems.append("%s must be SRC:DEST or SRC:DEST:ro|rw" % where)
            continue
        if not isinstance(entry, (str, dict)):
            problems.append("%s must be SRC:DEST[:ro|rw] or {src, dest, mode}" % where)
            continue
        volume = volumes_of({"volumes": [entry]})[0]
        for key in ("src", "dest"):
            value = volume[key]
            problem = _word_problem("%s %s" % (where, key), value)
            if problem:
                problems.append(problem)
            elif not value.startswith("/"):
                problems.append("%s %s %r is not an absolute path" % (where, key, value))
            elif "," in value or ":" in value:
                problems.append("%s %s %r has a , or :, which the runtime reads as a separator" % (where, key, value))
        if volume["mode"] not in _VOLUME_MODES:
            problems.append("%s mode %r is not ro or rw" % (where, volume["mode"]))
    return problems


def option_problems(options: object, where: str) -> List[str]:
    """Why container options (vllm_server_container_options, an instance's container_options) cannot be used."""
    if options in (None, []):
        return []
    if not isinstance(options, list) or not all(isinstance(option, str) for option in options):
        return ["%s must be a list of strings" % where]
    problems = []
    for position, option in enumerate(options):
        control = CONTROL.search(option)
        if control:  # an instance's are checked with its other texts; the role variable's here
            problems.append(CONTROL_TEXT % ("%s[%d]" % (where, position), ord(control.group()), control.start() + 1))
            continue
        flag = option.split("=", 1)[0]
        if flag in REFUSED_OPTIONS:
            problems.append("%s has %s: %s" % (where, flag, REFUSED_OPTIONS[flag]))
    return problems


def container_problems(instance: Mapping[str, Any], manager: str, settings: Mapping[str, Any]) -> List[str]:
    """Why a container instance cannot be deployed, from its keys alone (the image's presence is the plan's)."""
    if manager not in RUNTIMES:
        keys = [key for key in ("image", "volumes", "shm_size", "container_options") if instance.get(key)]
        return ["%s are for instances run by podman or docker (service_manager)" % ", ".join(keys)] if keys else []
    problems = []
    image = instance.get("image")
    if not isinstance(image, str) or not image:
        problems.append("image is required with service_manager %s" % manager)
    else:
        problem = _word_problem("image", image)
        if problem or not _IMAGE_RE.match(image):
            problems.append(problem or "image %r is not an image reference" % image)
    problems += volume_problems(instance)
    shm = instance.get("shm_size")
    if shm not in (None, "") and not _SHM_RE.match(str(shm)):
        problems.append("shm_size %r is not a size such as 16g" % shm)
    problems += option_problems(settings.get("container_options"), "vllm_server_container_options")
    problems += option_problems(instance.get("container_options"), "container_options")
    return problems


def config_digest(cfg: Mapping[str, Any]) -> str:
    """The SHA-256 of a configuration (its JSON with sorted keys, without the digest and the run command that carry
    it), which the container carries as DIGEST_LABEL."""
    container = {k: v for k, v in (cfg.get("container") or {}).items() if k not in ("digest", "run_argv")}
    text = json.dumps(dict(cfg, container=container), sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def host_path(instance: Mapping[str, Any], path: object, manager: str) -> Optional[str]:
    """Where a path inside the container lies on the host: through the volume whose destination holds it (the
    longest); the path itself for an instance that is not a container's (`manager`); None when no volume holds it."""
    text = str(path)
    if manager not in RUNTIMES or not text.startswith("/"):
        return text
    best = None
    for volume in volumes_of(instance):
        dest = volume["dest"].rstrip("/") or "/"
        if text == dest or text.startswith(dest.rstrip("/") + "/"):
            if best is None or len(dest) > len(best["dest"]):
                best = dict(volume, dest=dest)
    if best is None:
        return None
    return best["src"].rstrip("/") + text[len(best["dest"].rstrip("/")) :]


def _cdi_names(gpus: Sequence[Any], cdi: Sequence[str]) -> Optional[List[str]]:
    """The CDI names of the instance's GPUs (`nvidia.com/gpu=<index or MIG UUID>`) where the host's specs name every
    one (`cdi`: the names they list), else None."""
    names = ["nvidia.com/gpu=%s" % gpu for gpu in gpus]
    return names if names and all(name in cdi for name in names) else None


def _minors(nvidia: Mapping[str, Any]) -> Dict[Any, int]:
    """The minor number of each GPU index, as the driver library gave it (gpu_facts' `minor`)."""
    found = {gpu.get("index"): gpu.get("minor") for gpu in nvidia.get("gpus") or []}
    return {index: minor for index, minor in found.items() if isinstance(minor, int) and not isinstance(minor, bool)}


def gpu_problems(gpus: Sequence[Any], nvidia: Mapping[str, Any], cdi: Sequence[str]) -> List[str]:
    """Why the instance's GPUs cannot be given to its container: no CDI spec names them all and the device file of
    one is unknown (a MIG instance, or a GPU whose minor number the driver library did not give). The index is never
    taken for the minor number: /dev/nvidia<index> may be another GPU's."""
    if _cdi_names(gpus, cdi) is not None:
        return []
    minors = _minors(nvidia)
    unknown = [gpu for gpu in gpus if isinstance(gpu, bool) or gpu not in minors]
    if not unknown:
        return []
    mig = any(isinstance(gpu, str) for gpu in unknown)
    return [
        "gpus %s: the host has no CDI spec that names %s, and the device file of %s is not known (%s): generate "
        "the host's CDI spec (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)%s"
        % (
            ", ".join(str(gpu) for gpu in gpus),
            ", ".join("nvidia.com/gpu=%s" % gpu for gpu in gpus),
            ", ".join(str(gpu) for gpu in unknown),
            "a MIG instance goes by its CDI name only" if mig else "the NVIDIA driver library gave no minor number",
            "" if mig else ", or look at the driver: gpu_facts shows what it answered for each GPU",
        )
    ]


def gpu_args(gpus: Sequence[Any], nvidia: Mapping[str, Any], cdi: Sequence[str]) -> List[str]:
    """The runtime's options for the instance's GPUs: `--device nvidia.com/gpu=<index>` each where the host's CDI
    spec names every one (`cdi`: the names the host's specs list), else `--device` for each GPU's device file
    (`/dev/nvidia<minor>`) and the control devices. gpu_problems refuses, before this, GPUs without either."""
    names = _cdi_names(gpus, cdi)
    if names is not None:
        return [arg for name in names for arg in ("--device", name)]
    minors = _minors(nvidia)
    files = ["/dev/nvidia%d" % minors[gpu] for gpu in gpus] + list(CONTROL_DEVICES)
    return [arg for path in files for arg in ("--device", path)]


def run_argv(cfg: Mapping[str, Any], settings: Mapping[str, Any], container: Mapping[str, Any]) -> List[str]:
    """`RUNTIME run -d ...` of a container configuration (`container`: the cfg's "container" block), without the
    runtime's path: the module finds it on the host."""
    argv = ["run", "-d", "--name", container["name"]]
    argv += [
        "--label",
        "%s=%s" % (INSTANCE_LABEL, cfg["name"]),
        "--label",
        "%s=%s" % (DIGEST_LABEL, container["digest"]),
    ]
    argv += ["--network", "host"]
    argv += ["--shm-size", str(container["shm_size"])] if container.get("shm_size") else ["--ipc", "host"]
    argv += ["--restart", RESTART, "--stop-timeout", str(int(float(settings["stop_timeout"])))]
    argv += list(container["gpu_args"])
    for volume in container["volumes"]:
        argv += ["-v", "%s:%s:%s" % (volume["src"], volume["dest"], volume["mode"])]
    for name in sorted(cfg["environment"]):
        argv += ["-e", name]
    if cfg.get("api_key_file"):
        argv += ["--env-file", cfg["api_key_file"]]
    if container["runtime"] == "podman":
        argv += ["--log-driver", "k8s-file", "--log-opt", "path=%s" % cfg["log_file"]]
    argv += list(container["options"])
    return argv + [container["image"]] + list(cfg["argv"][2:])
