# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/plugin_utils/_vllm_checks.py: the vllm_server role's checks before anything is stopped."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_checks as f

SETTINGS = {
    "service_manager": "detached",
    "vllm_executable": "/usr/local/bin/vllm",
    "stop_timeout": 60,
    "min_acceptance_rate": 0.1,
    "unit_prefix": "vllm-",
    "state_dir": "/var/lib/vllm",
}
SECRET = "sk-never-shown-4711"


def gpu(index, error=None, mig=None):
    entry = {"index": index, "uuid": "GPU-%d" % index, "mig_mode": None, "error": error}
    if mig:
        entry["mig_mode"] = {"current": True, "pending": True}
        entry["mig_devices"] = [{"uuid": uuid} for uuid in mig]
    return entry


def nvidia(count=4, holders=(), special=None):
    gpus = [(special or {}).get(index) or gpu(index) for index in range(count)]
    return {"driver": {"available": True}, "gpus": gpus, "holders": list(holders)}


def check(instances, host=None, **settings):
    host = dict({"name": "gpu07", "nvidia": nvidia(), "systemd": True, "deployed": {}}, **(host or {}))
    return f.vllm_server_check(instances, host, dict(SETTINGS, **settings))


def one(name="a", port=8000, gpus=(0, 1), **extra):
    return dict(
        {"name": name, "model": "/m", "port": port, "gpus": gpus if isinstance(gpus, str) else list(gpus)}, **extra
    )


def problems(*instances, **kwargs):
    return check(list(instances), **kwargs)["problems"]


def test_a_good_instance_passes_and_its_gpus_resolve():
    result = check([one(gpus=["GPU-2", 3])])
    assert result == {"problems": [], "gpus": {"a": [2, 3]}}


@pytest.mark.parametrize(
    "port, words",
    [
        (0, "port 0 is out of range"),
        (70000, "port 70000 is out of range"),
        (-1, "port -1 is out of range"),
        ("x", "port 'x' is not a TCP port number"),
        (True, "is not a TCP port number"),
        (None, "port is not set"),
    ],
)
def test_ports_out_of_range_are_refused_as_such(port, words):
    (found,) = problems(one(port=port))
    assert found.startswith("instance a: ") and words in found and "already used" not in found, found


def test_gpus_twice_and_gpus_as_text():
    (found,) = problems(one(gpus=[0, 0, 1, 1]))
    assert "gpus 0, 0, 1, 1: GPU 0, 1 is listed more than once" in found, found
    (found,) = problems(one(gpus=[1, "GPU-1"]))
    assert "GPU 1 is listed more than once (by index or UUID)" in found, found
    (found,) = problems(one(gpus="0,1,2,3"))
    assert (
        found
        == "instance a: gpus must be a list of GPU indices or UUIDs, not the text '0,1,2,3': write gpus: [0, 1, 2, 3]"
    )


@pytest.mark.parametrize("value, refused", [(-5, True), (0, True), ("lots", True), (-1, False), (32768, False)])
def test_max_model_len(value, refused):
    found = problems(one(max_model_len=value))
    assert bool(found) == refused and (not found or "max_model_len %s must be" % value in found[0]), found


@pytest.mark.parametrize(
    "args, flag, use",
    [
        (["--port", "9000"], "--port", "use port"),
        (["--port=9000"], "--port", "use port"),
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size", "use tensor_parallel_size"),
        (["--tensor_parallel_size=2"], "--tensor-parallel-size", "use tensor_parallel_size"),
        (["-tp", "2"], "-tp", "use tensor_parallel_size"),
        (["-tp2"], "-tp", "use tensor_parallel_size"),
        (["--host", "::"], "--host", "use host"),
        (["--served-model-name", "x"], "--served-model-name", "use served_model_name"),
        (["--tensor-parallel", "2"], "--tensor-parallel (--tensor-parallel-size)", "use tensor_parallel_size"),
        (["--speculative-config.method", "ngram"], "--speculative-config", "use speculative_config"),
        (["--max-model-len=4k"], "--max-model-len", "use max_model_len"),
        (["--gpu-memory-utilization", "0.5"], "--gpu-memory-utilization", "use gpu_memory_utilization"),
        (["--shutdown-timeout=30"], "--shutdown-timeout", "use shutdown_timeout"),
        (["--model", "/other"], "--model", "use model"),
        (["-pp", "2"], "-pp", "use gpus"),
    ],
)
def test_flags_the_role_owns_are_refused_in_both_forms(args, flag, use):
    (found,) = problems(one(extra_args=["--enforce-eager"] + args))
    assert "extra_args has %s, which the role sets itself: %s" % (flag, use) in found, found


