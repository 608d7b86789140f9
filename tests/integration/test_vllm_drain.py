"""vllm_server: drain before the stop, checks before anything is stopped, and playbooks/check_vllm.yml, on simulated
nodes running the simulated vLLM (slow requests: SIMVLLM_TOKEN_SECONDS; acceptance collapse:
SIMVLLM_ACCEPTANCE_COLLAPSE_AFTER). Clients run in this process: nodes share the host's network and /tmp."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ansible_run import REPO, module, only, playbook
from simnode import inventory_file
from test_vllm_server import CORRECTED, free_ports, instance, run, server_tree, summary, tree_pids, write_host_vars

CHECK = REPO / "playbooks" / "check_vllm.yml"
SLOW = {"SIMVLLM_LOAD_SECONDS": "0.3", "SIMVLLM_TOKEN_SECONDS": "0.1"}  # a 100-token request takes 10 s


class Load:
    """Clients sending completions of 100 tokens (10 s each) in a loop until `routed` (a file) disappears; every result is
    kept. The clients start REQUEST_S / clients apart and stay so (each sends its next request as the last one ends):
    when the hook takes the instance out of routing, the youngest request has run at most that long and has most of
    its 10 s left, so requests still run when the drain reads its first gauges, a few Ansible tasks later, even on a
    loaded machine. Started together, the clients' requests ended together, and a hook late in that cycle left nothing
    running by the first gauge reading (seen once in CI: "0 running at the start")."""

    REQUEST_S = 10.0

    def __init__(self, port, model, routed, clients=4):
        self.port, self.model, self.routed = port, model, routed
        self.results = []  # (sent at, status or None, finish_reason or error)
        self.sending = [threading.Event() for _number in range(clients)]
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._client, args=(number, number * self.REQUEST_S / clients), daemon=True)
            for number in range(clients)
        ]
        for thread in self.threads:
            thread.start()

    def wait_sending(self, timeout=30):
        """Return once every client has sent its first request (the last one starts REQUEST_S after the first)."""
        for event in self.sending:
            assert event.wait(timeout), "a load client sent nothing within %s s" % timeout

    def _client(self, number, offset):
        if self.stop.wait(offset):
            return
        while not self.stop.is_set():
            if not self.routed.exists():  # out of routing: the load balancer sends nothing here
                time.sleep(0.05)
                continue
            body = json.dumps({"model": self.model, "prompt": "client %d" % number, "max_tokens": 100}).encode()
            request = urllib.request.Request(
                "http://127.0.0.1:%d/v1/completions" % self.port, body, {"Content-Type": "application/json"}
            )
            sent = time.time()
            self.sending[number].set()
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    self.results.append(
                        (sent, response.status, json.loads(response.read())["choices"][0]["finish_reason"])
                    )
            except (OSError, urllib.error.URLError, http.client.HTTPException) as error:
                self.results.append((sent, None, repr(error)))
                time.sleep(0.05)

    def finish(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(40)
        return self.results


def failed(results, before):
    """Requests sent before `before` (epoch seconds) that did not complete normally."""
    return [r for r in results if r[0] < before and (r[1] != 200 or r[2] != "length")]


def test_redeploy_under_load_drains_without_failed_requests(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.2)
    port = free_ports(1)[0]
    inventory = inventory_file(tmp_path, node)
    routed = tmp_path / "routed"
    write_host_vars(
        tmp_path,
        node,
        [instance("a", port, [0, 1], environment=dict(SLOW))],
        vllm_server_drain_poll_interval=0.2,
        vllm_server_warmup_max_tokens=8,
    )
    rc, out, _recap = run(inventory)
    assert rc == 0, out
    routed.touch()

    # Without a drain hook and with no time to drain, SIGTERM aborts what runs (vLLM's --shutdown-timeout 0):
    # the figures the summary gives, and the failures the drain is there to avoid.
    load = Load(port, "qwen-a", routed)
    load.wait_sending()
    rc, out, _recap = run(
        inventory, "-e", json.dumps({"test_override": {"gpu_memory_utilization": 0.85}, "vllm_server_drain_timeout": 0})
    )
    assert rc == 0, out
    lines = "\n".join(summary(out, node))
    stopped = re.search(r"not drained in [\d.]+ s: (\d+) request\(s\) running and (\d+) waiting at the stop", lines)
    assert stopped and int(stopped.group(1)) > 0, lines
    results = load.finish()
    aborted = [r for r in results if r[2] == "abort"]
    assert aborted, results

    # With the hook (the instance leaves routing: the clients stop sending) the requests already running finish,
    # then the server is stopped; the restore hook puts the new server back into routing.
    tree = server_tree(node, port)
    load = Load(port, "qwen-a", routed)
    load.wait_sending()
    drained_at = tmp_path / "drained-at"
    hooks = {
        "vllm_server_drain_command": "sh -c 'date +%%s.%%N > %s; rm %s'" % (drained_at, routed),
        "vllm_server_restore_command": "touch %s" % routed,
        "vllm_server_drain_timeout": 30,
        "test_override": {"gpu_memory_utilization": 0.8},
    }
    rc, out, _recap = run(inventory, "-e", json.dumps(hooks))
    assert rc == 0, out
    time.sleep(1.0)
    results = load.finish()
    drain_started = float(drained_at.read_text())
    before = [r for r in results if r[0] < drain_started]
    assert len(before) >= 4 and failed(results, drain_started) == [], results
    assert [r for r in results if r[0] > drain_started + 1], "the restored server got no traffic"
    assert failed(results, time.time()) == [], results
    lines = "\n".join(summary(out, node))
    match = re.search(
        r"drained in [\d.]+ s: 0 request\(s\) running and 0 waiting at the stop \((\d+) running at the start\), "
        r"server exited [\d.]+ s after SIGTERM",
        lines,
    )
    assert match and int(match.group(1)) > 0, lines
    assert routed.exists() and not set(tree_pids(tree)) & set(tree_pids(server_tree(node, port)))


def test_bad_instances_are_refused_before_anything_stops(simnode, tmp_path):
    node = simnode(gpus=8, release_latency=0.2)
    ports = free_ports(8)
    port, other_port = ports[:2]
    inventory = inventory_file(tmp_path, node)
    uuids = [gpu["uuid"] for gpu in json.loads((node.state_dir / "node.json").read_text())["gpus"]]
    root = write_host_vars(tmp_path, node, [instance("a", port, [uuids[0], 1])])
    rc, out, _recap = run(inventory)
    assert rc == 0, out
    tree = server_tree(node, port)
    config = json.loads((root / "etc" / "a.json").read_text())  # a GPU given by UUID is deployed as its index
    assert config["gpus"] == [0, 1] and config["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"

    # Another server (not a vLLM of this role) listens on other_port.
    class Ok(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    squatter = ThreadingHTTPServer(("127.0.0.1", other_port), Ok)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    spec_env = only(module(inventory, "gpuops.nvidia.vllm_speculative_config", {"speculative_config": CORRECTED}))[1][
        "environment"
    ]
    bad = [
        instance("g8", ports[2], [2, 8]),
        instance("guuid", ports[3], [3, "GPU-00000000-0000-0000-0000-000000000000"]),
        instance("garabic", ports[4], [4, "\u0661"]),
        instance("nostats", ports[5], [5], extra_args=["--disable-log-stats"]),
        instance("slow", ports[6], [6], shutdown_timeout=30),
    ]
    runs = [
        (
            [instance("a", port, [0, 1])] + bad,
            [
                r"instance g8: gpus 8: no such GPU on this host \(its GPUs: indices 0, 1, 2, 3, 4, 5, 6, 7, or their UUIDs\)",
                r"instance guuid: gpus GPU-00000000-0000-0000-0000-000000000000: no such GPU",
                r"instance garabic: gpus (\\u0661|\u0661): no such GPU",
                r"instance nostats: extra_args has --disable-log-stats, which removes the vllm:spec_decode_\* metrics",
                r"instance slow: shutdown_timeout 30 must be below vllm_server_stop_timeout 10",
            ],
        ),
        (
            [instance("a", port, [0, 1], model="/models/nowhere")],
            [r"model /models/nowhere does not exist on " + node.name],
        ),
        (
            [instance("a", port, [0, 1]), instance("b", other_port, [2])],
            [r"port %d is already used on %s by a server that is not this instance" % (other_port, node.name)],
        ),
    ]
    runs += [
        (
            [
                instance(
                    "a",
                    port,
                    [0, 1],
                    environment=dict(instance("a", port, [0, 1])["environment"], **{key: value + "0"}),
                )
            ],
            [r"environment sets %s=%s0, but the speculative config needs %s=%s" % (key, value, key, value)],
        )
        for key, value in list(spec_env.items())[:1]
    ]
    try:
        for instances, messages in runs:
            rc, out, recap = run(inventory, "-e", json.dumps({"vllm_server_instances": instances}))
            assert rc != 0 and recap[node.name]["changed"] == 0, out
            for message in messages:
                assert re.search(message, out), (message, out)
            assert server_tree(node, port) == tree, instances
    finally:
        squatter.shutdown()
        squatter.server_close()


def test_check_vllm_fails_on_acceptance_collapse_only(simnode, tmp_path):
    node = simnode(gpus=3, release_latency=0.2)
    ports = free_ports(3)
    inventory = inventory_file(tmp_path, node)
    collapse_after = 10  # seconds after the port listens: long enough for the deploy's acceptance gate to pass first
    env = {"SIMVLLM_LOAD_SECONDS": "0.3"}
    write_host_vars(
        tmp_path,
        node,
        [
            instance("steady", ports[0], [0], environment=env),
            instance(
                "decays", ports[1], [1], environment=dict(env, SIMVLLM_ACCEPTANCE_COLLAPSE_AFTER=str(collapse_after))
            ),
            instance(
                "nostats", ports[2], [2], environment=env, extra_args=["--disable-log-stats"], min_acceptance_rate=0
            ),
        ],
    )
    rc, out, _recap = run(inventory)
    assert rc == 0, out
    assert re.search(
        r"decays \(GPUs 1, \S+\): redeployed.*\n.*\n.*\n.*acceptance rate (6\d|7\d|80)\.\d%",
        "\n".join(summary(out, node)),
    ), out
    time.sleep(collapse_after)
    routed = tmp_path / "routed"
    routed.touch()
    loads = [
        Load(port, "qwen-" + name, routed, clients=1) for port, name in zip(ports, ("steady", "decays", "nostats"))
    ]
    # nostats was deployed without the gate (min_acceptance_rate 0); the probe is asked to check it anyway.
    checks = {
        "vllm_server_instances": "{{ [instance_steady, instance_decays, instance_nostats | combine({'min_acceptance_rate': 0.1})] }}",
        "check_vllm_window": 2,
    }
    try:
        rc, out, recap = playbook(inventory, CHECK, "-e", json.dumps(checks))
    finally:
        for load in loads:
            load.finish()
    assert rc != 0 and recap[node.name]["failed"] == 1, out
    host = re.escape(node.name)
    assert re.search(
        r"check_vllm " + host + r" steady: http://\S+: acceptance rate (6\d|7\d|80)\.\d% \(\d+ of \d+ draft tokens\), "
        r"mean acceptance length [\d.]+ \(\d+ drafts\) over 2 s",
        out,
    ), out
    assert re.search(
        r"check_vllm " + host + r" decays: FAILED: http://\S+: acceptance rate [0-4]\.\d% \(\d+ of \d+ draft tokens\), "
        r"mean acceptance length 1\.\d+ \(\d+ drafts\) over 2 s is below the minimum 10\.0%",
        out,
    ), out
    assert re.search(r"check_vllm " + host + r" nostats: FAILED: .*--disable-log-stats", out), out
    assert not re.search(r"check_vllm " + host + r" steady: FAILED", out), out
