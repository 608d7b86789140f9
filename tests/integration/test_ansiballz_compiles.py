"""A module as Ansible ships it compiles each of the collection's module_utils once (plugins/module_utils/_zipload.py).

Ansible builds the AnsiballZ payload of gpu_wait for a simulated node and keeps it (ANSIBLE_KEEP_REMOTE_FILES, no
pipelining); the kept payload then runs again inside the node under an audit hook that counts the interpreter's
"compile" events per file. The unit tests (tests/unit/plugins/module_utils/test_zipload.py) cover the finder on
hand-made zips; this is the payload layout of the ansible-core in use.
"""

from __future__ import annotations

import json

import ansible_api
from ansible_run import REPO, VENV_BIN
from compile_audit import hook_source
from simnode import inventory_file

HOOK = hook_source("/gpuops/nvidia/plugins/") + r"""
import json, runpy
sys.argv = [sys.argv[1]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
sys.stderr.write("\nCOMPILED " + json.dumps(compiled) + "\n")
"""


def test_gpu_wait_as_ansible_ships_it_compiles_each_module_util_once(simnode, tmp_path):
    node = simnode(gpus=2)
    kept = tmp_path / "remote_tmp"
    env = dict(ansible_api.environment(VENV_BIN, REPO / "ansible.cfg"), ANSIBLE_KEEP_REMOTE_FILES="1",
               ANSIBLE_PIPELINING="False", ANSIBLE_REMOTE_TMP=str(kept))
    run = ansible_api.run(inventory_file(tmp_path, node), REPO, module="gpuops.nvidia.gpu_wait",
                          module_args=json.dumps({"timeout": 0}), envvars=env, timeout=120)
    status, result = run.results()[node.name]
    assert status == "SUCCESS" and result["released"], (status, result)
    payloads = sorted(kept.rglob("AnsiballZ_gpu_wait.py"))
    assert len(payloads) == 1, payloads

    done = node.exec(node.info["python"], "-c", HOOK, str(payloads[0]), timeout=60)
    assert json.loads(done.stdout)["released"] is True
    compiled = json.loads(done.stderr.rsplit("COMPILED ", 1)[1])
    # The module itself (runpy), the package __init__ files and _zipload are compiled before the finder is in place,
    # as zipimport does (twice each for the latter two); every other module_utils that gpu_wait imports, once.
    module_utils = {name.split("/", 1)[1]: count for name, count in compiled.items()
                    if name.startswith("module_utils/") and name not in ("module_utils/__init__.py", "module_utils/_zipload.py")}
    assert {"_gpus.py", "_nvml.py", "_holders.py", "_select.py", "_wait.py"} <= set(module_utils), compiled
    assert set(module_utils.values()) == {1}, compiled
