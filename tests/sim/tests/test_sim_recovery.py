"""The simulator's recovery model (tests/sim/README.md, "Recovery"): what the fake driver advises per GPU, the
simulated nvidia-smi's persistence mode and reset with their refusals, the units systemctl starts, /dev/kmsg."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))

import nodetools  # noqa: E402

ADVICE = r"""
import json, pynvml as n
n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    field = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, n.NVML_FI_DEV_RESET_STATUS])
    peers = []
    for link in range(n.NVML_NVLINK_MAX_LINKS):
        try:
            if n.nvmlDeviceGetNvLinkState(h, link):
                peers.append(n.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
        except n.NVMLError as error:
            peers.append(type(error).__name__)
            break
    out.append({
        "action": [field[0].nvmlReturn, field[0].value.uiVal], "reset_status": field[1].nvmlReturn,
        "rows": list(n.nvmlDeviceGetRemappedRows(h)), "retired": n.nvmlDeviceGetRetiredPagesPendingStatus(h),
        "persistence": n.nvmlDeviceGetPersistenceMode(h), "peers": peers,
        "used": n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used >> 20,
    })
print(json.dumps(out))
"""


def advice(node):
    return json.loads(node.py(ADVICE))


def smi(node, *args):
    result = node.exec("nvidia-smi", *args, check=False)
    return result.returncode, result.stdout + result.stderr


def test_the_driver_advice_and_a_reset_that_refuses_then_frees_the_leak(simnode):
    node = simnode(gpus=3, nvidia_smi=True)
    bus = [gpu["pci_bus_id"] for gpu in node.info["gpus"]]
    node.set(
        recovery_action="0:1,2:2",
        remapped_rows="0:2:1:1:0",
        retired_pending="0",
        nvlink="0+1",
        persistence="0:1,1:1,2:0",
        stray_mib="0:3000",
    )
    before = advice(node)
    assert before[0]["action"] == [0, 1] and before[2]["action"] == [0, 2] and before[1]["action"] == [0, 0]
    assert before[0]["reset_status"] == 3  # the deprecated field: NVML_ERROR_NOT_SUPPORTED in its own status
    assert before[0]["rows"] == [2, 1, 1, 0] and before[0]["retired"] == 1 and before[1]["retired"] == 0
    assert [gpu["persistence"] for gpu in before] == [1, 1, 0]
    assert before[0]["peers"] == [bus[1], "NVMLError_InvalidArgument"]
    assert before[1]["peers"] == [bus[0], "NVMLError_InvalidArgument"]
    assert before[2]["peers"] == ["NVMLError_NotSupported"]
    assert before[0]["used"] == 3000

    code, text = smi(node, "--gpu-reset", "-i", "0")
    assert code == 255 and "must be reset with it" in text and bus[1] in text
    code, text = smi(node, "--gpu-reset", "-i", "0,1")
    assert code == 255 and "GPU %s: In use by another client" % bus[0] in text
    code, text = smi(node, "--gpu-reset", "-i", "GPU-00000000-0000-0000-0000-000000000000")
    assert code == 6
    assert smi(node, "-pm", "0", "-i", "0,1") == (
        0,
        "Disabled persistence mode for GPU %s.\nDisabled persistence mode for GPU %s.\nAll done.\n" % (bus[0], bus[1]),
    )
    node.set(kernel_clients="1")
    code, text = smi(node, "--gpu-reset", "-i", "%s,%s" % (node.info["gpus"][0]["uuid"], bus[1]))
    assert code == 255 and "GPU %s: In use by another client" % bus[1] in text and bus[0] not in text.split("\n\n")[0]
    node.set(kernel_clients=None)
    code, text = smi(node, "--gpu-reset", "-i", "0,1")
    assert code == 0 and text.endswith("All done.\n")
    after = advice(node)
    assert after[0]["used"] == 0 and after[0]["action"] == [0, 0] and after[0]["rows"] == [2, 1, 0, 0]
    assert after[0]["retired"] == 0 and after[2]["action"] == [0, 2]  # a reboot's advice outlives a reset
    assert [gpu["persistence"] for gpu in after] == [0, 0, 0]


def test_a_process_with_the_device_file_open_or_a_lost_gpu_refuses_the_reset(simnode):
    node = simnode(gpus=2, nvidia_smi=True)
    node.set(persistence="0:0,1:0")
    holder = nodetools.start_nvml_monitor(node)
    node.set(lost="1")
    code, text = smi(node, "--gpu-reset", "-i", "0")
    assert code == 255 and "In use by another client" in text, holder
    assert smi(node, "--gpu-reset", "-i", "1")[0] == 15


def test_systemctl_starts_a_unit_in_its_cgroup_and_kmsg_takes_records(simnode):
    node = simnode(gpus=1)
    if node.info.get("cgroup") is None:
        pytest.skip("this machine gives simulated nodes no owner cgroups: %s" % node.info.get("cgroup_unsupported"))
    pid = nodetools.start_gpu_daemon_unit(node, "nvidia-persistenced.service", "nvidia-persistenced", "persistenced")
    cgroup = node.exec("cat", "/proc/%d/cgroup" % pid).stdout
    assert "name=systemd:/system.slice/nvidia-persistenced.service" in cgroup
    assert node.exec("readlink", "/proc/%d/exe" % pid).stdout.strip().endswith("/nvidia-persistenced")
    node.exec("systemctl", "stop", "nvidia-persistenced")
    assert nodetools.unit_main_pid(node, "nvidia-persistenced.service") == 0
    node.exec("systemctl", "start", "nvidia-persistenced")
    assert nodetools.wait_for(lambda: nodetools.unit_main_pid(node, "nvidia-persistenced.service"), 10, 0.02, "up")
    assert node.exec("systemctl", "start", "nvidia-dcgm", check=False).returncode == 5
    nodetools.log_xid(node, 0, 79, "pid=1234, GPU has fallen off the bus.")
    record = node.exec("cat", "/dev/kmsg").stdout
    assert record.startswith("3,0,") and record.endswith(
        ";NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n"
    )
