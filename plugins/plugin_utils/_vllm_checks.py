# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The checks of the vllm_server role's validate phase, written once, in Python (on the controller).

vllm_server_check(instances, host, settings) -> {"problems": [...], "gpus": {name: [...]}}
"""

from __future__ import annotations

import re

from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _shapes
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._numbers import Refused, number_or_none, numbers

# Documentation: plugins/filter/vllm_server/check.yml.
# An instance of vllm_server_instances, and the role variables without their prefix: operator data, any shape.
Instance = Dict[str, Any]
Settings = Mapping[str, Any]
# A GPU as the role uses it: an index, or a MIG UUID.
GpuRef = Union[int, str]
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
INDEX = re.compile(r"^[0-9]+$")
# An API key is sent as a Bearer token and written as VLLM_API_KEY=<key> in an environment file that systemd and
# detached_process read: RFC 6750 section 2.1 (b64token) keeps it to characters neither of them quotes or splits on.
BEARER = re.compile(r"^[A-Za-z0-9._~+/-]+=*$")
MIG_ONLY = (
    'gpus %s: a MIG instance must be the only GPU of a vLLM instance: CUDA enumerates a single MIG device per '
    'process and no other GPU beside it (MIG user guide, "CUDA Device Enumeration")'
)
WHOLE_MIG = (
    "gpus %s: GPU %s is in MIG mode: CUDA would run on one of its MIG instances and stopping the instance would "
    "end the processes of all of them; give one MIG UUID instead (%s)"
)
NO_LOG_STATS = (
    "extra_args has --disable-log-stats, which removes the vllm:spec_decode_* metrics the acceptance gate reads "
    "(vLLM then creates no stat logger): remove it, or set min_acceptance_rate to 0 to deploy without the gate"
)
# vllm serve flags the role sets itself (plugins/plugin_utils/_vllm_plan.py, argv), or that contradict what it sets, with
# the instance key to use instead. vLLM 0.33 vllm/engine/arg_utils.py (EngineArgs.add_cli_args) and
# vllm/entrypoints/common/cli_args.py (make_arg_parser); -tp, -pp, -dp are the short forms there.
OWNED = {
    "--model": "model",
    "--host": "host",
    "--port": "port",
    "--served-model-name": "served_model_name",
    "--tensor-parallel-size": "tensor_parallel_size (it must equal the number of gpus)",
    "-tp": "tensor_parallel_size",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-model-len": "max_model_len",
    "--speculative-config": "speculative_config",
    # vLLM 0.32 to 0.34 merge these into the speculative config (EngineArgs.create_speculative_config), unchecked
    "--spec-method": "speculative_config.method",
    "--spec-model": "speculative_config.model",
    "--spec-tokens": "speculative_config.num_speculative_tokens",
    "--shutdown-timeout": "shutdown_timeout",
    "--pipeline-parallel-size": "gpus (the role runs tensor parallelism over all of them)",
    "-pp": "gpus",
    "--data-parallel-size": "data_parallel_size (tensor_parallel_size x data_parallel_size must equal the number of gpus)",
    "-dp": "data_parallel_size",
    "--uds": "host and port (the health checks and the drain reach the server there)",
    "--headless": "nothing: the role needs the API server for its health checks",
}
# vLLM 0.33 vllm/entrypoints/cli/serve.py (ServeSubcommand.cmd) runs headless, with no API server, when
# api_server_count < 1; -asc is its short form (vllm/entrypoints/openai/cli_args.py).
API_SERVER_COUNT = "--api-server-count"
HEADLESS_COUNT = (
    "extra_args has %s %s: --api-server-count must be a whole number of 1 or more (below 1 vLLM 0.33 runs headless, "
    "with no API server for the role's health checks and drain: vllm/entrypoints/cli/serve.py)"
)
# vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py) replaces --config FILE by the keys of that YAML file.
CONFIG_FILE = (
    "extra_args has --config: the role does not read that file, so its keys could set the flags the role sets or "
    "refuses (port, host, --headless, --api-key) unchecked, and a change of the file would not be seen as a change "
    "of the instance: put its settings in extra_args, or in the instance keys"
)
# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators. A newline in a value would start
# a line of its own in the systemd unit (an ExecStartPre= of the value's choosing) or in the server's log, and any of
# them splits or ends an argument where a shell or systemd reads the command line.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
CONTROL_TEXT = (
    "%s has a control character (U+%04X) at character %d, which would start a line of its own in the systemd unit or "
    "cut the server's command line: remove it (the value is not shown)"
)
# The role variables that reach the unit (User=, WorkingDirectory=, EnvironmentFile=, its file name), the files' paths
# and the command line; the instances' own values are all checked.
TEXT_SETTINGS = ("user", "config_dir", "state_dir", "log_dir", "systemd_dir", "unit_prefix", "vllm_executable")
# Flags whose value is a secret: on a command line it is readable by every user of the host (/proc/PID/cmdline),
# and it would be in the configuration file and the summary.
SECRETS = {
    "--api-key": "set the instance's api_key: the role keeps it as VLLM_API_KEY, which vLLM reads "
    "(vllm/envs.py, vllm/entrypoints/serve/middleware/register.py), in <vllm_server_config_dir>/<name>.env, mode 0600",
    "--hf-token": "log in on the host instead (`hf auth login`): vLLM then reads the token file of huggingface_hub "
    "(HF_TOKEN_PATH, default ~/.cache/huggingface/token) with a bare --hf-token or none",
}


def _text(values: Any) -> str:
    return ", ".join(str(value) for value in values)


def _flag(arg: object) -> Optional[str]:
    """The option an argument names as vLLM's FlexibleArgumentParser reads it (underscores as dashes, no `=value`,
    no `.key` of a JSON option), or None for a value. vLLM 0.33 vllm/utils/argparse_utils.py, parse_args."""
    if not isinstance(arg, str) or not arg.startswith("-") or arg in ("-", "--") or re.match(r"^-[0-9.]", arg):
        return None
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        return "--" + name[2:].split(".", 1)[0].replace("_", "-")
    for short in ("-tp", "-pp", "-dp", "-asc"):  # argparse also takes -tp2, -tp=2
        if name.startswith(short):
            return short
    return name


def _owned(flag: str) -> Optional[str]:
    """The owned flag that `flag` names: itself, or an abbreviation argparse would expand (allow_abbrev)."""
    names = list(OWNED) + list(SECRETS) + [API_SERVER_COUNT]
    if flag in names:
        return flag
    if flag == "-asc":
        return API_SERVER_COUNT
    if flag.startswith("--") and len(flag) > 4:
        matches = [name for name in names if name.startswith(flag)]
        if matches:
            return matches[0]
    return None


def _value(extra_args: List[str], position: int) -> Optional[str]:
    """The value given to the flag at `position`: after `=`, glued to a short flag (-asc0), or the next argument."""
    arg = extra_args[position]
    if "=" in arg:
        return arg.split("=", 1)[1]
    flag = _flag(arg)
    if not arg.startswith("--") and flag is not None and flag != arg:
        return arg[len(flag) :]
    if position + 1 < len(extra_args) and _flag(extra_args[position + 1]) is None:
        return extra_args[position + 1]
    return None


def _api_server_count_problem(extra_args: List[str], position: int) -> Optional[str]:
    """Why the --api-server-count at `position` is refused (below 1, not a whole number, no value), or None."""
    value = _value(extra_args, position)
    try:
        if value is not None and int(value) >= 1:
            return None
    except ValueError:
        pass
    written = extra_args[position].split("=", 1)[0]
    if not written.startswith("--"):
        written = _flag(written) or written  # -asc0: the flag without its value
    if _flag(written) != API_SERVER_COUNT:
        written = "%s (%s)" % (written, API_SERVER_COUNT)
    return HEADLESS_COUNT % (written, "without a value" if value is None else "with %r" % value)


def _secret_problem(extra_args: List[str], position: int, owned: str) -> Optional[str]:
    arg = extra_args[position]
    valued = "=" in arg or (position + 1 < len(extra_args) and _flag(extra_args[position + 1]) is None)
    if owned == "--api-key" or valued:
        return (
            "extra_args has %s with a secret, which would be on the server's command line and in "
            "the summary (its value is not shown): %s" % (owned, SECRETS[owned])
        )
    return None


def extra_args_problems(extra_args: object, gate: bool) -> List[str]:
    """What is wrong with an instance's extra_args; never quotes a value (it may be a secret)."""
    if extra_args is None:
        return []
    if not isinstance(extra_args, list) or not all(isinstance(arg, str) for arg in extra_args):
        return ["extra_args must be a list of strings, one vllm serve argument each"]
    found: List[Optional[str]] = []
    for position, arg in enumerate(extra_args):
        flag = _flag(arg)
        owned = _owned(flag) if flag else None
        if owned in SECRETS:
            found.append(_secret_problem(extra_args, position, owned))
        elif owned == API_SERVER_COUNT:
            found.append(_api_server_count_problem(extra_args, position))
        elif owned:
            found.append(
                "extra_args has %s, which the role sets itself: use %s"
                % (flag if flag == owned else "%s (%s)" % (flag, owned), OWNED[owned])
            )
        elif flag == "--config":
            found.append(CONFIG_FILE)
    problems = [problem for problem in found if problem]
    if gate and any(re.match(r"^--disable[-_]log[-_]stats$", arg) for arg in extra_args):
        problems.append(NO_LOG_STATS)
    return problems


