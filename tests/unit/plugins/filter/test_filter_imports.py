# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What one filter of the collection costs the task that uses it.

ansible-core finds a collection filter by importing every file of plugins/filter/ (Jinja2Loader.get_with_context in
ansible/plugins/loader.py), compiled from source in each task's worker process. So every per-host task that uses a
filter (the checks of reset_gpus and check_gpus variables) imports all of them: none may pull in what only the host
needs, such as the HTTP client of the vLLM servers (docs/architecture.md, "Filters").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

COLLECTIONS = str(Path(__file__).resolve().parents[4] / ".collections")
LOOKUP = (
    """
import json, sys
from ansible.plugins.loader import filter_loader, init_plugin_loader
init_plugin_loader([%r])
assert filter_loader.get("gpuops.nvidia.check_gpus_plan") is not None
print(json.dumps(sorted(sys.modules)))
"""
    % COLLECTIONS
)
# Only the host reads and ends processes, or talks to the servers.
HOST_ONLY = (
    "ansible.module_utils.urls",
    "ansible_collections.gpuops.nvidia.plugins.module_utils._vllm_api",
    "ansible_collections.gpuops.nvidia.plugins.module_utils._vllm_host",
    "ansible_collections.gpuops.nvidia.plugins.module_utils._terminate",
    "ansible_collections.gpuops.nvidia.plugins.module_utils._detached",
)


def test_a_filter_lookup_imports_every_filter_file_and_nothing_of_the_host():
    found = subprocess.run([sys.executable, "-c", LOOKUP], capture_output=True, text=True, check=True)
    modules = set(json.loads(found.stdout))
    filters = {
        path.stem for path in (Path(COLLECTIONS) / "ansible_collections/gpuops/nvidia/plugins/filter").glob("*.py")
    }
    # The premise: the lookup of one filter imported every filter file.
    assert {"ansible_collections.gpuops.nvidia.plugins.filter." + name for name in filters} <= modules
    assert sorted(modules & set(HOST_ONLY)) == []
