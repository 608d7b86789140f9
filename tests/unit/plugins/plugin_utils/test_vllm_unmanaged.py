# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM servers the vllm_server role did not start (issue 46): refused by name without the opt-in, replaced with it,
refused either way when they hold GPUs beyond the instance's; then what the report says of them."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_plan as p
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_report as r
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_run as run
from test_vllm_plan import SETTINGS, host, instance

COMMAND = "/opt/vllm/bin/python3 /opt/vllm/bin/vllm serve /models/Qwen3.6-27B --port 8000 --tensor-parallel-size 2"


def server(pid=4242, port=8000, gpus=(0, 1), **extra):
    """A server as vllm_server_host reads it (_vllm_servers.find_servers plus recorded_by)."""
    return dict(
        {
            "pid": pid,
            "start_ticks": 7000,
            "sid": 1,
            "listen": [["0.0.0.0", port]],
            "model": "/models/Qwen3.6-27B",
            "served_model_name": "qwen",
            "tensor_parallel_size": len(gpus),
            "data_parallel_size": 1,
            "gpus": list(gpus),
            "mig": {},
            "command": COMMAND,
            "cwd": "/home/op",
            "log_file": "/home/op/vllm.log",
            "cuda_visible_devices": "0,1",
            "recorded_by": None,
        },
        **extra,
    )


def plan(servers, settings=None, **extra):
    return p.plan([instance(**extra)], host(servers=servers), settings or SETTINGS)


ADOPT = dict(SETTINGS, adopt_unmanaged=True)


def test_without_the_opt_in_each_server_is_refused_by_name_with_the_two_ways_on():
    planned = plan([server(), server(pid=4300, port=9001, gpus=[1], served_model_name="/models/Qwen3.6-27B")])
    assert planned["instances"] == {}
    (problem,) = planned["problems"]
    assert problem.startswith(
        "instance a: a vLLM server that this role did not start listens on its port 8000: PID 4242 on port 8000, "
        "serving /models/Qwen3.6-27B as qwen (tensor parallel 2, data parallel 1) on GPUs 0, 1. Nothing was signalled. "
        "To drain it and replace it with this instance, run again with -e vllm_server_adopt_unmanaged=true (or "
        "adopt_unmanaged: true on the instance); or stop it by hand: kill -TERM 4242; "
        "a vLLM server that this role did not start holds its GPU 1: PID 4300 on port 9001, serving "
        "/models/Qwen3.6-27B (tensor parallel 1, data parallel 1) on GPU 1. Nothing was signalled."
    ), problem
    assert problem.endswith("kill -TERM 4300")


def test_the_generic_port_message_gives_way_to_the_server_named():
    planned = p.plan([instance()], host(servers=[server()], ports={"a": "it answers /health"}), SETTINGS)
    assert "not this instance (it answers /health)" not in planned["problems"][0]
    assert "PID 4242 on port 8000" in planned["problems"][0]


@pytest.mark.parametrize("opt_in", [True, "true", "yes", 1])
def test_with_the_opt_in_it_is_replaced(opt_in):
    planned = plan([server()], dict(SETTINGS, adopt_unmanaged=opt_in))
    assert planned["problems"] == []
    entry = planned["instances"]["a"]
    # Not "not running": the instance was never deployed, and the server it replaces runs.
    assert entry["reasons"] == ["configuration changed", "vLLM server PID 4242 not started by this role"]
    assert entry["replaces"] == [
        {
            "pid": 4242,
            "start_ticks": 7000,
            "command": COMMAND,
            "cwd": "/home/op",
            "log_file": "/home/op/vllm.log",
            "cuda_visible_devices": "0,1",
            "model": "/models/Qwen3.6-27B",
            "served_model_name": "qwen",
            "port": 8000,
            "ports": [8000],
            "url": "http://127.0.0.1:8000",
            "gpus": [0, 1],
            "starting": False,
        }
    ]