def port_problems(instance: Instance) -> List[str]:
    if instance.get("port") in (None, ""):
        return ["port is not set: give the TCP port of the instance (1 to 65535)"]
    port = number_or_none(instance.get("port"), True)
    if port is None:
        return ["port %r is not a TCP port number" % (instance.get("port"),)]
    if not 1 <= port <= 65535:
        return ["port %d is out of range: a TCP port is 1 to 65535" % port]
    return []


def number_problems(instance: Instance, settings: Settings) -> List[str]:
    problems = []
    tp = instance.get("tensor_parallel_size")
    dp = instance.get("data_parallel_size")
    gpus = instance.get("gpus")
    count = len(gpus) if isinstance(gpus, list) else None
    dp_number = 1 if dp in (None, "") else number_or_none(dp, True)
    if dp_number is None or dp_number < 1:
        problems.append("data_parallel_size %r is not a whole number of 1 or more" % (dp,))
    elif tp not in (None, "") and count is not None and (number_or_none(tp, True) or 0) * dp_number != count:
        problems.append(
            "tensor_parallel_size %s%s does not match the %d GPUs %s"
            % (tp, " x data_parallel_size %d" % dp_number if dp_number > 1 else "", count, gpus)
        )
    elif tp in (None, "") and count is not None and count % dp_number:
        problems.append("data_parallel_size %d does not divide the %d GPUs %s" % (dp_number, count, gpus))
    memory = instance.get("gpu_memory_utilization")
    memory = 0.9 if memory in (None, "") else number_or_none(memory, False)
    if memory is None or not 0 < memory <= 1:
        problems.append("gpu_memory_utilization must be in (0, 1]")
    length = instance.get("max_model_len")
    if length is not None and length != "":
        number = number_or_none(length, True)
        if number is None or (number < 1 and number != -1):
            problems.append(
                "max_model_len %s must be a number of tokens of at least 1, or -1 for vLLM's fit to GPU "
                "memory (vLLM 0.33 vllm/config/model.py)" % (length,)
            )
    shutdown = instance.get("shutdown_timeout")
    if shutdown not in (None, "", 0) and (number_or_none(shutdown, False) or 0) >= float(settings["stop_timeout"]):
        problems.append(
            "shutdown_timeout %s must be below vllm_server_stop_timeout %s: SIGKILL would cut the drain short"
            % (shutdown, settings["stop_timeout"])
        )
    return problems


