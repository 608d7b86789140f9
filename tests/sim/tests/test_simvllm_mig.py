"""What the simulated vLLM's CUDA sees on a node with MIG (simvllm.gpu.NodeGpus.enumerate), per the MIG user guide,
"CUDA Device Enumeration" (tests/sim/README.md, "MIG devices in CUDA_VISIBLE_DEVICES"). The MIG layout is given
directly here; on a node it comes from the fake driver's NVML (tests/integration/test_vllm_mig.py runs it there)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SIM_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SIM_DIR))

from simvllm.gpu import MigDevice, NodeGpus  # noqa: E402

PARENT = "GPU-6c16765d-16dd-a103-91f9-6219aab66db3"
GI2 = MigDevice(0, "MIG-faeb70ae-26c6-92be-9676-35b9d7590cee", 2, 0, 40448, PARENT)
GI4 = MigDevice(0, "MIG-f59c197e-f944-ff87-12c7-c8a16a719d81", 4, 0, 20096, PARENT)


def gpus(tmp_path, mig="0;2:"):
    node = NodeGpus(run_dir=str(tmp_path), count=3, memory_total_mib=81559, minors=[0, 1, 2], reserved_mib=529, mig=mig)
    node.__dict__["mig_devices"] = (
        {0: [GI2, GI4], 2: []} if mig else {}
    )  # what NVML answers: GPU 2 in MIG mode, no instance
    return node


@pytest.mark.parametrize(
    "visible, expected",
    [
        (GI4.uuid, ([0], GI4)),  # MIG-<UUID> (R470+)
        ("MIG-%s/4/0" % PARENT, ([0], GI4)),  # MIG-<GPU-UUID>/<GI>/<CI> (R450/R460)
        ("1,%s" % GI4.uuid, ([0], GI4)),  # no non-MIG GPU beside a MIG device
        ("%s,%s" % (GI4.uuid, GI2.uuid), ([0], GI4)),  # a single MIG device: the first visible
        ("0", ([0], GI2)),  # a GPU in MIG mode: its first instance
        (None, ([0], GI2)),  # unset: every GPU, so the first MIG device
        ("1,2", ([1], None)),  # GPU 2 in MIG mode without instance: nothing from it
        ("MIG-00000000-0000-0000-0000-000000000000,1", ([], None)),  # an unknown entry ends the list
    ],
)
def test_mig_devices_in_cuda_visible_devices(tmp_path, visible, expected):
    assert gpus(tmp_path).enumerate(visible) == expected


def test_without_mig_a_mig_uuid_ends_the_list(tmp_path):
    assert gpus(tmp_path, mig="").enumerate("1,%s,2" % GI4.uuid) == ([1], None)


def test_context_on_a_mig_device_counts_against_that_instance_only(tmp_path):
    node = gpus(tmp_path)
    (tmp_path / "contexts").mkdir()
    (tmp_path / "contexts" / "11").write_text("0 18086 compute gi=4 ci=0\n")
    (tmp_path / "contexts" / "12").write_text("0 1000 compute gi=2\n")  # ci defaults to 0, as in the fake driver
    assert (node.context_mib(0, GI4), node.context_mib(0, GI2), node.context_mib(0)) == (18086, 1000, 19086)