@pytest.mark.parametrize(
    "args",
    [
        ["--api-key", SECRET],
        ["--api-key=" + SECRET],
        ["--api_key", SECRET],
        ["--hf-token", SECRET],
        ["--hf-token=" + SECRET],
    ],
)
def test_secrets_are_refused_and_never_quoted(args):
    (found,) = problems(one(extra_args=args))
    assert SECRET not in found and "with a secret" in found, found
    assert ("api_key" in found and "VLLM_API_KEY" in found) or "hf auth login" in found, found


def test_a_bare_hf_token_and_other_flags_pass():
    assert (
        problems(one(extra_args=["--hf-token", "--enforce-eager", "--max-num-seqs=8", "--kv-cache-dtype", "fp8"])) == []
    )


def test_disable_log_stats_only_with_the_gate():
    spec = {"method": "ngram"}
    (found,) = problems(one(extra_args=["--disable-log-stats"], speculative_config=spec))
    assert "extra_args has --disable-log-stats" in found
    assert problems(one(extra_args=["--disable-log-stats"], speculative_config=spec, min_acceptance_rate=0)) == []


def test_systemd_without_systemd_is_refused():
    (found,) = problems(one(), host={"systemd": False}, service_manager="systemd")
    assert found.startswith("vllm_server_service_manager is systemd, but gpu07 does not run systemd"), found
    assert problems(one(), host={"systemd": False}, service_manager="auto") == []
    # The render entry point writes files only (staging an image, systemd-analyze verify).
    assert problems(one(), host={"systemd": False}, service_manager="systemd", render=True) == []


def test_a_lost_gpu_is_refused():
    host = {"nvidia": nvidia(special={1: gpu(1, error="GPU is lost")})}
    (found,) = problems(one(gpus=[0, 1]), host=host)
    assert "GPU 1 answers NVML with an error (GPU is lost)" in found, found
    assert problems(one(gpus=[2, 3]), host=host) == []
    assert problems(one(gpus=[0, 1]), host=host, render=True) == []


def test_legacy_messages_keep_their_words():
    host = {"nvidia": nvidia(count=2, special={0: gpu(0, mig=["MIG-a", "MIG-b"])})}
    found = problems(one("a", 1, ["MIG-a"]), one("whole", 2, [0]), one("two", 3, ["MIG-b", 1]), host=host)
    assert found[0] == "instance a: GPUs ['0'] are also used by another instance", found
    assert (
        found[1].startswith("instance whole: GPUs ['MIG-a', 'MIG-b'] are also used by another instance; ")
        or "GPU 0 is in MIG mode" in found[1]
    ), found
    assert "a MIG instance must be the only GPU of a vLLM instance" in found[2], found
    (found,) = problems(one(gpus=[8]))
    assert found == "instance a: gpus 8: no such GPU on this host (its GPUs: indices 0, 1, 2, 3, or their UUIDs)"
    (found,) = problems(one(gpus=["GPU-x"]), host={"nvidia": {"driver": {"available": False}}})
    assert found == "instance a: gpus GPU-x: GPU UUIDs need the NVIDIA driver library, which did not answer"
    assert check([one(gpus=[0, "1"])], host={"nvidia": {"driver": {"available": False}}})["gpus"] == {"a": [0, 1]}


def holder(pid, gpus, port=None, unit=None):
    agent = {"kind": "vllm", "cmdline": "/venv/bin/python /venv/bin/vllm serve /m --port %d" % port} if port else None
    return {"pid": pid, "gpus": gpus, "owner": {"systemd_unit": unit, "agent": agent}}