def loading(pid=4242, port=8000, gpus=(0, 1), **extra):
    """A server still loading its model: its command line names its port, vLLM does not listen on it yet."""
    return dict(server(pid, port, gpus, **extra), listen=[], host="127.0.0.1", port=port)


def test_a_server_still_loading_is_refused_as_one_that_listens():
    planned = plan([loading(), loading(pid=4300, port=9001, gpus=[1])])
    assert planned["instances"] == {}
    (problem,) = planned["problems"]
    assert problem.startswith(
        "instance a: a vLLM server that this role did not start is starting on its port 8000: PID 4242 on port 8000 "
        "(still starting: not listening yet), serving /models/Qwen3.6-27B as qwen (tensor parallel 2, data parallel 1) "
        "on GPUs 0, 1. Nothing was signalled. To drain it and replace it with this instance, run again with "
        "-e vllm_server_adopt_unmanaged=true (or adopt_unmanaged: true on the instance); or stop it by hand: "
        "kill -TERM 4242; a vLLM server that this role did not start holds its GPU 1: PID 4300 on port 9001 (still "
        "starting: not listening yet), serving"
    ), problem
    # Its port alone: the API server binds it before EngineCore and the workers take a GPU.
    assert "is starting on its port 8000: PID 4242" in plan([loading(gpus=[])])["problems"][0]
    assert plan([loading(port=9001, gpus=[])])["problems"] == []  # another port, no GPU: not in the way


def test_a_server_still_loading_is_stopped_and_replaced_with_the_opt_in():
    entry = plan([loading()], ADOPT)["instances"]["a"]
    assert entry["reasons"] == [
        "configuration changed",
        "vLLM server PID 4242 not started by this role (still starting)",
    ]
    (replaced,) = entry["replaces"]
    # vllm_drain finds nothing listening at its URL (connection refused: nothing to drain) and goes on to SIGTERM.
    assert (replaced["url"], replaced["port"], replaced["ports"], replaced["starting"]) == (
        "http://127.0.0.1:8000",
        8000,
        [8000],
        True,
    )
    e = r.entry(entry, {"reasons": entry["reasons"], "check_mode": True})
    assert (
        "  would stop and replace the vLLM server PID 4242 on port 8000 that this role did not start (still starting: "
        "not listening yet): " + COMMAND
    ) in r.summary_lines([e], ["a"])
    nothing = dict(DRAIN, drained=True, reachable=False, running_at_start=None, stop=dict(STOP, stop_s=5.2))
    e = r.entry(
        entry, {"reasons": entry["reasons"], "replaced": {"results": [nothing]}, "ready": {"healthy_after_s": 2}}
    )
    lines = r.summary_lines([e], ["a"])
    assert lines[2:4] == [
        "  stopped and replaced the vLLM server PID 4242 on port 8000 that this role did not start (still starting: "
        "not listening yet): " + COMMAND,
        "    SIGTERM to its API server: its tree exited after 5.2 s",
    ], lines
    assert lines[-1].endswith("(it was not running before)"), lines  # it served nothing yet


def test_a_server_with_no_tcp_port_is_refused_even_with_the_opt_in():
    (problem,) = plan([loading(port=None)], ADOPT)["problems"]
    assert problem.startswith(
        "instance a: a vLLM server that this role did not start holds its GPUs 0, 1: PID 4242 on no TCP port known, "
    )
    assert problem.endswith(
        "Its command line names no TCP port to drain it through (--uds, --headless, --api-server-count 0, or a port "
        "set in its --config file), so it is not replaced even with vllm_server_adopt_unmanaged: stop it by hand "
        "(kill -TERM 4242)"
    )


