# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/module_utils/vllm/_vllm_servers.py: vLLM API servers known by their process, listening or still loading,
on a /proc laid out as the kernel lays it out (stat, cmdline, exe, cwd, fd links, net/tcp)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_servers as s

PYTHON = "/opt/vllm/bin/python3.12"
# The API server a `nohup vllm serve` starts: the console script runs under its interpreter (a #! line).
SERVE = [PYTHON, "/opt/vllm/bin/vllm", "serve", "/models/q", "--port", "30000", "--tensor-parallel-size", "2"]
# /proc/net/tcp: 127.0.0.1:30000 (0x7530) listening, socket inode 5001; a connection (state 01) with inode 5002.
TCP = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5001 1 0 100 0 0 10 0\n"
    "   1: 0100007F:7530 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 5002 1 0 100 0 0 10 0\n"
)
# [::]:30001 (0x7531) listening, inode 6001.
TCP6 = (
    "  sl  local_address                         remote_address                        st tx_queue rx_queue tr "
    "tm->when retrnsmt   uid  timeout inode\n"
    "   0: 00000000000000000000000000000000:7531 00000000000000000000000000000000:0000 0A 00000000:00000000 "
    "00:00000000 00000000     0        0 6001 1 0 100 0 0 10 0\n"
)


class Proc:
    """A /proc directory: processes with their stat, cmdline, exe, cwd, environ, cgroup and fd links."""

    def __init__(self, root):
        self.root = root
        (root / "net").mkdir(parents=True)
        (root / "net" / "tcp").write_text(TCP)
        (root / "net" / "tcp6").write_text(TCP6)

    def add(self, pid, ppid, argv, exe=PYTHON, sockets=(), sid=None, ticks=None, stdout="/home/op/vllm.log"):
        d = self.root / str(pid)
        (d / "fd").mkdir(parents=True)
        fields = ["S", str(ppid), str(pid), str(sid or pid)] + ["0"] * 15 + [str(ticks or 1000 + pid), "0"]
        (d / "stat").write_text("%d (%s) %s\n" % (pid, os.path.basename(argv[0])[:15], " ".join(fields)))
        (d / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in argv) + b"\0")
        (d / "environ").write_bytes(b"VLLM_API_KEY=sk-secret\0CUDA_VISIBLE_DEVICES=0,1\0")
        (d / "cgroup").write_text("0::/user.slice/user-1000.slice/session-3.scope\n")
        os.symlink(exe, d / "exe")
        os.symlink("/home/op", d / "cwd")
        os.symlink(stdout, d / "fd" / "1")
        for number, inode in enumerate(sockets, 3):
            os.symlink("socket:[%s]" % inode, d / "fd" / str(number))


@pytest.fixture
def proc(tmp_path):
    return Proc(tmp_path / "proc")


SNAPSHOT = {"holders": [{"pid": 12, "gpus": [0], "mig": {}}, {"pid": 13, "gpus": [1], "mig": {}}]}


@pytest.mark.parametrize(
    "argv, args",
    [
        (SERVE, SERVE[3:]),
        (["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"], ["--model", "/m"]),
        (["python3", "-m", "vllm.entrypoints.cli.main", "serve", "/m"], ["/m"]),
        (["/opt/vllm/bin/vllm", "serve", "/m"], ["/m"]),  # as exec'd, before the kernel puts the interpreter first
        (["python3", "-m", "vllm.entrypoints.cli.main", "bench", "/m"], None),
        (["VLLM::EngineCore"], None),
        (["VLLM::APIServer_0"], None),  # a launcher's API server: a title, not vLLM's command line
        (["/usr/bin/python3", "/opt/tools/serve.py", "vllm", "serve"], None),  # vllm is an argument here
        (["/usr/bin/nginx", "-g", "daemon off;"], None),
    ],
)
def test_serve_args_know_vllms_entry_points(argv, args):
    assert s.serve_args(argv) == args


def test_described_reads_model_name_and_sizes_as_vllm_parses_them():
    assert s.described(["/models/q", "--served-model-name", "qwen", "alias", "-tp", "4", "--data_parallel_size=2"]) == {
        "model": "/models/q",
        "served_model_name": "qwen",
        "tensor_parallel_size": 4,
        "data_parallel_size": 2,
    }
    assert s.described(["--model=/models/q"]) == {
        "model": "/models/q",
        "served_model_name": "/models/q",
        "tensor_parallel_size": 1,
        "data_parallel_size": 1,
    }


