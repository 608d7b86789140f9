"""tests/gpu/ records what the driver advises, read only, and never resets the GPU or changes its settings."""

import os
import re
import types

import check
from gpucheck import driver

# What would reset a GPU or change a setting: nvidia-smi's reset and persistence mode, NVML's setters and resets, the
# collection's reset module and the role's variable that turns it on.
CHANGES = re.compile(
    r"--gpu-reset|[\"']-r[\"']|[\"']-pm[\"']|--persistence-mode|nvmlDeviceSet|nvmlDeviceReset|nvmlDeviceClear|"
    r"nvmlDeviceModifyDrainState|nvmlDeviceRemoveGpu|gpuops\.nvidia\.gpu_reset|reset_gpus_gpu_reset"
)


def test_nothing_under_tests_gpu_resets_a_gpu_or_changes_a_setting():
    found = []
    for directory, _dirs, files in os.walk(check.HERE):
        for name in files:
            if name.endswith((".py", ".sh")) or name == "gpucheck":
                path = os.path.join(directory, name)
                with open(path, errors="replace") as handle:
                    found += ["%s: %s" % (path, m.group(0)) for m in CHANGES.finditer(handle.read())]
    assert found == []


class _Nvml:
    """A pynvml stand-in that records every call: one GPU, NVLink 0 to a peer, then no more links."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        answers = {
            "nvmlInit": None,
            "nvmlDeviceGetHandleByIndex": "handle",
            "nvmlDeviceGetFieldValues": [types.SimpleNamespace(nvmlReturn=0, value=types.SimpleNamespace(uiVal=1))],
            "nvmlDeviceGetRemappedRows": (0, 0, 1, 0),
            "nvmlDeviceGetRetiredPagesPendingStatus": 0,
            "nvmlDeviceGetPersistenceMode": 1,
            "nvmlDeviceGetNvLinkRemotePciInfo": types.SimpleNamespace(busId=b"00000000:2A:00.0"),
            "nvmlDeviceGetNvLinkRemoteDeviceType": 0,
        }

        def call(*args):
            self.calls.append(name)
            if name == "nvmlDeviceGetNvLinkState":
                if args[1] > 0:
                    raise self.NVMLError("Invalid Argument")
                return 1
            return answers[name]

        return call


def test_the_driver_advice_is_read_with_getters_only():
    nvml = _Nvml()
    found = driver.Gpu(nvml, 0).recovery()
    assert found["recovery_action"] == {"return": 0, "value": 1} and found["remapped_rows"] == [0, 0, 1, 0]
    assert found["persistence_mode"] == 1 and found["retired_pages_pending"] == 0
    assert found["nvlinks"] == [
        {"link": 0, "remote_bus_id": "00000000:2A:00.0", "remote_type": 0},
        {"link": 1, "error": "Invalid Argument"},
    ]
    assert all(name == "nvmlInit" or name.startswith("nvmlDeviceGet") for name in nvml.calls), nvml.calls
    # check.py stands alone on the GPU host: its copy of the actions' names must be gpu_facts' own.
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _nvml

    assert check.RECOVERY_ACTIONS == _nvml.ACTIONS
