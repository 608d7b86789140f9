"""vllm_drain and vllm_acceptance given another served name of a server with several (`--served-model-name A B`).

vLLM 0.33 labels every metric with the first served name only (vllm/config/model.py get_served_model_name,
vllm/v1/metrics/loggers.py; the simulated vLLM does the same). Given the second name, the modules read the
metrics under the first one, and never take "no gauge for this name" for --disable-log-stats.
"""

from __future__ import annotations

import json
import shlex
import socket
import time

from ansible_run import module, only
from nodetools import start_vllm
from simnode import inventory_file
from test_vllm_drain import Load
from test_vllm_server import MODEL, free_ports

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}


def listening(port, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def test_drain_and_acceptance_work_with_the_second_served_name(simnode, tmp_path):
    node = simnode(gpus=1, release_latency=0.2)
    port = free_ports(1)[0]
    inventory = inventory_file(tmp_path, node)
    api = start_vllm(
        node,
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        "qwen-first",
        "qwen-alias",
        "--speculative-config",
        shlex.quote(json.dumps(NGRAM)),
        env={"SIMVLLM_LOAD_SECONDS": "0.3", "SIMVLLM_TOKEN_SECONDS": "0.1", "CUDA_VISIBLE_DEVICES": "0"},
    )
    assert listening(port)
    url = "http://127.0.0.1:%d" % port

    status, result = only(
        module(
            inventory,
            "gpuops.nvidia.vllm_acceptance",
            {
                "url": url,
                "served_model_name": "qwen-alias",
                "prompts": ["one two three one two three"],
                "max_tokens": 8,
            },
        )
    )
    assert status == "SUCCESS", result
    assert result["drafts"] > 0 and result["acceptance_rate"] is not None, result

    routed = tmp_path / "routed"
    routed.touch()
    load = Load(port, "qwen-alias", routed, clients=2)
    try:
        load.wait_sending()
        status, result = only(
            module(inventory, "gpuops.nvidia.vllm_drain", {"url": url, "served_model_name": "qwen-alias", "timeout": 0})
        )
        assert status == "SUCCESS", result
        # before: no gauge labelled qwen-alias, read as --disable-log-stats (ends at once, SIGTERM with requests running)
        assert result["metrics"] and result["metrics_model_name"] == "qwen-first", result
        assert result["running_at_start"] >= 1, result
        assert "another name of this server" in result["msg"], result

        # a name the server does not serve: refused, nothing signalled
        status, result = only(
            module(
                inventory,
                "gpuops.nvidia.vllm_drain",
                {"url": url, "served_model_name": "qwen-other", "timeout": 5, "pid": api},
            )
        )
        assert status == "FAILED!" and "does not serve 'qwen-other'" in result["msg"], result
        assert "nothing was signalled" in result["msg"]
        assert node.exec("kill", "-0", str(api), check=False).returncode == 0

        routed.unlink()  # out of routing: the running requests finish, then the drain stops the server
        status, result = only(
            module(
                inventory,
                "gpuops.nvidia.vllm_drain",
                {
                    "url": url,
                    "served_model_name": "qwen-alias",
                    "timeout": 30,
                    "poll_interval": 0.2,
                    "pid": api,
                    "grace_period": 10,
                },
            )
        )
    finally:
        results = load.finish()
    assert status == "CHANGED" and result["drained"] and result["running"] == 0, result
    assert result["stop"]["signalled"] and result["stop"]["exited"], result
    assert [r for r in results if r[1] == 200 and r[2] == "length"], results
    assert not [r for r in results if r[2] == "abort"], results