def other_problems(instance: Instance, settings: Settings) -> List[str]:
    problems = []
    environment = instance.get("environment") or {}
    reserved = [key for key in environment if key in ("CUDA_VISIBLE_DEVICES", "VLLM_API_KEY")]
    if reserved:
        problems.append("environment must not set %s: use gpus and api_key" % _text(reserved))
    executable = instance.get("vllm_executable") or settings["vllm_executable"]
    if not str(executable).startswith("/"):
        problems.append("vllm_executable must be an absolute path")
    key = instance.get("api_key")
    if key not in (None, "") and not (isinstance(key, str) and BEARER.match(key)):
        problems.append(
            "api_key must be a bearer token (RFC 6750 b64token): letters, digits and - . _ ~ + /, with = only "
            "at the end, no space, quote or newline (its value is not shown)"
        )
    rate = instance.get("min_acceptance_rate")
    rate = settings["min_acceptance_rate"] if rate is None else rate
    gate = bool(instance.get("speculative_config")) and (number_or_none(rate, False) or 0) > 0
    return problems + extra_args_problems(instance.get("extra_args"), gate)


class Gpus:
    """The host's GPUs as gpu_facts reports them: references (index text, GPU UUID, MIG UUID) to what the role uses."""

    def __init__(self, nvidia: Optional[Mapping[str, Any]]) -> None:
        nvidia = nvidia or {}
        self.known = bool((nvidia.get("driver") or {}).get("available"))
        gpus = (nvidia.get("gpus") or []) if self.known else []
        self.ids: Dict[str, int] = {}  # index text and GPU UUID -> index
        self.migs: Dict[str, int] = {}  # MIG UUID -> index of its GPU
        self.mig_mode: Set[int] = set()
        self.errors: Dict[int, str] = {}
        for gpu in gpus:
            self.ids[str(gpu["index"])] = gpu["index"]
            if gpu.get("uuid"):
                self.ids[gpu["uuid"]] = gpu["index"]
            for device in gpu.get("mig_devices") or []:
                self.migs[device["uuid"]] = gpu["index"]
            if isinstance(gpu.get("mig_mode"), dict) and gpu["mig_mode"].get("current"):
                self.mig_mode.add(gpu["index"])
            if gpu.get("error"):
                self.errors[gpu["index"]] = gpu["error"]

    def ref(self, entry: object) -> GpuRef:
        """What the role uses for entry: an index, or a MIG UUID as it is."""
        text = str(entry)
        return text if text in self.migs else self.ids[text]

    def parent(self, entry: object) -> int:
        text = str(entry)
        return self.migs[text] if text in self.migs else self.ids[text]

    def known_entry(self, entry: object) -> bool:
        return str(entry) in self.ids or str(entry) in self.migs

    def overlap(self, mine: Sequence[object], theirs: Sequence[object]) -> bool:
        """Whether two resolved GPU lists share a GPU: the same GPU or MIG instance, or a whole GPU and one of its
        MIG instances. Two MIG instances of one GPU do not overlap."""
        for a in mine:
            for b in theirs:
                if str(a) == str(b):
                    return True
                if not (self.known and self.known_entry(a) and self.known_entry(b)):
                    continue
                whole_a, whole_b = str(a) not in self.migs, str(b) not in self.migs
                if (whole_a or whole_b) and self.parent(a) == self.parent(b):
                    return True
        return False


