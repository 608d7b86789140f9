"""_kernel_log and _recovery on data: Xid lines, the driver's advice, what a GPU needs (docs/recovery.md)."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _kernel_log, _nvml, _recovery

XID_79 = "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."


def kmsg(path, *records):
    """A kernel log file: records (seconds since boot, message) in /dev/kmsg's format, with a continuation line."""
    lines = []
    for number, (at_s, message) in enumerate(records):
        lines.append("3,%d,%d,-;%s\n SUBSYSTEM=pci\n" % (number, int(at_s * 1e6), message))
    path.write_text("".join(lines))
    return str(path)


def test_xid_lines_are_read_with_their_gpu_age_and_kind(tmp_path):
    path = kmsg(
        tmp_path / "kmsg",
        (100.0, "eth0: link up"),
        (200.0, XID_79),
        (250.5, "NVRM: Xid (PCI:0000:18:00): 13, pid=42, name=python, Graphics SM Warp Exception"),
        (260.0, "NVRM: Xid (0000:18:00): 63, Row Remapper: New row marked for remapping, reset gpu to activate."),
    )
    records, error = _kernel_log.read(path)
    assert error is None and len(records) == 4 and records[0] == (100.0, "eth0: link up")
    found = _kernel_log.xids(records, now_s=300.0)
    assert [(x["xid"], x["pci"], x["age_s"], x["needs"]) for x in found] == [
        (79, "0000:2b:00", 100.0, "reboot"),
        (13, "0000:18:00", 49.5, None),
        (63, "0000:18:00", 40.0, "reset"),
    ]
    assert found[0]["text"] == "GPU has fallen off the bus." and found[1]["why"] is None


def test_a_kernel_log_that_cannot_be_read_says_why(tmp_path):
    records, error = _kernel_log.read(str(tmp_path / "absent"))
    assert records == [] and "cannot be read" in error and str(tmp_path / "absent") in error


def test_nvml_bus_ids_become_the_xid_lines_addresses():
    assert _kernel_log.pci_key("00000000:2B:00.0") == "0000:2b:00"
    assert _kernel_log.pci_key("00000001:18:00.0") == "0001:18:00"
    assert _kernel_log.pci_key(None) is None and _kernel_log.pci_key("bogus") is None


class _Error(Exception):
    pass


def fake_nvml(action=0, field_status=0, rows=(0, 0, 0, 0), pending=0, persistence=1, links=(), missing=()):
    """A pynvml stand-in for one GPU: `links` are (remote type, bus id) of its active NVLinks."""

    def field_values(_handle, ids):
        assert ids == [230]
        return [types.SimpleNamespace(nvmlReturn=field_status, value=types.SimpleNamespace(uiVal=action))]

    def link_state(_handle, link):
        if not links:
            raise _Error("Not Supported")
        if link >= 4:
            raise _Error("Invalid Argument")
        return 1 if link < len(links) else 0

    calls = {
        "nvmlDeviceGetHandleByIndex": lambda index: "handle",
        "nvmlDeviceGetFieldValues": field_values,
        "nvmlDeviceGetRemappedRows": lambda _h: rows,
        "nvmlDeviceGetRetiredPagesPendingStatus": lambda _h: pending,
        "nvmlDeviceGetPersistenceMode": lambda _h: persistence,
        "nvmlDeviceGetNvLinkState": link_state,
        "nvmlDeviceGetNvLinkRemoteDeviceType": lambda _h, link: links[link][0],
        "nvmlDeviceGetNvLinkRemotePciInfo": lambda _h, link: types.SimpleNamespace(busId=links[link][1].encode()),
    }
    for name in missing:
        calls[name] = lambda *args, name=name: _raise(_Error("Function Not Found"))
    return types.SimpleNamespace(**calls)


def _raise(error):
    raise error


