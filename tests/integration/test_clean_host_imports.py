"""What gpu_kill (reset_gpus) and gpu_wait (check_gpus) import on a clean host, the common path across an inventory.

Ansible ships module_utils as source inside the AnsiballZ payload: every one a run imports is compiled on every host,
on every run (docs/scale.md, "Where the node's CPU goes"). The /proc device-file scan (_procscan), the owners
(_owners), stop_owners (_stop_owners) and the words of GPUs not freed (_advice) serve holders only: a run that finds
none must not import them. Each module runs here as AnsiballZ runs it, main() with its arguments, in a simulated node.
"""

from __future__ import annotations

import json

from ansible_run import REPO

# main() of one module with the arguments as given (argv[2], JSON); then the collection's module_utils it imported.
RUN_MAIN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpuops.nvidia.plugins.modules import gpu_kill, gpu_wait
module = {"gpu_kill": gpu_kill, "gpu_wait": gpu_wait}[sys.argv[2]]
with patch_module_args(json.loads(sys.argv[3])):
    try:
        module.main()
    except SystemExit as exited:
        assert exited.code == 0, exited.code
print()
print(json.dumps(sorted(m.rsplit(".", 1)[-1] for m in sys.modules if ".plugins.module_utils.gpu." in m)))
"""
# Each as its playbook runs it: roles/reset_gpus (vars/main.yml, the plan's kill options) and check_gpus.yml.
RUNS = {
    "gpu_kill": {"wait": True, "fail_unreleased": False, "wait_timeout": 15, "exclude": [], "max_used_mib": 256},
    "gpu_wait": {"timeout": 5, "require_memory": True, "recovery": True, "return_after": False, "exclude": []},
}
HOLDERS_ONLY = {"_procscan", "_owners", "_stop_owners", "_advice"}


def test_a_clean_host_imports_nothing_that_only_holders_need(simnode):
    node = simnode(gpus=2)
    for name, args in RUNS.items():
        out = node.py(RUN_MAIN, str(REPO / ".collections"), name, json.dumps(args))
        lines = [line for line in out.splitlines() if line.strip()]
        result, imported = json.loads(lines[0]), set(json.loads(lines[-1]))
        # The run looked at the GPUs through the driver and found them free.
        assert result["released"] is True and result["changed"] is False, result
        assert result["driver"]["available"] is True and {"_nvml", "_holders", "_release"} <= imported, imported
        assert sorted(imported & HOLDERS_ONLY) == [], name