def _intersect(first: Sequence[Any], second: Any) -> List[Any]:
    """Ansible's intersect on lists: the items of first that are in second, once each, in first's order."""
    found = []
    for item in first:
        if item in second and item not in found:
            found.append(item)
    return found


def shared_gpus(instance: Instance, instances: Sequence[Instance], gpus: Gpus) -> List[str]:
    """GPUs of instance that another instance of the list uses too (as written, or as indices for whole GPUs)."""
    others = [o["gpus"] for o in instances if o.get("name") != instance.get("name") and isinstance(o.get("gpus"), list)]
    other = [str(entry) for entries in others for entry in entries]
    own = [str(entry) for entry in instance["gpus"]]
    if not gpus.known:
        return _intersect(other, own)
    own = [entry for entry in own if gpus.known_entry(entry)]
    other = [entry for entry in other if gpus.known_entry(entry)]
    parents_own = [gpus.parent(entry) for entry in own]
    parents_other = [gpus.parent(entry) for entry in other]
    found = _intersect([str(gpus.ref(e)) for e in other], [str(gpus.ref(e)) for e in own])
    found += [str(p) for p in _intersect([gpus.parent(e) for e in own if e not in gpus.migs], parents_other)]
    found += [str(p) for p in _intersect([gpus.parent(e) for e in other if e not in gpus.migs], parents_own)]
    return _intersect(found, found)


