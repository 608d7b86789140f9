# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM servers the vllm_server role did not start, in an instance's way, on the controller: refuse, or replace.

A server is in the way of an instance when it listens on the instance's port or its tree holds any of the
instance's GPUs, and no deployed instance has a record of it (vllm_server_host's "servers", "recorded_by" None). A
server still loading its model does not listen yet: it is in the way when its command line names the instance's port
(vLLM has bound it already) or its tree holds the instance's GPUs; replaced, its drain finds nothing listening and
goes on to its stop.
Without the opt-in (vllm_server_adopt_unmanaged, or the instance's adopt_unmanaged) each one refuses the instance
before anything is signalled. With it, a server whose GPUs are all the instance's is drained and replaced; one that
holds other GPUs too is still refused: its stop would take them from under whatever uses them next.

in_the_way(instance, resolved, host, gpus) -> [server]; findings(instance, resolved, host, gpus, settings) ->
(problems, servers to replace); describe(server) -> one line naming it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_address import local_url
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._numbers import number_or_none

# A server as vllm_server_host reads it (module_utils/vllm/_vllm_servers.py Server, with "recorded_by").
Server = Mapping[str, Any]
# _vllm_checks.Gpus (not imported: _vllm_checks imports nothing of the role's plan).
GpuTable = Any
OPT_IN = "-e vllm_server_adopt_unmanaged=true (or adopt_unmanaged: true on the instance)"


def _join(values: Sequence[object]) -> str:
    return ", ".join(str(value) for value in values)


def ports(server: Server) -> List[int]:
    """The TCP ports the server listens on, once each."""
    found: List[int] = []
    for _address, port in server.get("listen") or []:
        if int(port) not in found:
            found.append(int(port))
    return found


def apart(server: Server) -> bool:
    """Whether the server runs in a network namespace of its own (a container on a bridge network): its sockets and
    its port are not this host's."""
    return server.get("own_network") is False


def starting(server: Server) -> bool:
    """Whether the server is still starting: in this host's network, it listens on no TCP port yet, and its command
    line names one."""
    return not server.get("listen") and server.get("port") is not None and not apart(server)


def _port_of(server: Server) -> List[int]:
    """The ports the server listens on; for one still starting, the port its command line names."""
    return [int(server["port"])] if starting(server) else ports(server)


def gpus_words(refs: Sequence[Any]) -> str:
    """ "GPU 2" for one GPU reference, "GPUs 2, 3" for several."""
    return "%s %s" % ("GPU" if len(refs) == 1 else "GPUs", _join(refs))


def _it(count: int) -> Tuple[str, str, str]:
    """The verb and pronouns of a sentence about `count` GPUs: ("is", "it", "it") or ("are", "them", "them")."""
    return ("is", "it", "it") if count == 1 else ("are", "them", "them")


def held(server: Server) -> List[Any]:
    """What the server's tree holds, as the role names GPUs: an index, or the MIG UUIDs it holds on a GPU in MIG
    mode."""
    mig = server.get("mig") or {}
    refs: List[Any] = []
    for index in server.get("gpus") or []:
        refs += mig.get(str(index)) or [index]
    return refs


def _covered(ref: Any, resolved: Sequence[Any], gpus: GpuTable) -> bool:
    """Whether GPU reference `ref` (an index or a MIG UUID) is one of the instance's: the same GPU or MIG instance,
    or a MIG instance of a whole GPU of the instance."""
    if any(str(ref) == str(mine) for mine in resolved):
        return True
    if not (gpus.known and gpus.known_entry(ref)) or str(ref) not in gpus.migs:
        return False
    return any(
        str(mine) not in gpus.migs and gpus.known_entry(mine) and gpus.parent(mine) == gpus.parent(ref)
        for mine in resolved
    )


def in_the_way(
    instance: Mapping[str, Any], resolved: Optional[Sequence[Any]], host: Mapping[str, Any], gpus: GpuTable
) -> List[Server]:
    """The servers no deployed instance has a record of that listen on the instance's port or hold its GPUs."""
    port = number_or_none(instance.get("port"), True)
    found = []
    for server in host.get("servers") or []:
        if server.get("recorded_by"):
            continue
        theirs = held(server)
        on_gpus = resolved is not None and bool(theirs) and gpus.overlap(list(resolved), theirs)
        if port in _port_of(server) or on_gpus:
            found.append(server)
    return found


def describe(server: Server) -> str:
    """PID, port, what the server serves (from its command line) and its GPUs, in one line."""
    served = server.get("served_model_name")
    model = server.get("model") or "an unknown model"
    what = model if not served or served == model else "%s as %s" % (model, served)
    return "PID %s %s%s, serving %s (tensor parallel %s, data parallel %s) on %s" % (
        server["pid"],
        "on port %s" % _join(_port_of(server))
        if _port_of(server)
        else "in a network namespace of its own"
        if apart(server)
        else "on no TCP port known",
        " (still starting: not listening yet)" if starting(server) else "",
        what,
        server.get("tensor_parallel_size", 1),
        server.get("data_parallel_size", 1),
        gpus_words(held(server)) if held(server) else "no GPU",
    )


def _why(server: Server, instance: Mapping[str, Any], resolved: Optional[Sequence[Any]], gpus: GpuTable) -> str:
    port = number_or_none(instance.get("port"), True)
    if port in _port_of(server):
        return "%s its port %s" % ("is starting on" if starting(server) else "listens on", port)
    shared = [ref for ref in held(server) if resolved is not None and gpus.overlap(list(resolved), [ref])]
    return "holds its %s" % gpus_words(shared)


def service_unit(server: Server) -> Optional[str]:
    """The system manager's service that runs the server (its cgroup's unit), or None: a login session's scope, a
    user's manager (user@UID.service, where a desktop terminal's commands run) and no unit are not services."""
    unit = str(server.get("systemd_unit") or "")
    return unit if unit.endswith(".service") and not unit.startswith("user@") else None


def opted_in(instance: Mapping[str, Any], settings: Mapping[str, Any]) -> bool:
    """The instance's adopt_unmanaged, else vllm_server_adopt_unmanaged (false when neither is set)."""
    value = instance.get("adopt_unmanaged")
    if value in (None, ""):
        value = settings.get("adopt_unmanaged")
    return boolean(value, strict=False) if value not in (None, "") else False


def replaced(server: Server) -> Dict[str, Any]:
    """What the role keeps of a server it replaces: to drain and stop it, and to name it in the report."""
    keys = ("pid", "start_ticks", "command", "cwd", "log_file", "cuda_visible_devices", "model", "served_model_name")
    entry = {key: server.get(key) for key in keys}
    address, port = (server.get("listen") or [[server.get("host"), server.get("port")]])[0]
    entry.update(
        port=int(port),
        ports=_port_of(server),
        url=local_url(address, port),
        gpus=held(server),
        starting=starting(server),
    )
    return entry


def findings(
    instance: Mapping[str, Any],
    resolved: Optional[Sequence[Any]],
    host: Mapping[str, Any],
    gpus: GpuTable,
    settings: Mapping[str, Any],
) -> Tuple[List[str], List[Dict[str, Any]]]:
    """(problems, servers to replace) of an instance: each server in its way refuses it, unless the instance opted in
    and the server's GPUs are all the instance's."""
    problems: List[str] = []
    replaces: List[Dict[str, Any]] = []
    if settings.get("render"):  # files only: no server is stopped or started
        return problems, replaces
    adopt = opted_in(instance, settings)
    for server in in_the_way(instance, resolved, host, gpus):
        what = "a vLLM server that this role did not start %s: %s" % (
            _why(server, instance, resolved, gpus),
            describe(server),
        )
        others = [ref for ref in held(server) if not _covered(ref, resolved or [], gpus)]
        unit = service_unit(server)
        if unit:
            problems.append(
                "%s. It runs in the systemd unit %s, which may start it again after its stop, so it is not replaced "
                "even with vllm_server_adopt_unmanaged: stop the unit first (systemctl stop %s)" % (what, unit, unit)
            )
        elif apart(server):
            problems.append(
                "%s. It runs in a network namespace of its own (a container's): this host cannot drain it, so it is "
                "not replaced even with vllm_server_adopt_unmanaged: stop its container, or it (kill -TERM %s)"
                % (what, server["pid"])
            )
        elif not _port_of(server):
            problems.append(
                "%s. Its command line names no TCP port to drain it through (--uds, --headless, --api-server-count 0, "
                "or a port set in its --config file), so it is not replaced even with vllm_server_adopt_unmanaged: "
                "stop it by hand (kill -TERM %s)" % (what, server["pid"])
            )
        elif others:
            problems.append(
                "%s. It also holds %s, which %s not this instance's: replacing it would take %s from under "
                "whatever uses %s next, so it is refused even with vllm_server_adopt_unmanaged. Stop it by hand "
                "(kill -TERM %s), or give the instance all of its GPUs"
                % ((what, gpus_words(others)) + _it(len(others)) + (server["pid"],))
            )
        elif not adopt:
            problems.append(
                "%s. Nothing was signalled. To drain it and replace it with this instance, run again with %s; or "
                "stop it by hand: kill -TERM %s" % (what, OPT_IN, server["pid"])
            )
        else:
            replaces.append(replaced(server))
    return problems, replaces


def port_taken_by(instance: Mapping[str, Any], host: Mapping[str, Any]) -> bool:
    """Whether a vLLM server that this role did not start listens on the instance's port (findings words it)."""
    port = number_or_none(instance.get("port"), True)
    return any(not server.get("recorded_by") and port in ports(server) for server in host.get("servers") or [])