def test_a_server_in_a_network_namespace_of_its_own_is_in_the_way_by_its_gpus_only():
    """A container on a bridge network serving on its own port 8000 (not the host's): not "starting", not on the
    instance's port 8000; on the instance's GPUs it is refused, even with the opt-in (the host cannot drain it)."""
    apart = loading(port=8000, gpus=[3], own_network=False)
    assert plan([apart])["problems"] == [] and plan([apart], ADOPT)["problems"] == []
    (problem,) = plan([dict(apart, gpus=[1])], ADOPT)["problems"]
    assert problem.startswith(
        "instance a: a vLLM server that this role did not start holds its GPU 1: PID 4242 in a network namespace of "
        "its own, serving "
    ), problem
    assert "still starting" not in problem and problem.endswith(
        "It runs in a network namespace of its own (a container's): this host cannot drain it, so it is not replaced "
        "even with vllm_server_adopt_unmanaged: stop its container, or it (kill -TERM 4242)"
    ), problem


def test_the_instance_key_overrides_the_role_variable():
    assert plan([server()], ADOPT, adopt_unmanaged=False)["problems"]
    assert plan([server()], dict(SETTINGS, adopt_unmanaged=False), adopt_unmanaged=True)["problems"] == []


def test_gpus_beyond_the_instances_are_refused_even_with_the_opt_in():
    (problem,) = plan([server(port=9001, gpus=[1, 2, 3])], ADOPT)["problems"]
    assert problem.startswith(
        "instance a: a vLLM server that this role did not start holds its GPU 1: PID 4242 on port 9001"
    )
    assert (
        "It also holds GPUs 2, 3, which are not this instance's: replacing it would take them from under whatever "
        "uses them next, so it is refused even with vllm_server_adopt_unmanaged. Stop it by hand (kill -TERM 4242)"
    ) in problem


def test_servers_out_of_the_way_or_of_the_role_are_left_alone():
    others = [
        server(port=9001, gpus=[2, 3]),  # another port, other GPUs
        server(pid=10, recorded_by="a"),  # the instance's own server
        server(pid=11, port=9002, gpus=[0], recorded_by="b"),  # another deployed instance's (held_problems' business)
        server(pid=12, port=9003, gpus=[]),  # loading or CPU-only, on another port
    ]
    planned = plan(others)
    assert planned["problems"] == [] and planned["instances"]["a"]["replaces"] == []
    assert planned["instances"]["a"]["reasons"] == ["configuration changed", "not running"]


def test_mig_instances_are_the_instances_gpus_only_when_they_are_its_own():
    gpus = [
        {"index": 0, "uuid": "GPU-0", "mig_mode": {"current": 1}, "mig_devices": [{"uuid": "MIG-a"}, {"uuid": "MIG-b"}]}
    ]
    found = host(nvidia={"driver": {"available": True}, "gpus": gpus, "holders": []})
    on_mig = server(gpus=[0], mig={"0": ["MIG-a"]}, port=9001)
    found["servers"] = [on_mig]
    assert p.plan([instance(gpus=["MIG-a"])], found, ADOPT)["instances"]["a"]["replaces"][0]["gpus"] == ["MIG-a"]
    assert p.plan([instance(gpus=["MIG-b"])], found, ADOPT)["instances"]["a"]["replaces"] == []
    found["servers"] = [server(gpus=[0], mig={"0": ["MIG-a", "MIG-b"]}, port=9001)]
    (problem,) = p.plan([instance(gpus=["MIG-a"])], found, ADOPT)["problems"]
    assert "It also holds GPU MIG-b, which is not this instance's" in problem


def test_render_looks_at_no_server():
    assert plan([server()], dict(SETTINGS, render=True))["problems"] == []


def _entry(results, **planned_extra):
    planned = dict(plan([server()], ADOPT)["instances"]["a"], **planned_extra)
    return r.entry(planned, dict({"reasons": planned["reasons"]}, **results))


STOP = {"signalled": True, "pid": 4242, "exited": True, "stop_s": 1.4, "left": [], "killed": []}
DRAIN = {
    "drained": True,
    "drain_s": 0.2,
    "running": 0,
    "waiting": 0,
    "running_at_start": 2,
    "metrics": True,
    "reachable": True,
    "stop": STOP,
    "item": {"pid": 4242},
}


