"""tests/gpu/gpucheck/driver.py's readings of every GPU and of MIG mode, against a stand-in for pynvml."""

from types import SimpleNamespace

from gpucheck import driver

MIB = 1 << 20


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__("NVML error %d" % value)
        self.value = value


class FakeNvml:
    """pynvml's calls as driver.Gpu uses them: GPUs by handle (their index), lists per GPU, MIG per GPU."""

    NVMLError = NVMLError
    nvmlMemory_v2 = object()

    def __init__(self, gpus):
        self.gpus = gpus
        self.calls = []

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        used = self.gpus[handle]["used_mib"] * MIB
        if version is None:
            return SimpleNamespace(total=0, free=0, used=used + 529 * MIB)
        return SimpleNamespace(total=0, free=0, used=used, reserved=529 * MIB)

    def _list(self, name, handle):
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * MIB)
            for pid, mib in self.gpus[handle].get(name, {}).items()
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self._list("compute", handle)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return self._list("graphics", handle)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle):
        if self.gpus[handle].get("mps") == "unsupported":
            raise NVMLError(driver.NVML_ERROR_NOT_SUPPORTED)
        return self._list("mps", handle)

    def __getattr__(self, name):  # any other call (nvmlDeviceSetMigMode...) is recorded, then fails
        self.calls.append((name, None))
        raise AttributeError(name)

    def nvmlDeviceGetMigMode(self, handle):
        self.calls.append(("nvmlDeviceGetMigMode", handle))
        mig = self.gpus[handle].get("mig")
        if mig is None:
            raise NVMLError(driver.NVML_ERROR_NOT_SUPPORTED)
        return list(mig)


def test_every_gpus_lists_and_memory():
    nvml = FakeNvml(
        [
            {"used_mib": 1024, "compute": {10: 1024}, "mps": "unsupported"},
            {"used_mib": 6000, "compute": {11: 4000}, "graphics": {11: 2000, 12: None}},
        ]
    )
    gpu = driver.Gpu(nvml, 0)
    assert gpu.all_processes() == {
        0: {10: {"lists": ["compute"], "used_mib": 1024}},
        1: {11: {"lists": ["compute", "graphics"], "used_mib": 4000}, 12: {"lists": ["graphics"], "used_mib": None}},
    }
    assert gpu.all_used_mib() == {0: 1024, 1: 6000}
    assert gpu.processes() == {10: {"lists": ["compute"], "used_mib": 1024}}


def test_mig_mode_is_read_never_set():
    nvml = FakeNvml([{"used_mib": 0, "mig": (1, 0)}, {"used_mib": 0}])
    assert driver.Gpu(nvml, 0).mig_mode() == {"current": 1, "pending": 0, "error": None}
    assert driver.Gpu(nvml, 1).mig_mode() == {"current": None, "pending": None, "error": "NVML error 3"}
    assert [name for name, _handle in nvml.calls] == ["nvmlDeviceGetMigMode"] * 2  # nothing else asked, nothing set
