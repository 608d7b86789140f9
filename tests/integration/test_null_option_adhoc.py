"""Issue 34 item 3: a selection option given as null in an ad hoc run (-a '{"gpus": null}') reaches the module as
None, the same as an option left out ("any"); the collection's action plugin refuses it on the controller, with the
module's own words, and nothing is signalled. With this ansible-core: if a release stopped showing the action plugin
a null (self._task.args), this test would fail."""

from __future__ import annotations

import pytest

from ansible_run import module, only
from nodetools import alive, start_holder
from simnode import inventory_file


@pytest.mark.parametrize(
    "name, args, words",
    [
        ("gpuops.nvidia.gpu_kill", {"gpus": None}, "nothing was signalled: gpus is null"),
        (
            "gpuops.nvidia.gpu_kill",
            {"pids": None, "users": None, "grace_period": 1},
            "nothing was signalled: pids, users are null",
        ),
        ("gpuops.nvidia.gpu_wait", {"units": None, "timeout": 0}, "units is null"),
    ],
)
def test_a_null_selection_option_ad_hoc_is_refused_and_nothing_is_signalled(simnode, tmp_path, name, args, words):
    node = simnode(gpus=1, release_latency=0.1)
    holder = start_holder(node, [0], mib=2000)
    status, result = only(module(inventory_file(tmp_path, node), name, args))
    assert status == "FAILED!", result
    assert result["msg"] == words + ": a selection that names nothing is refused (omit the option to select any)"
    assert "signalled" not in result and "before" not in result, result
    assert alive(node, holder)
