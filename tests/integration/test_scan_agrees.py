"""The collection's holder scan finds the same holders as `fuser -v` (psmisc) on a node with a few hundred processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ansible_run import REPO

sys.path.insert(0, str(REPO / "scripts" / "bench"))
import nodeload  # noqa: E402

ENSURE_TOOLS = REPO / "scripts" / "bench" / "ensure_tools.sh"

# Inside the node: the holder PIDs found by the scan (as the modules run it, serially and split over 3
# worker processes) and by fuser, which prints the PIDs on stdout (once per file) and its table on stderr.
_SCANS = r"""
import glob, json, subprocess, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _procscan
fuser = subprocess.run(["fuser", "-v"] + sorted(glob.glob("/dev/nvidia*")), capture_output=True, text=True)
print(json.dumps({"scan": sorted(_procscan.scan_holders()), "serial": sorted(_procscan.scan_holders(workers=1)),
                  "parallel": sorted(_procscan.scan_holders(workers=3)),
                  "fuser": sorted({int(word) for word in fuser.stdout.split()})}))
"""


def _fuser_refused() -> str | None:
    """Why fuser cannot be had here (ensure_tools.sh installs psmisc where it can), or None."""
    result = subprocess.run([str(ENSURE_TOOLS), "fuser"], capture_output=True, text=True, timeout=600, check=False)
    return None if result.returncode == 0 else result.stderr.strip() or "ensure_tools.sh fuser failed"


def test_scan_and_fuser_find_the_same_holders(simnode):
    refused = _fuser_refused()
    if refused:
        pytest.skip(refused)
    node = simnode(gpus=4)
    # Holders of every kind: the device file open, with nvidiactl + nvidia-uvm, only mapped (fd closed),
    # only inherited by a child; plus control-only holders, fd helpers with thousands of fds, sleepers.
    made = nodeload.populate(node, processes=300, fds=8000, holders=12, threads=4)
    assert made["processes"] >= 300 and made["fds"] >= 8000, made
    expected = sorted(made["holders"] + made["control_only"])
    assert len(expected) == 14

    found = json.loads(node.py(_SCANS, str(REPO / ".collections")))

    assert found["fuser"] == expected
    assert found["scan"] == found["serial"] == found["parallel"] == expected