def test_secrets_are_never_shown():
    shown = s.hide_secrets(["vllm", "serve", "/m", "--api-key", "sk-1", "--hf_token=hf-2", "--hf-token", "--port", "1"])
    assert shown == [
        "vllm",
        "serve",
        "/m",
        "--api-key",
        s.SECRET_SHOWN,
        "--hf_token=" + s.SECRET_SHOWN,
        "--hf-token",
        "--port",
        "1",
    ]


def test_listening_sockets_of_both_families(proc):
    assert s.listening_sockets(str(proc.root)) == {"5001": ["127.0.0.1", 30000], "6001": ["::", 30001]}


def test_a_server_started_by_hand_with_its_tree_gpus_log_and_directory(proc):
    proc.add(10, 1, SERVE + ["--api-key", "sk-secret"], sockets=["5001", "5002"])
    proc.add(11, 10, ["VLLM::EngineCore"])
    proc.add(12, 11, ["VLLM::Worker_TP0"])
    proc.add(13, 11, ["VLLM::Worker_TP1"])
    proc.add(20, 1, ["/usr/bin/python3", "-m", "http.server"], sockets=["6001"])  # listens, runs no vLLM
    proc.add(22, 1, ["/usr/local/bin/vllm-rs", "vllm", "serve", "/m"], exe="/usr/local/bin/vllm-rs", sockets=["6001"])
    (server,) = s.find_servers(SNAPSHOT, str(proc.root))
    assert server == {
        "pid": 10,
        "start_ticks": 1010,
        "sid": 10,
        "user": os.getuid(),
        "argv": SERVE + ["--api-key", s.SECRET_SHOWN],
        "command": " ".join(SERVE) + " --api-key '%s'" % s.SECRET_SHOWN,
        "cwd": "/home/op",
        "log_file": "/home/op/vllm.log",
        "cuda_visible_devices": "0,1",
        "listen": [["127.0.0.1", 30000]],
        "own_network": None,  # this fake /proc has no ns links
        "host": None,
        "port": 30000,
        "model": "/models/q",
        "served_model_name": "/models/q",
        "tensor_parallel_size": 2,
        "data_parallel_size": 1,
        "tree": [11, 12, 13],
        "holders": [12, 13],
        "gpus": [0, 1],
        "mig": {},
        "systemd_unit": "session-3.scope",  # a login session's scope: where a nohup'd server runs
        "container_id": None,
    }
    assert "sk-secret" not in repr(server)


def test_a_launcher_of_several_api_servers_is_one_server(proc):
    # vLLM 0.33 run_multi_api_server: the launcher binds the socket and its API servers listen on it too.
    proc.add(10, 1, SERVE + ["--api-server-count", "2"], sockets=["5001"])
    proc.add(11, 10, ["VLLM::APIServer_0"], sockets=["5001"])
    proc.add(14, 10, [PYTHON, "-m", "vllm.entrypoints.cli.main", "serve", "/m", "--port", "30000"], sockets=["5001"])
    proc.add(12, 10, ["VLLM::EngineCore"])
    (server,) = s.find_servers({"holders": [{"pid": 12, "gpus": [3], "mig": {}}]}, str(proc.root))
    assert (server["pid"], server["tree"], server["gpus"]) == (10, [11, 12, 14], [3])


@pytest.mark.parametrize(
    "args, address",
    [
        (["/m", "--port", "28657", "--host", "127.0.0.1"], ("127.0.0.1", 28657)),
        (["/m", "--port=28657"], (None, 28657)),
        (["--model", "/m"], (None, 8000)),  # FrontendArgs.port's default
        (["/m", "--uds", "/run/v.sock", "--port", "9000"], (None, None)),  # a unix socket: no TCP port
        (["/m", "--headless", "-dp", "2"], (None, None)),  # engines only: no API server
        (["/m", "--port", "$PORT"], (None, None)),
        # --api-server-count 0 runs headless (vllm/entrypoints/cli/serve.py cmd: api_server_count < 1).
        (["/m", "--api-server-count", "0"], (None, None)),
        (["/m", "-asc", "0", "--port", "9000"], (None, None)),
        (["/m", "--api-server-count=0"], (None, None)),
        (["/m", "--api-server-count", "-1"], (None, None)),
        (["/m", "--api-server-count", "2"], (None, 8000)),
        # A --config file may set the port (FlexibleArgumentParser._pull_args_from_config): not known without --port.
        (["--config", "/etc/vllm/b.yaml"], (None, None)),
        (["--config", "/etc/vllm/b.yaml", "--port", "9000"], (None, 9000)),
    ],
)
def test_the_address_a_command_line_binds(args, address):
    assert s.bound_address(args) == address