def _gpu_entry_problems(raw: object, gpus: Gpus) -> Tuple[List[str], Optional[List[GpuRef]]]:
    """Problems of the entries themselves, and the resolved GPUs (None when they cannot be resolved)."""
    if isinstance(raw, str):
        parts = [part.strip() for part in raw.split(",") if part.strip()]
        return [
            "gpus must be a list of GPU indices or UUIDs, not the text %r: write gpus: [%s]" % (raw, ", ".join(parts))
        ], None
    if not isinstance(raw, list):
        return ["gpus must be a list of GPU indices or UUIDs"], None
    if not raw:
        return ["gpus must list at least one GPU index"], None
    if gpus.known:
        unknown = [str(entry) for entry in raw if not gpus.known_entry(entry)]
        if unknown:
            migs = ("; MIG instances: " + _text(sorted(gpus.migs))) if gpus.migs else ""
            return [
                "gpus %s: no such GPU on this host (its GPUs: indices %s, or their UUIDs%s)"
                % (_text(unknown), _text(sorted(set(gpus.ids.values()))), migs)
            ], None
        return [], [gpus.ref(entry) for entry in raw]
    unknown = [str(entry) for entry in raw if isinstance(entry, bool) or not INDEX.match(str(entry))]
    if unknown:
        return ["gpus %s: GPU UUIDs need the NVIDIA driver library, which did not answer" % _text(unknown)], None
    return [], [int(entry) for entry in raw]


def gpu_problems(
    instance: Instance, instances: Sequence[Instance], gpus: Gpus, render: bool = False
) -> Tuple[List[str], Optional[List[GpuRef]]]:
    """(problems, resolved GPUs or None) of an instance's gpus."""
    raw: Any = instance.get("gpus")
    problems, resolved = _gpu_entry_problems(raw, gpus)
    if resolved is None:
        return problems, None
    shared = shared_gpus(instance, instances, gpus)
    if shared:
        problems.append("GPUs %s are also used by another instance" % shared)
    if len(raw) > 1 and any(str(entry) in gpus.migs for entry in raw):
        problems.append(MIG_ONLY % _text(raw))
    twice = _intersect([ref for position, ref in enumerate(resolved) if ref in resolved[:position]], resolved)
    if twice:
        problems.append(
            "gpus %s: GPU %s is listed more than once (by index or UUID): list each GPU once"
            % (_text(raw), _text(twice))
        )
    whole = _intersect(
        [gpus.ids[str(e)] for e in raw if str(e) in gpus.ids and gpus.ids[str(e)] in gpus.mig_mode], resolved
    )
    if whole:
        migs = [uuid for uuid, parent in sorted(gpus.migs.items()) if parent in whole]
        problems.append(WHOLE_MIG % (_text(raw), _text(whole), _text(migs) or "it has no MIG instance"))
    lost = _intersect(
        [gpus.parent(ref) for ref in resolved if gpus.known and gpus.parent(ref) in gpus.errors], gpus.errors
    )
    if render:  # files only: no server is stopped or started
        lost = []
    for index in lost:
        problems.append(
            "gpus: GPU %d answers NVML with an error (%s), as gpu_facts reports it: the running server would "
            "be stopped and no new one could start there. Look at the GPU first (a GPU that fell off the bus "
            "needs a reset or a reboot), or deploy on other GPUs" % (index, gpus.errors[index])
        )
    return problems, resolved