def test_gpus_held_by_another_instance_of_the_role():
    deployed = {"old": {"name": "old", "port": 8100, "gpus": [0, 1]}}
    held = {
        "deployed": deployed,
        "nvidia": nvidia(holders=[holder(41, [0], 8100), holder(42, [1], 8100), holder(50, [3])]),
    }
    (found,) = problems(one("new", 8000, [1, 2]), host=held)
    assert "instance new: GPU 1 is held by instance old (deployed by this role on GPUs 0, 1, PID 42)" in found, found
    assert "not in vllm_server_instances: stop it first" in found, found
    # Listed after: it would still be there; listed before: it has moved by then.
    (found,) = problems(one("new", 8000, [1, 2]), one("old", 8100, [3]), host=held)
    assert "it is listed after new: list it first" in found, found
    assert problems(one("old", 8100, [3]), one("new", 8000, [1, 2]), host=held) == []
    # Not running (no holder of its own), or on other GPUs: nothing to refuse.
    idle = dict(held, nvidia=nvidia(holders=[holder(50, [1])]))
    assert problems(one("new", 8000, [1, 2]), host=idle) == []
    assert problems(one("new", 8000, [2, 3]), host=held) == []
    # A deployed configuration on a GPU the host no longer has is compared as written.
    gone = dict(held, deployed={"old": {"name": "old", "port": 8100, "gpus": [7]}})
    assert problems(one("new", 8000, [1, 2]), host=gone) == []
    # A systemd unit of the role.
    unit = dict(held, nvidia=nvidia(holders=[holder(43, [0], unit="vllm-old.service")]))
    assert (
        "GPU 0 is held by instance old (deployed by this role on GPUs 0, 1, PID 43)"
        in problems(one("new", 8000, [0]), host=unit)[0]
    )


def test_data_parallel_size_times_tensor_parallel_size_must_be_the_gpu_count():
    plugin = f
    assert plugin.number_problems({"gpus": [0, 1], "data_parallel_size": 2}, {}) == []
    assert plugin.number_problems({"gpus": [0, 1, 2, 3], "tensor_parallel_size": 2, "data_parallel_size": 2}, {}) == []
    assert plugin.number_problems({"gpus": [0, 1, 2, 3], "tensor_parallel_size": 2}, {}) == [
        "tensor_parallel_size 2 does not match the 4 GPUs [0, 1, 2, 3]"
    ]
    assert plugin.number_problems({"gpus": [0, 1, 2], "data_parallel_size": 2}, {}) == [
        "data_parallel_size 2 does not divide the 3 GPUs [0, 1, 2]"
    ]
    assert plugin.number_problems({"gpus": [0, 1], "data_parallel_size": 0}, {})[0].startswith(
        "data_parallel_size 0 is not"
    )


@pytest.mark.parametrize("key", ['"quoted-key"', "abc\nLD_PRELOAD=/tmp/evil.so", "two words", "a=b", 42])
def test_an_api_key_that_the_environment_file_would_change_is_refused(key):
    found = check([one(api_key=key)])["problems"]
    assert len(found) == 1 and "api_key must be a bearer token" in found[0], found
    assert str(key) not in found[0]


def test_a_bearer_token_api_key_passes():
    assert check([one(api_key="sk-test_4f1c.9b2e~x+y/z==")])["problems"] == []


def test_the_role_numbers_are_refused_before_anything_stops():
    numbers = {"gpu_max_used_mib": -5, "ready_poll_interval": 0, "drain_timeout": "nan", "log_lines": 30}
    assert check([one()], numbers=numbers)["problems"] == [
        "invalid value: vllm_server_drain_timeout=nan (must be a finite number); vllm_server_gpu_max_used_mib=-5 "
        "(must not be negative); vllm_server_ready_poll_interval=0 (must be greater than 0)"
    ]
    assert check([one()], numbers={"kill_wait": "soon"})["problems"] == [
        "vllm_server_kill_wait must be a number, not 'soon'"
    ]
    assert check([one()], numbers={"log_lines": 2.5})["problems"] == [
        "vllm_server_log_lines must be a whole number, not 2.5"
    ]
    assert (
        check([one()], numbers={"gpu_max_used_mib": "256", "ready_poll_interval": 5, "stop_timeout": 0})["problems"]
        == []
    )


# Issue 33 item 8: a control character in any value that reaches the systemd unit, a file or the command line.
INJECTED = "x\nExecStartPre=/bin/touch /tmp/PWN"