def test_a_server_still_loading_its_model_is_a_server(proc):
    # vLLM binds its port before it builds the engine and listens once the model is loaded: while the workers load
    # the weights on GPUs 0-1, the API server has no listening socket (a bound socket is not in /proc/net/tcp).
    loading = [PYTHON, "/opt/vllm/bin/vllm", "serve", "/models/q", "--host", "127.0.0.1", "--port", "28657", "-tp", "2"]
    proc.add(10, 1, loading)
    proc.add(11, 10, ["VLLM::EngineCore"])
    proc.add(12, 11, ["VLLM::Worker_TP0"])
    proc.add(13, 11, ["VLLM::Worker_TP1"])
    proc.add(14, 11, loading)  # a worker forked before setproctitle: vLLM's command line, its launcher stands for it
    proc.add(20, 1, [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"])  # no engine yet, no GPU
    proc.add(30, 1, ["/usr/bin/bash", "-c", "vllm serve /m"], exe="/usr/bin/bash")  # the shell that started one
    first, second = s.find_servers(SNAPSHOT, str(proc.root))
    assert (first["pid"], first["listen"], first["host"], first["port"]) == (10, [], "127.0.0.1", 28657)
    assert (first["tree"], first["holders"], first["gpus"]) == ([11, 12, 13, 14], [12, 13], [0, 1])
    assert (second["pid"], second["listen"], second["port"], second["gpus"]) == (20, [], 8000, [])
    # The role's own instance while it loads is its record, by its pidfile's session, as when it listens.
    assert s.recorded(first, {"b": {"pidfile": [10, 1010], "unit": "vllm-b.service"}}) == "b"
    assert s.recorded(first, {"b": {"pidfile": None, "unit": "vllm-b.service"}}) is None


def test_a_server_in_a_network_namespace_of_its_own_is_said_so(proc):
    # A container on a bridge network: its listening socket is in its own namespace's /proc/net/tcp, not in this one.
    proc.add(10, 1, [PYTHON, "/opt/vllm/bin/vllm", "serve", "/models/q"])
    proc.add(20, 1, [PYTHON, "/opt/vllm/bin/vllm", "serve", "/models/r", "--port", "9001"])
    os.makedirs(proc.root / "self" / "ns")
    os.symlink("net:[4026531840]", proc.root / "self" / "ns" / "net")
    for pid, namespace in ((10, "net:[4026532999]"), (20, "net:[4026531840]")):
        os.makedirs(proc.root / str(pid) / "ns")
        os.symlink(namespace, proc.root / str(pid) / "ns" / "net")
    apart, here = s.find_servers({"holders": []}, str(proc.root))
    assert (apart["pid"], apart["own_network"], here["pid"], here["own_network"]) == (10, False, 20, True)


def test_records_of_the_role():
    server = {"pid": 10, "start_ticks": 1010, "sid": 10, "systemd_unit": None}
    records = {"a": {"pidfile": [10, 1010], "unit": "vllm-a.service"}, "b": {"pidfile": None, "unit": "vllm-b.service"}}
    assert s.recorded(server, records) == "a"
    assert s.recorded(dict(server, start_ticks=999, sid=1), records) is None  # PID reused since the pidfile
    assert s.recorded(dict(server, pid=11, sid=10), records) == "a"  # in the session the role started
    assert s.recorded(dict(server, pid=30, systemd_unit="vllm-b.service", sid=1), records) == "b"
    assert s.recorded(dict(server, pid=30, systemd_unit="other.service", sid=1), records) is None


def test_a_server_in_the_container_of_a_deployed_instance_is_its_record():
    # vllm_server_host reads each deployed container's ID through its runtime (_vllm_host.read_containers).
    cid = "4f1c3a9e0b7d" * 5 + "0123"
    server = {"pid": 30, "start_ticks": 3030, "sid": 30, "systemd_unit": None, "container_id": cid}
    records = {"a": {"pidfile": None, "unit": "vllm-a.service", "container": cid}}
    assert s.recorded(server, records) == "a"
    assert s.recorded(dict(server, container_id="0" * 64), records) is None
    assert s.recorded(dict(server, container_id=None), {"a": dict(records["a"], container=None)}) is None
