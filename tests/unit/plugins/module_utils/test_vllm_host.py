# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/module_utils/vllm/_vllm_host.py: what the vllm_server role reads on a host, in one pass."""

from __future__ import annotations

import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _detached, _vllm_files, _vllm_host


class Inspector:
    def snapshot(self, tolerance_mib):
        return {
            "driver": {"available": True},
            "gpus": [],
            "holders": [],
            "scan_problems": [],
            "tolerance": tolerance_mib,
        }


class Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = json.dumps({"data": [{"id": "served-a"}]}).encode() if self.path == "/v1/models" else b"ok"
        self.send_response(200 if self.headers.get("Authorization") == "Bearer sk-a" else 401)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request(tmp_path, instances, **extra):
    return dict(
        {
            "instances": instances,
            "paths": [],
            "drafters": [],
            "config_dir": str(tmp_path / "etc"),
            "state_dir": str(tmp_path / "state"),
            "log_dir": str(tmp_path / "log"),
            "unit_prefix": "vllm-",
            "systemd_dir": str(tmp_path / "units"),
            "request_timeout": 2.0,
            "max_used_mib": 256,
        },
        **extra,
    )


def test_a_first_deployment(tmp_path):
    (tmp_path / "models").mkdir()
    free = closed_port()
    found = _vllm_host.read_host(
        request(
            tmp_path,
            [{"name": "a", "port": str(free)}],
            paths=[str(tmp_path / "models"), "/none"],
            drafters=[{"model": str(tmp_path / "models")}],
        ),
        Inspector(),
        lambda unit: {},
    )
    assert found["deployed"] == {} and found["running"] == {} and found["ports"] == {"a": None}
    assert found["paths"][str(tmp_path / "models")] == {"exists": True, "isdir": True, "executable": False}
    assert found["paths"]["/none"]["exists"] is False
    assert found["drafters"][0]["config"] is None and "not found on this host" in found["drafters"][0]["error"]
    assert found["missing_dirs"] == [str(tmp_path / d) for d in ("etc", "state", "log")]
    assert found["nvidia"]["tolerance"] == 256
    assert found["files"] == {"a": {"configuration": None, "API key": None, "systemd unit": None}}


def test_a_deployed_server_is_asked_with_its_key_where_it_was_deployed(tmp_path, server):
    etc, state = tmp_path / "etc", tmp_path / "state"
    etc.mkdir()
    state.mkdir()
    (etc / "a.json").write_text(
        json.dumps(
            {
                "name": "a",
                "host": "0.0.0.0",
                "port": server,
                "served_model_name": "served-a",
                "service_manager": "detached",
            }
        )
    )
    (etc / "a.env").write_text("VLLM_API_KEY=sk-a\n")
    (etc / "broken.json").write_text("{")
    _detached.write_pidfile(str(state / "a.pid"), os.getpid(), _detached._proc.read_start_ticks(os.getpid()))
    # The new configuration moves a to another port: a server answering there is reported.
    found = _vllm_host.read_host(
        request(tmp_path, [{"name": "a", "port": str(server + 1 if server < 65535 else server - 1)}]),
        Inspector(),
        lambda unit: {},
    )
    assert list(found["deployed"]) == ["a"]
    assert found["files"]["a"]["API key"]["sha256"] == _vllm_files.digest("VLLM_API_KEY=sk-a\n")
    assert "sk-a" not in json.dumps(found)  # the key is used to ask the server, never returned
    assert found["running"]["a"] == {"ready": True, "process_exited": False, "last_error": None, "pid": os.getpid()}
    (etc / "a.env").write_text("VLLM_API_KEY=sk-wrong\n")
    found = _vllm_host.read_host(request(tmp_path, [{"name": "a", "port": str(server)}]), Inspector(), lambda unit: {})
    assert found["running"]["a"]["ready"] is False and "401" in found["running"]["a"]["last_error"]
    assert found["ports"] == {}  # the deployed port: not a port taken anew


def test_a_port_taken_anew_where_a_server_answers(tmp_path, server):
    found = _vllm_host.read_host(request(tmp_path, [{"name": "b", "port": str(server)}]), Inspector(), lambda unit: {})
    assert found["ports"]["b"] and "Connection refused" not in found["ports"]["b"]


def test_a_systemd_instance_is_watched_by_its_main_pid(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "a.json").write_text(json.dumps({"name": "a", "port": closed_port(), "service_manager": "systemd"}))
    units = []
    found = _vllm_host.read_host(
        request(tmp_path, [{"name": "a", "port": "1"}]),
        Inspector(),
        lambda unit: units.append(unit) or {"ActiveState": "inactive", "MainPID": "0"},
    )
    assert units == ["vllm-a.service"] and found["running"]["a"]["process_exited"] is True


@pytest.mark.parametrize("entry", [{"model": None, "drafter_config": None}, {"model": 5}, {}])
def test_a_drafter_without_a_model_or_config_path_is_an_error_not_a_crash(entry):
    found = _vllm_host.read_drafter(entry)
    assert found["path"] is None and found["config"] is None
    assert found["error"] == (
        "no drafter config.json to read: neither a drafter model (a directory) nor drafter_config is given"
    )