def _holds(holder: Mapping[str, Any], ref: GpuRef, gpus: Gpus) -> bool:
    """Whether a gpu_facts holder holds GPU reference ref (an index, or a MIG UUID)."""
    if isinstance(ref, str) and ref in gpus.migs:
        return _shapes.holds(holder, gpus.migs[ref], ref)
    return isinstance(ref, int) and _shapes.holds(holder, ref)


def _belongs(holder: Mapping[str, Any], name: str, config: Mapping[str, Any], settings: Settings) -> bool:
    """Whether a holder is a process of the instance `name` deployed with `config`: in its systemd unit, or under a
    vllm serve API server listening on its port (gpu_facts' owner.agent)."""
    owner = holder.get("owner") or {}
    if owner.get("systemd_unit") == "%s%s.service" % (settings["unit_prefix"], name):
        return True
    agent = owner.get("agent") or {}
    words = str(agent.get("cmdline") or "").split()
    port = str(config.get("port"))
    on_port = any(words[i : i + 2] == ["--port", port] or words[i] == "--port=" + port for i in range(len(words)))
    return agent.get("kind") == "vllm" and on_port


def held_problems(
    instance: Instance,
    resolved: List[GpuRef],
    instances: Sequence[Instance],
    host: Mapping[str, Any],
    gpus: Gpus,
    settings: Settings,
) -> List[str]:
    """An instance deployed by this role that runs on these GPUs and would still be there when this one is deployed
    (not in the list, or after this one): the stop would end it."""
    names = [other.get("name") for other in instances]
    position = names.index(instance["name"])
    problems = []
    for name, config in sorted((host.get("deployed") or {}).items()):
        if name == instance["name"] or name in names[:position] or not isinstance(config.get("gpus"), list):
            continue
        if not gpus.overlap(resolved, config["gpus"]):
            continue
        theirs = [h for h in (host.get("nvidia") or {}).get("holders") or [] if _belongs(h, name, config, settings)]
        taken = [ref for ref in resolved if any(_holds(h, ref, gpus) for h in theirs)]
        pids = sorted(h["pid"] for h in theirs if any(_holds(h, ref, gpus) for ref in taken))
        if not pids:
            continue
        if name in names:
            where = "it is listed after %s: list it first, so that it moves before %s takes its GPUs" % (
                instance["name"],
                instance["name"],
            )
        else:
            where = (
                "it is not in vllm_server_instances: stop it first (its unit %s%s.service, or the session of the PID "
                "in %s/%s.pid), or choose other GPUs" % (settings["unit_prefix"], name, settings["state_dir"], name)
            )
        problems.append(
            "%s held by instance %s (deployed by this role on %s %s, %s %s), which the redeploy would end: %s"
            % (
                "GPU %s is" % _text(taken) if len(taken) == 1 else "GPUs %s are" % _text(taken),
                name,
                "GPU" if len(config["gpus"]) == 1 else "GPUs",
                _text(config["gpus"]),
                "PID" if len(pids) == 1 else "PIDs",
                _text(pids),
                where,
            )
        )
    return problems


