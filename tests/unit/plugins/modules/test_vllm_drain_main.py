# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vllm_drain: main() against the fake_vllm server, with a process of the test's own as the server's main process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.modules import vllm_drain
from module_main import run_main


@pytest.fixture
def server_process():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def test_a_server_that_cannot_be_asked_is_not_signalled(capsys, fake_vllm_tls, server_process):
    # The certificate is not trusted (validate_certs defaults to true): the load cannot be read, so nothing is stopped.
    code, result = run_main(
        vllm_drain, capsys, {"url": fake_vllm_tls.url, "served_model_name": "served", "pid": server_process.pid}
    )
    assert code == 1 and "TLS failed" in result["msg"] and result["msg"].endswith("nothing was signalled"), result
    assert server_process.poll() is None


def test_an_error_answer_is_not_drained_and_the_stop_goes_ahead(capsys, fake_vllm, server_process):
    fake_vllm.metrics_status = 503
    code, result = run_main(
        vllm_drain,
        capsys,
        {"url": fake_vllm.url, "served_model_name": "served", "pid": server_process.pid, "grace_period": 10},
    )
    assert code == 0 and result["changed"] and result["drained"] is False, result
    assert (
        "GET /metrics: HTTP 503" in result["msg"]
        and "not drained; SIGTERM to PID %d" % server_process.pid in (result["msg"])
    )
    assert server_process.wait(10) == -15