@pytest.mark.parametrize(
    "extra, variable",
    [
        ({"environment": {"FOO": INJECTED}}, "environment.FOO"),
        ({"environment": {"FOO\nBAR": "1"}}, "environment key 'FOO\\nBAR'"),
        ({"extra_args": ["--enforce-eager", "--max-num-seqs=8\nExecStartPre=/bin/true"]}, "extra_args[1]"),
        ({"model": "/m\n"}, "model"),
        ({"served_model_name": "qwen\rX"}, "served_model_name"),
        ({"host": "127.0.0.1\x00"}, "host"),
        ({"vllm_executable": "/usr/bin/vllm\t"}, "vllm_executable"),
        ({"max_model_len": "32768\n"}, "max_model_len"),
        ({"speculative_config": {"method": "dflash", "model": "/d\x1b[2J"}}, "speculative_config.model"),
        ({"drafter_config": "/d/config.json\u2028"}, "drafter_config"),
        ({"environment": {"FOO": "a\x7fb"}}, "environment.FOO"),
        ({"environment": {"FOO": "a\x85b"}}, "environment.FOO"),
        # Numbers given as text: int() and float() would strip the newline, the check does not rely on it.
        ({"port": "8000\n"}, "port"),
        ({"gpus": [0, "1\n"]}, "gpus[1]"),
        ({"tensor_parallel_size": "2\n"}, "tensor_parallel_size"),
        ({"data_parallel_size": "1\n"}, "data_parallel_size"),
        ({"gpu_memory_utilization": "0.9\n"}, "gpu_memory_utilization"),
        ({"shutdown_timeout": "5\n"}, "shutdown_timeout"),
        ({"ready_timeout": "60\n"}, "ready_timeout"),
        ({"drain_timeout": "60\n"}, "drain_timeout"),
        ({"min_acceptance_rate": "0.1\n"}, "min_acceptance_rate"),
        ({"target_num_layers": "64\n"}, "target_num_layers"),
    ],
)
def test_a_control_character_in_an_instance_value_is_refused_by_its_name(extra, variable):
    found = [line for line in problems(one(**extra)) if "control character" in line]
    assert len(found) == 1 and found[0].startswith("instance a: %s has a control character (U+" % variable), found
    assert "ExecStartPre" not in found[0] and "PWN" not in found[0], found  # the value itself is never shown


@pytest.mark.parametrize(
    "setting", ["user", "config_dir", "state_dir", "log_dir", "systemd_dir", "unit_prefix", "vllm_executable"]
)
def test_a_control_character_in_a_role_variable_is_refused_by_its_name(setting):
    found = [
        line for line in check([one()], **{setting: "/x\nExecStartPre=/bin/true"})["problems"] if "control" in line
    ]
    assert len(found) == 1 and found[0].startswith("vllm_server_%s has a control character (U+000A" % setting), found


def test_values_without_control_characters_pass():
    assert problems(one(environment={"A": "x y = z; $HOME %n \"q\""}, extra_args=["--max-num-seqs", "8"])) == []


# Issue 33 item 12: vLLM 0.33 runs headless (no API server) when --api-server-count is below 1
# (vllm/entrypoints/cli/serve.py); --config FILE holds flags the role cannot see.
@pytest.mark.parametrize(
    "args",
    [
        ["--api-server-count", "0"],
        ["--api-server-count", "-1"],
        ["--api-server-count=0"],
        ["--api_server_count", "0"],
        ["-asc", "0"],
        ["-asc=0"],
        ["-asc0"],
        ["--api-server-co", "0"],
        ["--api-server-count", "two"],
        ["--api-server-count"],
    ],
)
def test_an_api_server_count_below_one_is_refused_as_headless(args):
    (found,) = problems(one(extra_args=["--enforce-eager"] + args))
    written = "-asc" if args[0] == "-asc0" else args[0].split("=")[0]
    assert "extra_args has %s" % written in found and "--api-server-count" in found, found
    assert "a whole number of 1 or more" in found and "headless" in found, found


@pytest.mark.parametrize("args", [["--api-server-count", "2"], ["-asc", "4"], ["--api-server-count=1"], ["-asc3"]])
def test_an_api_server_count_of_one_or_more_passes(args):
    assert problems(one(extra_args=args)) == []


@pytest.mark.parametrize("args", [["--config", "/etc/vllm/serve.yaml"], ["--config=/etc/vllm/serve.yaml"]])
def test_a_config_file_in_extra_args_is_refused(args):
    (found,) = problems(one(extra_args=args))
    assert "extra_args has --config" in found and "put its settings in extra_args" in found, found