def _strings(value: object, path: str = "") -> Iterator[Tuple[str, str]]:
    """(name, text) of every string in `value`, a dict key too, named as the operator wrote it: environment.FOO,
    extra_args[2]."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            if CONTROL.search(str(key)):
                yield "%s key %r" % (path, str(key)), str(key)
                continue
            yield from _strings(item, "%s.%s" % (path, key) if path else str(key))
    elif isinstance(value, list):
        for position, item in enumerate(value):
            yield from _strings(item, "%s[%d]" % (path, position))


def control_problems(named: Mapping[str, Any]) -> List[str]:
    """A problem for each string of `named` ({name: value}) that holds a control character (CONTROL)."""
    problems = []
    for name, text in _strings(named):
        match = CONTROL.search(text)
        if match:
            problems.append(CONTROL_TEXT % (name, ord(match.group()), match.start() + 1))
    return problems


def instance_problems(
    instance: Instance, instances: Sequence[Instance], host: Mapping[str, Any], gpus: Gpus, settings: Settings
) -> Tuple[List[str], Optional[List[GpuRef]]]:
    """(problems, resolved GPUs) of one instance, in the order the operator reads them."""
    name = instance.get("name")
    # api_key has its own check, which says what a key may hold.
    problems = control_problems({key: value for key, value in instance.items() if key not in ("name", "api_key")})
    if not NAME.match(str(name)):
        problems.append('name must be letters, digits, ".", "_" or "-"')
    if [other.get("name") for other in instances].count(name) > 1:
        problems.append("the name is used by another instance")
    ports = port_problems(instance)
    problems += ports
    if (
        not ports
        and [number_or_none(other.get("port"), True) for other in instances].count(
            number_or_none(instance["port"], True)
        )
        > 1
    ):
        problems.append("port %s is used by another instance" % instance["port"])
    render = settings.get("render", False)
    found, resolved = gpu_problems(instance, instances, gpus, render)
    problems += found + number_problems(instance, settings) + other_problems(instance, settings)
    if resolved is not None and not problems and not render:
        problems += held_problems(instance, resolved, instances, host, gpus, settings)
    return problems, resolved


# Role numbers that must be above 0 (waiting in steps of 0 s would never end), and those that count whole things.
POSITIVE_NUMBERS = ("drain_poll_interval", "ready_poll_interval")
WHOLE_NUMBERS = ("gpu_max_used_mib", "warmup_max_tokens", "log_lines")


def number_settings_problems(settings_numbers: Mapping[str, Any]) -> List[str]:
    """Why the role's numbers ({name without the vllm_server_ prefix: value}) cannot be used: [] when they can.

    The check of the reset and check variables (plugin_utils/_numbers.py): finite, not negative, whole where the
    argument spec says int, the poll intervals above 0."""
    given = {"vllm_server_" + name: value for name, value in settings_numbers.items()}
    try:
        numbers(
            given,
            positive=tuple("vllm_server_" + name for name in POSITIVE_NUMBERS),
            whole=tuple("vllm_server_" + name for name in WHOLE_NUMBERS),
            **dict.fromkeys(given),
        )
    except Refused as exc:
        return [str(exc)]
    return []


def vllm_server_check(
    instances: Optional[Sequence[Instance]], host: Mapping[str, Any], settings: Settings
) -> Dict[str, Any]:
    """The checks of the validate phase; see DOCUMENTATION."""
    gpus = Gpus(host.get("nvidia"))
    problems = number_settings_problems(settings.get("numbers") or {})
    resolved: Dict[Any, Optional[List[GpuRef]]] = {}
    problems += control_problems({"vllm_server_" + key: settings.get(key) for key in TEXT_SETTINGS})
    if settings["service_manager"] == "systemd" and not host.get("systemd") and not settings.get("render"):
        problems.append(
            "vllm_server_service_manager is systemd, but %s does not run systemd (there is no directory "
            "/run/systemd/system, the test of sd_booted(3)): set vllm_server_service_manager to detached or "
            "auto" % host.get("name")
        )
    listed = list(instances or [])
    for instance in listed:
        found, resolved[instance.get("name")] = instance_problems(instance, listed, host, gpus, settings)
        if found:
            problems.append("instance %s: %s" % (instance.get("name"), "; ".join(found)))
    return {"problems": problems, "gpus": resolved}
