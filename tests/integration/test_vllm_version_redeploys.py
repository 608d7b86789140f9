"""roles/vllm_server across vLLM releases on a simulated node: each instance is validated against the release its
executable runs (read from the installation's package metadata), a redeploy moves an instance from vLLM 0.33 to
0.34, and a failed one goes back to the previous release.

Two simulated vLLM installations sit side by side on the node (tests/sim/simvllm/install.py: bin/vllm and
lib/pythonX.Y/site-packages/vllm-X.dist-info/METADATA, as pip lays out a virtual environment).
"""

from __future__ import annotations

import json
import sys
import urllib.request

from ansible_run import REPO
from nodetools import alive
from simnode import inventory_file
from test_vllm_server import CORRECTED, SERVER_ENV, environ, free_ports, instance, run, server_tree, summary, tree_pids
from test_vllm_server import write_host_vars

sys.path.insert(0, str(REPO / "tests" / "sim"))
from simvllm.install import install  # noqa: E402

# draft_decode_context_parallel_size: a field vLLM 0.34 added (vllm/config/speculative.py); 0.33 refuses it at start.
ON_0_34 = dict(CORRECTED, draft_decode_context_parallel_size=1)


def installation(node, tmp_path, version):
    """A simulated vLLM `version` installed under tmp_path/opt, run by the node's Python; its bin/vllm."""
    python = (node.state_dir / "bin" / "vllm").read_text().splitlines()[0][2:]
    return install(str(tmp_path / "opt" / ("vllm-" + version)), version, python)


def served_version(port):
    """What the server on `port` answers at GET /version."""
    with urllib.request.urlopen("http://127.0.0.1:%d/version" % port, timeout=10) as response:
        return json.loads(response.read())["version"]


def test_redeploy_from_0_33_to_0_34_and_rollback_across_releases(simnode, tmp_path):
    node = simnode(gpus=4, release_latency=0.2)
    port = free_ports(1)[0]
    inventory = inventory_file(tmp_path, node)
    executables = {version: installation(node, tmp_path, version) for version in ("0.33.0", "0.34.0")}
    root = write_host_vars(tmp_path, node, [instance("a", port, [0, 1, 2, 3], vllm_executable=executables["0.33.0"])])

    # Deployed on vLLM 0.33: its mixed sliding/full DFlash drafter gets the V2 model runner pinned.
    rc, out, recap = run(inventory)
    assert rc == 0, out
    before = server_tree(node, port)
    assert served_version(port) == "0.33.0" and environ(node, before["api"])["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    deployed = (root / "etc" / "a.json").read_text()

    # A config written for 0.34 is refused for the 0.33 executable, naming both releases; nothing is stopped.
    rc, out, recap = run(inventory, "-e", json.dumps({"test_override": {"speculative_config": ON_0_34}}))
    assert rc != 0 and recap[node.name]["changed"] == 0, out
    assert "draft_decode_context_parallel_size=1: a field of vLLM 0.34.0, not of vLLM 0.33.0's" in out, out
    assert server_tree(node, port) == before

    # Moving to 0.34 with a server that fails to start: rolled back to the previous configuration, on 0.33 again.
    failing = {
        "vllm_executable": executables["0.34.0"],
        "speculative_config": ON_0_34,
        "environment": dict(SERVER_ENV, SIMVLLM_CRASH="init", SIMVLLM_LOAD_SECONDS="6"),
    }
    rc, out, recap = run(inventory, "-e", json.dumps({"test_override": failing}))
    assert rc != 0 and recap[node.name]["failed"] == 1, out
    assert "rolled back to the previous configuration, healthy again after" in out, out
    restored = server_tree(node, port)
    assert not any(alive(node, pid) for pid in tree_pids(before)) and served_version(port) == "0.33.0"
    assert (root / "etc" / "a.json").read_text() == deployed
    assert environ(node, restored["api"])["VLLM_USE_V2_MODEL_RUNNER"] == "1"

    # Moving to 0.34: validated against 0.34's facts (no V1 runner to guard against), gated, and it stays.
    moved = {"vllm_executable": executables["0.34.0"], "speculative_config": ON_0_34}
    rc, out, recap = run(inventory, "-e", json.dumps({"test_override": moved}))
    assert rc == 0 and recap[node.name]["changed"] > 0, out
    lines = summary(out, node)
    assert lines[0].startswith("a (GPUs 0,1,2,3, http://127.0.0.1:%d): redeployed (configuration changed" % port), lines
    assert 'vllm_executable: "%s" -> "%s"' % (executables["0.33.0"], executables["0.34.0"]) in "\n".join(lines), lines
    assert any(line.strip().startswith("acceptance rate") for line in lines), lines
    new = server_tree(node, port)
    assert served_version(port) == "0.34.0" and "VLLM_USE_V2_MODEL_RUNNER" not in environ(node, new["api"])
    config = json.loads((root / "etc" / "a.json").read_text())
    assert config["vllm_executable"] == executables["0.34.0"]
    assert config["speculative_config"]["draft_decode_context_parallel_size"] == 1

    # Again: nothing changes.
    rc, out, recap = run(inventory, "-e", json.dumps({"test_override": moved}))
    assert rc == 0 and recap[node.name]["changed"] == 0 and server_tree(node, port) == new, out


def test_releases_newer_and_older_than_the_known_ones(simnode, tmp_path):
    """Check mode, so that nothing is started: a newer release is warned about by name, an older one refused."""
    node = simnode(gpus=4)
    port = free_ports(1)[0]
    inventory = inventory_file(tmp_path, node)
    newer, older = installation(node, tmp_path, "0.35.0"), installation(node, tmp_path, "0.31.0")
    write_host_vars(tmp_path, node, [instance("a", port, [0, 1, 2, 3], ON_0_34, vllm_executable=newer)])
    rc, out, recap = run(inventory, "--check")
    assert rc == 0, out
    assert (
        "instance a: vLLM 0.35.0 is newer than the releases this collection knows (0.32 to 0.34): its speculative "
        "config, flags, metrics and shutdown are validated against vLLM 0.34.0's" in out
    ), out
    rc, out, recap = run(inventory, "--check", "-e", json.dumps({"test_override": {"vllm_executable": older}}))
    assert rc != 0, out
    assert "vLLM 0.31.0 is older than the releases this collection supports (0.32 to 0.34)" in out, out