def test_a_reading_with_advice_imports_nothing_more_in_the_nvml_worker(monkeypatch):
    # The worker is forked before the module judges the advice (_recovery): a module_utils it imported there would be
    # compiled twice on every run, in the worker and in the module (Ansible ships module_utils as source).
    package = "ansible_collections.gpuops.nvidia.plugins.module_utils.gpu."
    for name in ("_recovery", "_kernel_log"):
        monkeypatch.delitem(sys.modules, package + name)
        monkeypatch.delattr(sys.modules[package[:-1]], name)
    monkeypatch.setattr(_nvml, "read_gpu", lambda pynvml, index, list_versions=None: {"index": index})
    nvml = fake_nvml(action=1)
    for name, value in (
        ("NVMLError", _Error),
        ("nvmlDeviceGetCount", lambda: 1),
        ("nvmlSystemGetDriverVersion", lambda: "580"),
    ):
        setattr(nvml, name, value)
    nvml.nvmlSystemGetNVMLVersion = nvml.nvmlSystemGetCudaDriverVersion = lambda: "13"
    reading = _nvml.read_driver(nvml, initialized=True, advice=True)
    assert [advice["recovery_action"] for advice in reading["advice"]] == ["gpu_reset"]
    assert [name for name in ("_recovery", "_kernel_log") if package + name in sys.modules] == []


def test_the_driver_advice_of_one_gpu():
    advice = _nvml.read_advice(
        fake_nvml(action=4, rows=(2, 1, 1, 0), links=((0, "00000000:2A:00.0"), (2, "00000000:00:01.0"))), 0
    )
    assert advice["recovery_action"] == "drain_and_reset" and advice["persistence_mode"] is True
    assert advice["remapped_rows"] == {"correctable": 2, "uncorrectable": 1, "pending": True, "failure": False}
    assert advice["nvlink_peers"] == ["00000000:2A:00.0"] and advice["nvlink_switch"] is True
    assert advice["errors"] == [] and advice["retired_pages_pending"] is False


def test_a_driver_without_the_field_or_the_calls_answers_none_and_says_why():
    advice = _nvml.read_advice(
        fake_nvml(field_status=3, missing=("nvmlDeviceGetRemappedRows", "nvmlDeviceGetPersistenceMode")), 1
    )
    assert advice["recovery_action"] is None and advice["remapped_rows"] is None
    assert advice["persistence_mode"] is None and advice["nvlink_peers"] == []
    assert any("field 230" in error for error in advice["errors"])
    assert any("nvmlDeviceGetRemappedRows" in error for error in advice["errors"])


@pytest.mark.parametrize(
    "advice, xids, need",
    [
        ({"recovery_action": "none"}, [], None),
        ({"recovery_action": "gpu_reset"}, [], "reset"),
        ({"recovery_action": "drain_and_reset"}, [], "reset"),
        ({"recovery_action": "node_reboot"}, [], "reboot"),
        ({"recovery_action": "bus_reset"}, [], "other"),
        ({"remapped_rows": {"pending": True, "failure": False}}, [], "reset"),
        ({"remapped_rows": {"pending": True, "failure": True}}, [], "other"),
        ({"retired_pages_pending": True}, [], "reset"),
        ({"recovery_action": "gpu_reset"}, [79], "reboot"),
        ({"recovery_action": "none"}, [13], None),
    ],
)
def test_what_a_gpu_needs_the_reboot_first(advice, xids, need):
    found = [
        {
            "xid": x,
            "pci": "0000:18:00",
            "age_s": 5.0,
            "text": "",
            "needs": _kernel_log.XID_KINDS.get(x, (None,))[0],
            "why": _kernel_log.XID_KINDS.get(x, (None, None))[1],
        }
        for x in xids
    ]
    got, why = _recovery._needs(advice, found)
    assert got == need and (bool(why) == (need is not None))