def test_check_mode_says_would_drain_and_replace():
    e = _entry({"check_mode": True})
    assert e["action"] == "would redeploy"
    assert (
        "  would drain and replace the vLLM server PID 4242 on port 8000 that this role did not start: " + COMMAND
        in (r.summary_lines([e], ["a"]))
    )


def test_a_replaced_server_is_named_with_its_drain_and_stop():
    killed = dict(DRAIN, stop=dict(STOP, killed=[{"pid": 4250, "comm": "VLLM::Worker_TP"}]))
    e = _entry({"replaced": {"results": [killed]}, "ready": {"healthy_after_s": 2.0}})
    lines = r.summary_lines([e], ["a"])
    assert lines[0].endswith("redeployed (configuration changed, vLLM server PID 4242 not started by this role)")
    assert lines[-1] == "  healthy 2.0 s after start, down 0.0 s in all", lines  # it served before: not "not running"
    assert lines[2:5] == [
        "  drained and replaced the vLLM server PID 4242 on port 8000 that this role did not start: " + COMMAND,
        "    drained in 0.2 s: 0 request(s) running and 0 waiting at the stop (2 running at the start), server exited "
        "1.4 s after SIGTERM",
        "    SIGKILLed what was left of its tree after vllm_server_stop_timeout: 4250 VLLM::Worker_TP",
    ]


def test_a_failed_start_names_what_to_start_again():
    e = _entry(
        {
            "replaced": {"results": [DRAIN]},
            "failure": "Wait until the server is healthy: exited",
            "rollback": run.NOTHING_TO_GO_BACK_TO,
        }
    )
    text = r.failures([e], "gpu07")
    assert (
        "The vLLM server PID 4242 that this role did not start was stopped for this instance and is not started again "
        "(the role has no configuration of it). It ran in /home/op with output to /home/op/vllm.log: %s. To start it "
        "again: cd /home/op && CUDA_VISIBLE_DEVICES=0,1 nohup %s >> /home/op/vllm.log 2>&1 &." % (COMMAND, COMMAND)
    ) in text, text
    assert any(line.startswith("  the vLLM server PID 4242 that this role") for line in r.summary_lines([e], ["a"]))
    # Not signalled (the drain failed before its stop): it still runs, and nothing says to start it again.
    assert "not started again" not in r.failures(
        [_entry({"replaced": {"results": []}, "failure": "x", "rollback": "y"})], "h"
    )


def test_the_restore_hooks_run_after_a_replacement():
    planned = plan([server()], ADOPT)["instances"]["a"]
    assert not planned["running"]
    assert run.restores([{"name": "a", "reasons": ["x"], "action": "redeployed"}], planned, False)
    assert not run.restores(
        [{"name": "a", "reasons": ["x"], "action": "redeployed"}], dict(planned, replaces=[]), False
    )


def test_a_server_that_a_service_runs_is_not_replaced():
    (problem,) = plan([server(systemd_unit="vllm.service")], ADOPT)["problems"]
    assert problem.endswith(
        "It runs in the systemd unit vllm.service, which may start it again after its stop, so it is not replaced even "
        "with vllm_server_adopt_unmanaged: stop the unit first (systemctl stop vllm.service)"
    )
    for unit in ("session-3.scope", "user@1000.service", None):  # a login's scope, a desktop terminal's user manager
        assert plan([server(systemd_unit=unit)], ADOPT)["problems"] == [], unit


def test_the_restart_line_leaves_out_what_was_not_read():
    hint = r.restart_hint(
        {"command": "vllm serve /m", "cwd": None, "log_file": "pipe:[4711]", "cuda_visible_devices": None}
    )
    assert hint == "nohup vllm serve /m &"
    hint = r.restart_hint(
        {"command": "vllm serve /m", "cwd": "/home/a b", "log_file": "/x/v.log", "cuda_visible_devices": "2"}
    )
    assert hint == "cd '/home/a b' && CUDA_VISIBLE_DEVICES=2 nohup vllm serve /m >> /x/v.log 2>&1 &"
