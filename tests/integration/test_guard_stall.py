"""Stalled vLLM engines: check_vllm.yml (check_vllm_stall_seconds) and the guard's metrics call an instance whose
engine is stuck (SIMVLLM_STALL_AFTER: /health 200, a request running, no token) stalled, and one that generates, or
is idle, healthy."""

from __future__ import annotations

import json

from ansible_run import playbook
from nodetools import free_ports, start_vllm, wait_for
from simnode import inventory_file

REQUEST = (
    "import json, urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:%d/v1/completions', "
    "data=json.dumps({'model': '/models/m', 'prompt': 'hi', 'max_tokens': %d}).encode(), "
    "headers={'Content-Type': 'application/json'}), timeout=120)"
)
RUNNING = (
    "import urllib.request as u; t = u.urlopen('http://127.0.0.1:%d/metrics', timeout=5).read().decode(); "
    "print([l for l in t.splitlines() if l.startswith('vllm:num_requests_running')][0].split()[-1])"
)


def send(node, port, max_tokens):
    """A completion request in the background, inside the node; returns once the server runs it."""
    node.exec("sh", "-c", "setsid -f python3 -c \"%s\" >/dev/null 2>&1" % (REQUEST % (port, max_tokens)))
    wait_for(lambda: float(node.exec("python3", "-c", RUNNING % port).stdout) >= 1, 20, 0.1, "the request to run")


def test_stalled_and_healthy_engines(simnode, tmp_path):
    node = simnode(gpus=3)
    stuck, generating, idle = free_ports(3)
    start_vllm(node, "/models/m", "--port", str(stuck), env={"CUDA_VISIBLE_DEVICES": "0", "SIMVLLM_STALL_AFTER": "0"})
    start_vllm(
        node, "/models/m", "--port", str(generating), env={"CUDA_VISIBLE_DEVICES": "1", "SIMVLLM_TOKEN_SECONDS": "0.05"}
    )
    start_vllm(node, "/models/m", "--port", str(idle), env={"CUDA_VISIBLE_DEVICES": "2"})
    send(node, stuck, 16)
    send(node, generating, 2000)
    inventory = inventory_file(tmp_path, node)
    (tmp_path / "host_vars").mkdir()
    instances = [
        {"name": "stuck", "port": stuck, "model": "/models/m"},
        {"name": "generating", "port": generating, "model": "/models/m"},
        {"name": "idle", "port": idle, "model": "/models/m"},
    ]
    (tmp_path / "host_vars" / ("%s.yml" % node.name)).write_text(json.dumps({"vllm_server_instances": instances}))

    rc, out, _recap = playbook(inventory, "playbooks/check_vllm.yml", "-e", "check_vllm_stall_seconds=3")
    assert rc != 0, out
    assert (
        "check_vllm %s stuck: FAILED: http://127.0.0.1:%d: stalled: 1 request(s) running and no token"
        % (node.name, stuck)
        in out
    ), out
    assert "check_vllm %s generating: http://127.0.0.1:%d: healthy: " % (node.name, generating) in out, out
    assert "check_vllm %s idle: http://127.0.0.1:%d: healthy: no request running" % (node.name, idle) in out, out
    assert "%s: stuck is stalled" % node.name in out, out

    textfile = tmp_path / "guard.prom"
    extra = json.dumps({"guard_textfile": str(textfile), "guard_stall_seconds": 3})
    rc, out, _recap = playbook(inventory, "playbooks/guard_metrics.yml", "-e", extra)
    assert rc == 0, out
    text = textfile.read_text()
    for name, state in (("stuck", "stalled"), ("generating", "healthy"), ("idle", "healthy")):
        port = {"stuck": stuck, "generating": generating, "idle": idle}[name]
        line = 'gpuops_nvidia_guard_vllm_state{vllm_instance="%s",url="http://127.0.0.1:%d",state="%s"} 1' % (
            name,
            port,
            state,
        )
        assert line in text, text