def test_recovery_joins_advice_peers_and_recent_xids_since_the_last_reset(tmp_path):
    (tmp_path / "uptime").write_text("100000.00 5.00\n")
    path = kmsg(
        tmp_path / "kmsg",
        (1000.0, "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."),  # a day and more ago: not recent
        (99000.0, "NVRM: Xid (PCI:0000:2a:00): 46, GPU stopped processing"),  # before GPU 1's last reset
        (99990.0, "NVRM: Xid (PCI:0000:18:00): 63, reset gpu to activate."),
    )
    resets = tmp_path / "resets.json"
    _recovery.note_reset(["0000:2a:00"], 99500.0, str(resets))
    gpus = [{"index": 0, "pci_bus_id": "00000000:18:00.0"}, {"index": 1, "pci_bus_id": "00000000:2A:00.0"}]
    advice = [
        _nvml.read_advice(fake_nvml(action=0, links=((0, "00000000:2A:00.0"),)), 0),
        _nvml.read_advice(fake_nvml(action=0, links=((0, "00000000:18:00.0"),)), 1),
    ]
    advice[1]["index"] = 1
    _recovery.recovery(gpus, advice, proc=str(tmp_path), kmsg=path, resets_file=str(resets))
    first, second = gpus[0]["recovery"], gpus[1]["recovery"]
    assert [x["xid"] for x in first["xids"]] == [63] and first["needs"] == "reset"
    assert first["reset_peers"] == [1] and second["reset_peers"] == [0]
    assert second["xids"] == [] and second["needs"] is None and second["xid_error"] is None
    assert json.loads(resets.read_text()) == {"0000:2a:00": 99500.0}
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_the_gpus_that_need_something_are_worded_with_the_next_step():
    gpus = [
        {"index": 0, "recovery": {"needs": "reboot", "why": ["Xid 79 5 s ago: gone"]}},
        {"index": 1, "recovery": {"needs": "reset", "why": ["the driver's recovery action is gpu_reset"]}},
        {"index": 2, "recovery": {"needs": None, "why": []}},
        {"index": 3, "recovery": {"needs": "reset", "why": ["not selected"]}},
    ]
    advice = _recovery.needing(gpus, [0, 1, 2])
    assert [item["index"] for item in advice] == [0, 1]
    words = _recovery.advice_words(advice, "gpu07")
    assert words.startswith("GPU 0 needs a reboot: Xid 79 5 s ago: gone; next: reboot the node")
    assert "GPU 1 needs a GPU reset: the driver's recovery action is gpu_reset; next: ansible-playbook " in words
    assert "gpuops.nvidia.reset_gpus -l gpu07 -e reset_gpus_gpu_reset=true" in words and "GPU 3" not in words


def test_the_guard_exports_the_recovery_action_and_the_xids_per_gpu():
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _guard_metrics

    recovery = {"action": "drain_and_reset", "xids": [{"xid": 79}, {"xid": 13}, {"xid": 13}]}
    gpu = {"index": 0, "uuid": "GPU-1", "memory_used_mib": 1, "holder_pids": [], "exited": [], "recovery": recovery}
    plain = dict(gpu, index=1, uuid="GPU-2", recovery=None)
    text = _guard_metrics.render(_guard_metrics.samples({"gpus": [gpu, plain], "driver": {}}, [], [], True, 1.0))
    assert 'gpuops_nvidia_guard_gpu_recovery_action{gpu="0",uuid="GPU-1"} 4\n' in text
    assert 'gpuops_nvidia_guard_gpu_xid_errors{gpu="0",uuid="GPU-1",xid="13"} 2\n' in text
    assert 'gpuops_nvidia_guard_gpu_xid_errors{gpu="0",uuid="GPU-1",xid="79"} 1\n' in text
    assert 'recovery_action{gpu="1"' not in text


def test_check_gpus_fails_a_free_host_whose_driver_advises_a_reset():
    from ansible_collections.gpuops.nvidia.plugins.filter.reports import reports

    result = {
        "released": True,
        "memory_checked": True,
        "gpus": [{"index": 1, "memory_used_mib": 0}],
        "advice": [{"index": 1, "needs": "reset", "why": ["rows are pending remapping, which a GPU reset applies"]}],
    }
    status, words = reports.check_gpus_status(result, False, 256, "gpu07")
    assert status == "not_free" and words.startswith("not free: GPU 1 needs a GPU reset: rows are pending")
    assert "-l gpu07 -e reset_gpus_gpu_reset=true" in words
