"""Tests of the fake NVIDIA driver library (tests/sim/fakenvml) through the real pynvml.

They run outside a simulated node: a temporary run directory (GPUSIM_RUN) whose node.conf points
dev_dir at regular files <tmp>/dev/nvidia<minor> and proc_dir at /proc. pynvml runs in a child
Python with LD_LIBRARY_PATH set at its start. Holders are processes started here that open a
device file, seek it to their PID (or map it at PID*4096) and write their context file, as the
contract (tests/sim/README.md) says; they end when their stdin closes.
"""

import json
import os
import select
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import polling

REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "tests" / "sim" / "fakenvml" / "build.sh"
MIB = 1 << 20
MINORS = [3, 1, 7, 0, 5, 2, 6, 4]  # index -> minor: deliberately not the identity
TOTAL_MIB = 81559
RESERVED_MIB = 529

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None,
    reason="gcc is missing: the fake NVML library (tests/sim/fakenvml/build.sh) cannot be built",
)

# Runs in a child Python before each NVML snippet; the snippet prints its result with emit().
PROLOGUE = """
import ctypes, json, os, sys, time
import pynvml as N
MIB = 1 << 20
def emit(value):
    print(json.dumps(value), flush=True)
def used_v2(index):
    return N.nvmlDeviceGetMemoryInfo(N.nvmlDeviceGetHandleByIndex(index), version=N.nvmlMemory_v2).used // MIB
def compute_pids(index):
    handle = N.nvmlDeviceGetHandleByIndex(index)
    return [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(handle)]
"""

# A holder: argv = run dir, how it holds (fd | map | fork), JSON [[device, index, MiB, type]...].
HOLDER = r"""
import ctypes, json, os, sys
run_dir, hold, lines = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
token = os.getpid()
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
PROT_READ, MAP_SHARED, MAP_FAILED = 1, 1, ctypes.c_void_p(-1).value
for device, _, _, _ in lines:
    fd = os.open(device, os.O_RDWR)
    if hold == "map":
        if libc.mmap(None, 4096, PROT_READ, MAP_SHARED, fd, token * 4096) == MAP_FAILED:
            sys.exit(f"mmap failed: errno {ctypes.get_errno()}")
        os.close(fd)
    else:
        os.lseek(fd, token, os.SEEK_SET)
context = os.path.join(run_dir, "contexts", str(token))
with open(context + ".tmp", "w") as f:
    f.writelines(f"{index} {mib} {kind}\n" for _, index, mib, kind in lines)
os.rename(context + ".tmp", context)
if hold == "fork":
    child = os.fork()
    if child:
        print("ready", token, child, flush=True)
        os._exit(0)
else:
    print("ready", token, flush=True)
sys.stdin.read()
"""

# A holder whose main thread exits (pthread_exit) while another thread keeps the device open.
THREAD_HOLDER_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char **args; /* device contexts_dir index MiB */

static void *hold(void *unused)
{
    (void)unused;
    char path[4096], tmp[4096];
    int fd = open(args[1], O_RDWR);
    if (fd < 0 || lseek(fd, getpid(), SEEK_SET) != getpid())
        _exit(2);
    snprintf(path, sizeof path, "%s/%d", args[2], getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        _exit(2);
    fprintf(f, "%s %s compute\n", args[3], args[4]);
    fclose(f);
    if (rename(tmp, path) != 0)
        _exit(2);
    printf("ready %d\n", getpid());
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    _exit(0);
}

int main(int argc, char **argv)
{
    pthread_t thread;
    if (argc != 5)
        return 2;
    args = argv;
    if (pthread_create(&thread, NULL, hold, NULL) != 0)
        return 2;
    pthread_exit(NULL);
}
"""


def poll(predicate, timeout, interval=0.02):
    """polling.poll_until every 20 ms: the truthy value, or None after `timeout` s."""
    return polling.poll_until(predicate, timeout, interval)


class Holder:
    """A holder process started by this test (and, for hold="fork", its forked child)."""

    def __init__(self, proc):
        self.proc = proc
        self.token = None  # its PID, the context token
        self.child_pidfd = None

    def end(self, timeout=10):
        """Closes the holder's stdin, which makes it (and a forked child) exit; waits for that."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.proc.wait(timeout)
        if self.child_pidfd is not None:
            readable = select.select([self.child_pidfd], [], [], timeout)[0]
            assert readable, "forked holder child did not exit"
            os.close(self.child_pidfd)
            self.child_pidfd = None


class FakeNode:
    """A run directory, device files and node.conf for the fake driver, outside any namespace."""

    def __init__(self, root, library_dir):
        self.run_dir = root / "run"
        self.dev_dir = root / "dev"
        self.contexts_dir = self.run_dir / "contexts"
        self.contexts_dir.mkdir(parents=True)
        self.dev_dir.mkdir()
        for name in ["nvidiactl"] + [f"nvidia{minor}" for minor in MINORS]:
            (self.dev_dir / name).touch()
        self.env = dict(os.environ, GPUSIM_RUN=str(self.run_dir), LD_LIBRARY_PATH=str(library_dir))
        self.holders = []
        self.knobs = {
            "gpus": len(MINORS),
            "minors": ",".join(map(str, MINORS)),
            "memory_total_mib": TOTAL_MIB,
            "reserved_mib": RESERVED_MIB,
            "release_latency": 0.3,
            "dev_dir": self.dev_dir,
            "proc_dir": "/proc",
        }
        self.set()

    def set(self, **knobs):
        """Updates node.conf (atomically) with these key=value knobs."""
        self.knobs.update(knobs)
        conf = self.run_dir / "node.conf"
        tmp = self.run_dir / "node.conf.tmp"
        tmp.write_text("".join(f"{key}={value}\n" for key, value in self.knobs.items()))
        tmp.rename(conf)

    def device(self, index):
        """Path of GPU index's device file."""
        return str(self.dev_dir / f"nvidia{MINORS[index]}")

    def nvml(self, body, timeout=60):
        """Runs PROLOGUE + body in a child Python; returns the JSON of its last emit()."""
        script = PROLOGUE + textwrap.dedent(body)
        proc = subprocess.run(
            [sys.executable, "-c", script], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.splitlines()[-1])

    def start_nvml(self, body):
        """Starts PROLOGUE + body in a child Python without waiting (stdout piped)."""
        script = PROLOGUE + textwrap.dedent(body)
        return subprocess.Popen(
            [sys.executable, "-c", script], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def _start_holder(self, argv):
        """Starts a holder; returns (Holder, extra numbers of its "ready TOKEN ..." line)."""
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        holder = Holder(proc)
        self.holders.append(holder)  # ended at teardown even if it never gets ready
        line = proc.stdout.readline().split()
        assert line[:1] == ["ready"], f"holder {argv} failed: {proc.stderr.read()}"
        holder.token = int(line[1])
        return holder, [int(value) for value in line[2:]]

    def hold(self, contexts, hold="fd"):
        """Starts a holder of contexts [(index, MiB, type)]; returns the Holder once it is ready."""
        # An MPS client's handle is /dev/nvidiactl (tests/sim/README.md, "MPS clients").
        lines = [
            [str(self.dev_dir / "nvidiactl") if kind == "mps" else self.device(index), index, mib, kind]
            for index, mib, kind in contexts
        ]
        holder, extra = self._start_holder([sys.executable, "-c", HOLDER, str(self.run_dir), hold, json.dumps(lines)])
        if hold == "fork":
            holder.child_pidfd = os.pidfd_open(extra[0])  # alive: it waits on stdin
        return holder

    def hold_in_thread(self, program, index, mib):
        """Starts the C thread holder on GPU index; returns the Holder once it is ready."""
        started = self._start_holder([str(program), self.device(index), str(self.contexts_dir), str(index), str(mib)])
        return started[0]

    def end_holders(self):
        for holder in self.holders:
            holder.end()


@pytest.fixture(scope="session")
def library_dir():
    """Builds the fake library with build.sh; returns its directory."""
    result = subprocess.run([str(BUILD_SCRIPT)], check=True, capture_output=True, text=True)
    library = Path(result.stdout.strip())
    assert library.name == "libnvidia-ml.so.1" and library.is_file()
    return library.parent


@pytest.fixture()
def node(tmp_path, library_dir):
    fake = FakeNode(tmp_path, library_dir)
    yield fake
    fake.end_holders()


@pytest.fixture(scope="module")
def thread_holder(tmp_path_factory):
    """The C thread holder, compiled with gcc."""
    build = tmp_path_factory.mktemp("thread_holder")
    source = build / "thread_holder.c"
    source.write_text(THREAD_HOLDER_C)
    program = build / "thread_holder"
    subprocess.run(["gcc", "-O2", "-Wall", "-pthread", "-o", str(program), str(source)], check=True)
    return program


def test_build_is_idempotent_and_rebuilds_newer_source(tmp_path):
    # On a copy of tests/sim/fakenvml/, which builds into the copy's own build/: the shared tests/sim/build/ is
    # what running nodes and other test processes load and rebuild (gpunode's build lock), and its mtimes are not
    # this test's to move.
    source_dir = tmp_path / "sim" / "fakenvml"
    shutil.copytree(BUILD_SCRIPT.parent, source_dir)
    script = source_dir / BUILD_SCRIPT.name
    library = tmp_path / "sim" / "build" / "libnvidia-ml.so.1"

    def build(*args):
        result = subprocess.run([str(script), *args], check=True, capture_output=True, text=True)
        assert result.stdout.strip() == str(library), result.stdout
        return library.stat().st_mtime_ns

    before = build()
    assert build() == before
    source_mtime = (source_dir / "fakenvml.c").stat().st_mtime_ns
    os.utime(library, ns=(source_mtime - 10**9, source_mtime - 10**9))  # source now newer
    assert build() >= source_mtime
    future = time.time_ns() + 3600 * 10**9
    os.utime(library, ns=(future, future))  # library newer: only --force rebuilds
    assert build() == future
    assert build("--force") < future


def test_eight_devices_identity(node):
    result = node.nvml("""
        N.nvmlInit()
        gpus = []
        for index in range(N.nvmlDeviceGetCount()):
            handle = N.nvmlDeviceGetHandleByIndex(index)
            uuid = N.nvmlDeviceGetUUID(handle)
            pci = N.nvmlDeviceGetPciInfo(handle)
            gpus.append({
                "index": N.nvmlDeviceGetIndex(handle),
                "name": N.nvmlDeviceGetName(handle),
                "uuid": uuid,
                "index_by_uuid": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(uuid)),
                "minor": N.nvmlDeviceGetMinorNumber(handle),
                "bus_id": pci.busId,
                "bus_id_legacy": pci.busIdLegacy,
                "pci": [pci.domain, pci.bus, pci.device, pci.pciDeviceId],
                "persistence": N.nvmlDeviceGetPersistenceMode(handle),
            })
        emit({
            "driver": N.nvmlSystemGetDriverVersion(),
            "nvml": N.nvmlSystemGetNVMLVersion(),
            "cuda": [N.nvmlSystemGetCudaDriverVersion(), N.nvmlSystemGetCudaDriverVersion_v2()],
            "gpus": gpus,
        })
    """)
    assert result["driver"] == "580.95.05"
    assert result["nvml"] == "13.580.95.05"
    assert result["cuda"] == [13000, 13000]
    gpus = result["gpus"]
    assert [gpu["index"] for gpu in gpus] == list(range(8))
    assert [gpu["index_by_uuid"] for gpu in gpus] == list(range(8))
    assert [gpu["minor"] for gpu in gpus] == MINORS
    assert {gpu["name"] for gpu in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {gpu["persistence"] for gpu in gpus} == {1}
    uuids = [gpu["uuid"] for gpu in gpus]
    assert len(set(uuids)) == 8
    for uuid in uuids:
        assert uuid.startswith("GPU-") and [len(part) for part in uuid[4:].split("-")] == [8, 4, 4, 4, 12]
    bus_ids = [gpu["bus_id"] for gpu in gpus]
    assert len(set(bus_ids)) == 8
    for gpu in gpus:
        domain, bus, device, device_id = gpu["pci"]
        assert gpu["bus_id"] == f"{domain:08X}:{bus:02X}:{device:02X}.0"
        assert gpu["bus_id_legacy"] == f"{domain:04X}:{bus:02X}:{device:02X}.0"
        assert device_id & 0xFFFF == 0x10DE  # NVIDIA's vendor id


def test_configured_identity_and_live_knobs(node):
    uuids = [f"GPU-00000000-0000-0000-0000-00000000000{index}" for index in range(2)]
    node.set(
        gpus=2,
        name="NVIDIA A100-SXM4-80GB",
        uuids=",".join(uuids),
        pci_bus_ids="0000:07:00.0,00000001:0F:00.0",
        persistence_mode=0,
        driver_version="550.1",
    )
    result = node.nvml("""
        N.nvmlInit()
        handles = [N.nvmlDeviceGetHandleByIndex(index) for index in range(N.nvmlDeviceGetCount())]
        before = [N.nvmlDeviceGetUUID(h) for h in handles], [N.nvmlDeviceGetPciInfo(h).busId for h in handles]
        with open(os.environ["GPUSIM_RUN"] + "/node.conf", "a") as conf:
            conf.write("gpus=3\\ndriver_version=550.2\\n")
        emit({"before": before, "name": N.nvmlDeviceGetName(handles[0]),
              "persistence": N.nvmlDeviceGetPersistenceMode(handles[1]),
              "count_after": N.nvmlDeviceGetCount(), "driver_after": N.nvmlSystemGetDriverVersion()})
    """)
    assert result["before"] == [uuids, ["00000000:07:00.0", "00000001:0F:00.0"]]
    assert result["name"] == "NVIDIA A100-SXM4-80GB"
    assert result["persistence"] == 0
    assert result["count_after"] == 3
    assert result["driver_after"] == "550.2"


def test_memory_v1_includes_reserved_v2_reports_it(node):
    node.set(idle_used_mib=12, stray_mib="1:2000,1:48,6:100")
    result = node.nvml("""
        N.nvmlInit()
        memory = {}
        for index in (0, 1, 6):
            handle = N.nvmlDeviceGetHandleByIndex(index)
            v1 = N.nvmlDeviceGetMemoryInfo(handle)
            v2 = N.nvmlDeviceGetMemoryInfo(handle, version=N.nvmlMemory_v2)
            memory[index] = {"v1": [v1.total, v1.free, v1.used],
                             "v2": [v2.version, v2.total, v2.reserved, v2.free, v2.used]}
        emit(memory)
    """)
    for index, used_mib in (("0", 12), ("1", 12 + 2048), ("6", 112)):
        total, free = TOTAL_MIB * MIB, (TOTAL_MIB - RESERVED_MIB - used_mib) * MIB
        assert result[index]["v2"] == [0x02000028, total, RESERVED_MIB * MIB, free, used_mib * MIB]
        assert result[index]["v1"] == [total, free, (used_mib + RESERVED_MIB) * MIB]


def test_context_listed_with_its_memory_by_type(node):
    holder = node.hold([(2, 1024, "compute"), (5, 300, "graphics"), (6, 200, "mps")])
    result = node.nvml("""
        N.nvmlInit()
        lists = {}
        for index in (0, 2, 5, 6):
            handle = N.nvmlDeviceGetHandleByIndex(index)
            lists[index] = {
                "used": used_v2(index),
                "compute": [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId]
                            for p in N.nvmlDeviceGetComputeRunningProcesses(handle)],
                "graphics": [[p.pid, p.usedGpuMemory] for p in N.nvmlDeviceGetGraphicsRunningProcesses(handle)],
                "mps": [[p.pid, p.usedGpuMemory] for p in N.nvmlDeviceGetMPSComputeRunningProcesses(handle)],
            }
        emit(lists)
    """)
    pid = holder.token
    assert result["0"] == {"used": 0, "compute": [], "graphics": [], "mps": []}
    assert result["2"] == {
        "used": 1024,
        "compute": [[pid, 1024 * MIB, 0xFFFFFFFF, 0xFFFFFFFF]],
        "graphics": [],
        "mps": [],
    }
    assert result["5"] == {"used": 300, "compute": [], "graphics": [[pid, 300 * MIB]], "mps": []}
    # An MPS client is in the compute list too, with the same memory, counted once in `used` (measured on an
    # NVIDIA H200, driver 580.159.04: tests/fixtures/hardware/h200-580.159.04/probe4-ipc-mps.json).
    assert result["6"] == {
        "used": 200,
        "compute": [[pid, 200 * MIB, 0xFFFFFFFF, 0xFFFFFFFF]],
        "graphics": [],
        "mps": [[pid, 200 * MIB]],
    }


def test_count_probe_protocol_and_error_codes(node):
    holder = node.hold([(4, 512, "compute")])
    result = node.nvml("""
        from ctypes import byref, c_char_p, c_uint, create_string_buffer
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        lib.nvmlErrorString.restype = c_char_p
        count, device = c_uint(0), N.c_nvmlDevice_t()
        before_init = lib.nvmlDeviceGetCount_v2(byref(count))
        assert lib.nvmlInitWithFlags(0) == 0
        codes = {"before_init": before_init,
                 "bad_index": lib.nvmlDeviceGetHandleByIndex_v2(8, byref(device)),
                 "unknown_uuid": lib.nvmlDeviceGetHandleByUUID(b"GPU-no-such", byref(device)),
                 "error_string": lib.nvmlErrorString(6).decode()}
        assert lib.nvmlDeviceGetHandleByIndex_v2(4, byref(device)) == 0
        probe = c_uint(0)
        codes["probe"] = lib.nvmlDeviceGetComputeRunningProcesses_v3(device, byref(probe), None), probe.value
        infos = (N.c_nvmlProcessInfo_v3_t * 1)()
        fetched = c_uint(1)
        codes["fetch"] = lib.nvmlDeviceGetComputeRunningProcesses_v3(device, byref(fetched), infos), fetched.value
        codes["pid"] = infos[0].pid
        idle = c_uint(0)
        assert lib.nvmlDeviceGetHandleByIndex_v2(3, byref(device)) == 0
        codes["idle_probe"] = lib.nvmlDeviceGetComputeRunningProcesses_v3(device, byref(idle), None), idle.value
        memory = N.c_nvmlMemory_v2_t(version=0x01000028)
        codes["memory_version"] = lib.nvmlDeviceGetMemoryInfo_v2(device, byref(memory))
        short = create_string_buffer(8)
        codes["short_name"] = lib.nvmlDeviceGetName(device, short, c_uint(8))
        codes["forged_handle"] = lib.nvmlDeviceGetMinorNumber(ctypes.c_void_p(16), byref(count))
        emit(codes)
    """)
    assert result == {
        "before_init": 1,  # NVML_ERROR_UNINITIALIZED
        "bad_index": 2,  # NVML_ERROR_INVALID_ARGUMENT
        "unknown_uuid": 6,  # NVML_ERROR_NOT_FOUND
        "error_string": "Not Found",
        "probe": [7, 1],  # NVML_ERROR_INSUFFICIENT_SIZE, count filled in
        "fetch": [0, 1],
        "pid": holder.token,
        "idle_probe": [0, 0],  # nothing running: NVML_SUCCESS
        "memory_version": 25,  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        "short_name": 7,
        "forged_handle": 2,
    }


def test_uninitialized_after_final_shutdown(node):
    result = node.nvml("""
        N.nvmlInit()
        N.nvmlInit()
        N.nvmlShutdown()
        still = N.nvmlDeviceGetCount()
        N.nvmlShutdown()
        try:
            N.nvmlDeviceGetCount()
            after = "returned"
        except N.NVMLError_Uninitialized:
            after = "uninitialized"
        emit([still, after])
    """)
    assert result == [8, "uninitialized"]


def test_init_holds_device_files_at_position_zero(node):
    result = node.nvml("""
        def held():
            files = {}
            for fd in os.listdir("/proc/self/fd"):
                try:
                    target = os.readlink(f"/proc/self/fd/{fd}")
                    with open(f"/proc/self/fdinfo/{fd}") as info:
                        pos = int(info.readline().split()[1])
                except FileNotFoundError:  # the listing's own fd
                    continue
                if os.path.basename(target).startswith("nvidia"):
                    files[os.path.basename(target)] = pos
            return files
        states = [held()]
        N.nvmlInit(); N.nvmlInit()
        states.append(held())
        N.nvmlShutdown()
        states.append(held())
        N.nvmlShutdown()
        states.append(held())
        emit(states)
    """)
    expected = {"nvidiactl": 0, **{f"nvidia{minor}": 0 for minor in MINORS}}
    assert result == [{}, expected, expected, {}]


def test_inherited_handle_keeps_the_dead_creator_listed(node):
    """The driver lists a context under its creator's PID while any process holds its file (gpu_rmapi.c
    gpuGetProcWithObject_IMPL walks live clients; osapi.c RmFreeUnusedClients frees them at the last close)."""
    holder = node.hold([(1, 2048, "compute")], hold="fork")
    holder.proc.wait(10)  # the creator has exited; its forked child still has the fd
    node.set(release_latency=0.3)
    result = node.nvml("""
        N.nvmlInit()
        samples = []
        start = time.monotonic()
        while time.monotonic() - start < 1.0:  # well past release_latency
            samples.append([used_v2(1), compute_pids(1)])
            time.sleep(0.05)
        emit(samples)
    """)
    assert len(result) >= 5
    assert all(sample == [2048, [holder.token]] for sample in result), result
    holder.end()
    freed = node.nvml("""
        N.nvmlInit()
        start = time.monotonic()
        while used_v2(1) != 0 and time.monotonic() - start < 10:
            time.sleep(0.02)
        emit([used_v2(1), compute_pids(1)])
    """)
    assert freed == [0, []]
    assert not (node.contexts_dir / str(holder.token)).exists()


def test_device_file_is_matched_by_identity_not_path(node, tmp_path):
    """A handle opened through another name of the same file (a hard link here, a bind mount in a node) is a
    handle of that GPU; a different file named like a device file is none."""
    other = tmp_path / "elsewhere"
    other.mkdir()
    os.link(node.device(2), other / "gpu-two")
    (other / "nvidia3").touch()  # a regular file with a device's name: not the device
    direct = node.hold([(2, 700, "compute")])
    link_lines = [[str(other / "gpu-two"), 2, 700, "compute"]]
    via_link = node._start_holder([sys.executable, "-c", HOLDER, str(node.run_dir), "fd", json.dumps(link_lines)])[0]
    fake = node._start_holder(
        [
            sys.executable,
            "-c",
            HOLDER,
            str(node.run_dir),
            "fd",
            json.dumps([[str(other / "nvidia3"), 0, 900, "compute"]]),
        ]
    )[0]
    result = node.nvml("""
        N.nvmlInit()
        emit({"2": [used_v2(2), sorted(compute_pids(2))], "0": [used_v2(0), compute_pids(0)]})
    """)
    # The look-alike holds no handle: its context is released as soon as a call sees it (listed, like any context,
    # until the release_latency that follows), never held.
    assert result["2"] == [1400, sorted([direct.token, via_link.token])]
    assert result["0"][1] in ([], [fake.token])
    assert node.nvml("""
        N.nvmlInit()
        time.sleep(0.5)
        emit([used_v2(0), compute_pids(0)])
    """) == [0, []]


def test_memory_info_unsupported_lists_still_answer(node):
    """memory_info=unsupported (a GB10): memory v1 and v2 answer NOT_SUPPORTED, the lists report each process."""
    holder = node.hold([(0, 1500, "compute"), (0, 40, "graphics")])
    node.set(memory_info="unsupported")
    result = node.nvml("""
        N.nvmlInit()
        handle = N.nvmlDeviceGetHandleByIndex(0)
        answers = []
        for call in (lambda: N.nvmlDeviceGetMemoryInfo(handle),
                     lambda: N.nvmlDeviceGetMemoryInfo(handle, version=N.nvmlMemory_v2)):
            try:
                call()
                answers.append("answered")
            except N.NVMLError_NotSupported:
                answers.append("NotSupported")
        emit({"memory": answers,
              "compute": [[p.pid, p.usedGpuMemory // MIB] for p in N.nvmlDeviceGetComputeRunningProcesses(handle)],
              "graphics": [[p.pid, p.usedGpuMemory // MIB] for p in N.nvmlDeviceGetGraphicsRunningProcesses(handle)]})
    """)
    assert result == {
        "memory": ["NotSupported", "NotSupported"],
        "compute": [[holder.token, 1500]],
        "graphics": [[holder.token, 40]],
    }


def test_slow_first_init_without_persistence_mode(node):
    """init_seconds counts only with persistence mode off, and only for a process's first nvmlInit."""
    node.set(init_seconds=0.6)
    timing = """
        start = time.monotonic(); N.nvmlInit(); first = time.monotonic() - start
        N.nvmlShutdown()
        start = time.monotonic(); N.nvmlInit(); again = time.monotonic() - start
        emit([first, again])
    """
    fast = node.nvml(timing)
    node.set(persistence_mode=0)
    slow = node.nvml(timing)
    assert fast[0] < 0.3 and slow[0] >= 0.6 and slow[1] >= 0.6, (fast, slow)
    kept = node.nvml("""
        N.nvmlInit()
        start = time.monotonic(); N.nvmlInit(); nested = time.monotonic() - start
        emit(nested)
    """)
    assert kept < 0.3  # reference counted: an init while initialized is immediate


def test_managed_memory_is_under_charged_by_the_lists(node):
    """A line's managed=K adds K MiB to the GPU's used memory and nothing to the list entry (pynvml#63)."""
    holder = node._start_holder(
        [
            sys.executable,
            "-c",
            HOLDER,
            str(node.run_dir),
            "fd",
            json.dumps([[node.device(3), 3, "1000", "compute managed=3000"]]),
        ]
    )[0]
    result = node.nvml("""
        N.nvmlInit()
        handle = N.nvmlDeviceGetHandleByIndex(3)
        emit([used_v2(3), [[p.pid, p.usedGpuMemory // MIB] for p in N.nvmlDeviceGetComputeRunningProcesses(handle)]])
    """)
    assert result == [4000, [[holder.token, 1000]]]


def test_detail_list_and_conf_compute_symbols(node):
    """The default library is a current driver: nvmlDeviceGetRunningProcessDetailList (32-byte entries) and
    nvmlDeviceGetConfComputeMemSizeInfo (NOT_SUPPORTED) exist, so nvitop's probe picks 24-byte _v3 entries."""
    holder = node.hold([(5, 256, "compute")])
    result = node.nvml("""
        N.nvmlInit()
        handle = N.nvmlDeviceGetHandleByIndex(5)
        details = N.nvmlDeviceGetRunningProcessDetailList(handle, N.nvmlProcessDetailList_v1, 0)
        try:
            N.nvmlDeviceGetConfComputeMemSizeInfo(handle)
            cc = "answered"
        except N.NVMLError_NotSupported:
            cc = "NotSupported"
        emit({"details": [[d.pid, d.usedGpuMemory // MIB, d.usedGpuCcProtectedMemory] for d in details], "cc": cc})
    """)
    assert result == {"details": [[holder.token, 256, 0]], "cc": "NotSupported"}


def test_memory_freed_after_release_latency_not_before(node):
    latency = 1.0
    node.set(release_latency=latency)
    holder = node.hold([(3, 4096, "compute"), (7, 100, "compute")])
    holder.end()
    result = node.nvml("""
        N.nvmlInit()
        start = time.monotonic()
        first = [used_v2(3), compute_pids(3)]
        while used_v2(3) != 0 and time.monotonic() - start < 15:
            last_listed = compute_pids(3)
            time.sleep(0.02)
        freed_after = time.monotonic() - start
        emit({"first": first, "last": last_listed, "freed_after": freed_after, "after": compute_pids(3),
              "gpu7": used_v2(7)})
    """)
    # The dead holder stays listed with its memory until the release, then is gone from the lists and the memory.
    assert result["first"] == [4096, [holder.token]] and result["last"] == [holder.token]
    assert result["after"] == []
    assert latency <= result["freed_after"] < latency + 3.0
    assert result["gpu7"] == 0
    assert not (node.contexts_dir / str(holder.token)).exists()
    assert list((node.run_dir / "released").iterdir()) == []


def test_state_left_by_an_earlier_context_is_ignored(node):
    holder = node.hold([(2, 256, "compute")])
    released = node.run_dir / "released"
    released.mkdir(mode=0o1777, exist_ok=True)
    # files of an earlier context file of the same PID (inode 0: never a real file)
    (released / f"{holder.token}.2").write_text("0 0.0\n")
    (released / f"{holder.token}.2.holder").write_text("0 1\n")
    result = node.nvml("""
        N.nvmlInit()
        emit([used_v2(2), compute_pids(2)])
    """)
    assert result == [256, [holder.token]]


def test_mapping_holder(node):
    holder = node.hold([(0, 777, "compute")], hold="map")
    maps = Path(f"/proc/{holder.token}/maps").read_text()
    assert f"{holder.token * 4096:08x}" in maps and node.device(0) in maps
    assert not any(
        os.readlink(f"/proc/{holder.token}/fd/{fd}") == node.device(0) for fd in os.listdir(f"/proc/{holder.token}/fd")
    )
    result = node.nvml("""
        N.nvmlInit()
        emit([used_v2(0), compute_pids(0)])
    """)
    assert result == [777, [holder.token]]


def test_thread_only_holder(node, thread_holder):
    holder = node.hold_in_thread(thread_holder, index=5, mib=640)

    def leader_exited():
        with open(f"/proc/{holder.token}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"

    assert poll(leader_exited, timeout=10), "the main thread did not exit"
    try:
        assert os.listdir(f"/proc/{holder.token}/fd") == []
    except PermissionError:
        pass  # a zombie leader's fd table is gone: unreadable is fine too
    result = node.nvml("""
        N.nvmlInit()
        emit([used_v2(5), compute_pids(5)])
    """)
    assert result == [640, [holder.token]]


def test_lost_gpu(node):
    node.set(lost="2")
    result = node.nvml("""
        N.nvmlInit()
        outcome = {}
        def attempt(name, call):
            try:
                call()
                outcome[name] = "ok"
            except N.NVMLError as error:
                outcome[name] = error.value
        attempt("by_index", lambda: N.nvmlDeviceGetHandleByIndex(2))
        conf = os.environ["GPUSIM_RUN"] + "/node.conf"
        handle3 = N.nvmlDeviceGetHandleByIndex(3)
        attempt("other", lambda: N.nvmlDeviceGetMemoryInfo(handle3))
        with open(conf, "a") as f:
            f.write("lost=2,3\\n")
        attempt("held_handle", lambda: N.nvmlDeviceGetMemoryInfo(handle3))
        attempt("processes", lambda: N.nvmlDeviceGetComputeRunningProcesses(handle3))
        attempt("count", N.nvmlDeviceGetCount)
        emit(outcome)
    """)
    assert result == {"by_index": 15, "other": "ok", "held_handle": 15, "processes": 15, "count": "ok"}


def test_lost_gpu_by_uuid(node):
    uuids = [f"GPU-00000000-0000-0000-0000-00000000000{index}" for index in range(8)]
    node.set(uuids=",".join(uuids), lost="6")
    result = node.nvml(f"""
        N.nvmlInit()
        try:
            N.nvmlDeviceGetHandleByUUID("{uuids[6]}")
            emit("returned")
        except N.NVMLError_GpuIsLost:
            emit("lost")
    """)
    assert result == "lost"


@pytest.mark.parametrize("hang", ["nvmlDeviceGetMemoryInfo", "all"])
def test_hang_blocks_the_call(node, hang):
    node.set(hang=hang)
    # the snippet learns which call should block from the environment
    node.env["HANG"] = hang
    proc = node.start_nvml("""
        N.nvmlInit()
        print("initialized", flush=True)
        if os.environ["HANG"] == "all":
            print("calling", flush=True)
            N.nvmlDeviceGetCount()
        else:
            handle = N.nvmlDeviceGetHandleByIndex(0)
            N.nvmlDeviceGetMemoryInfo(handle, version=N.nvmlMemory_v2)  # another symbol: answers
            print("calling", flush=True)
            N.nvmlDeviceGetMemoryInfo(handle)
        print("returned", flush=True)
    """)
    try:
        assert proc.stdout.readline() == "initialized\n", proc.stderr.read()
        assert proc.stdout.readline() == "calling\n", proc.stderr.read()
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.5)
    finally:
        proc.kill()
        proc.wait()
    assert proc.stdout.read() == ""


# ---- MIG (tests/sim/README.md "MIG"; nvml.h "Multi Instance GPU Management") ------------------


def snippet(*parts):
    """Joins NVML snippet parts, each dedented on its own (they are indented differently)."""
    return "\n".join(textwrap.dedent(part) for part in parts)


MIG_READING = """
    N.nvmlInit()
    def mig_reading(index):
        gpu = N.nvmlDeviceGetHandleByIndex(index)
        out = {"mode": N.nvmlDeviceGetMigMode(gpu), "max": N.nvmlDeviceGetMaxMigDeviceCount(gpu),
               "is_mig": N.nvmlDeviceIsMigDeviceHandle(gpu).value, "devices": []}
        for k in range(out["max"]):
            try:
                mig = N.nvmlDeviceGetMigDeviceHandleByIndex(gpu, k)
            except N.NVMLError_NotFound:
                continue
            memory = N.nvmlDeviceGetMemoryInfo(mig, version=N.nvmlMemory_v2)
            parent = N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
            uuid = N.nvmlDeviceGetUUID(mig)
            out["devices"].append({
                "k": k, "index": N.nvmlDeviceGetIndex(mig), "uuid": uuid,
                "by_uuid": N.nvmlDeviceGetGpuInstanceId(N.nvmlDeviceGetHandleByUUID(uuid)),
                "is_mig": N.nvmlDeviceIsMigDeviceHandle(mig).value,
                "gi": N.nvmlDeviceGetGpuInstanceId(mig), "ci": N.nvmlDeviceGetComputeInstanceId(mig),
                "name": N.nvmlDeviceGetName(mig), "parent": N.nvmlDeviceGetIndex(parent),
                "memory": [memory.total // MIB, memory.used // MIB, memory.free // MIB, memory.reserved],
                "compute": [[p.pid, p.usedGpuMemory // MIB, p.gpuInstanceId, p.computeInstanceId]
                            for p in N.nvmlDeviceGetComputeRunningProcesses(mig)],
            })
        return out
"""


def test_mig_default_layout_and_instance_identity(node):
    node.set(mig="0;3:7g.80gb;5:", mig_pending="5:0,1:1")
    result = node.nvml(
        snippet(
            MIG_READING,
            """
        emit({str(index): mig_reading(index) for index in (0, 1, 3, 5)})
    """,
        )
    )
    off = {"mode": [0, 1], "max": 0, "is_mig": 0, "devices": []}
    assert result["1"] == off  # MIG off, pending on (enabled at the next reset)
    assert result["5"] == {"mode": [1, 0], "max": 7, "is_mig": 0, "devices": []}
    gpu0 = result["0"]
    assert (gpu0["mode"], gpu0["max"], gpu0["is_mig"]) == ([1, 1], 7, 0)
    # 1g.10gb at slice 0 (GI 7), 2g.20gb at 2 (GI 4), 3g.40gb at 4 (GI 2); listed by GI id
    summary = [
        (d["k"], d["index"], d["gi"], d["ci"], d["name"], d["memory"], d["is_mig"], d["parent"])
        for d in gpu0["devices"]
    ]
    assert summary == [
        (0, 0, 2, 0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", [40448, 0, 40448, 0], 1, 0),
        (1, 1, 4, 0, "NVIDIA H100 80GB HBM3 MIG 2g.20gb", [20096, 0, 20096, 0], 1, 0),
        (2, 2, 7, 0, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", [9984, 0, 9984, 0], 1, 0),
    ]
    for device in gpu0["devices"]:
        assert device["uuid"].startswith("MIG-") and [len(p) for p in device["uuid"][4:].split("-")] == [8, 4, 4, 4, 12]
        assert device["by_uuid"] == device["gi"]
    assert len({d["uuid"] for d in gpu0["devices"]}) == 3
    assert [(d["gi"], d["name"][-7:]) for d in result["3"]["devices"]] == [(0, "7g.80gb")]


def test_mig_contexts_listed_per_instance_with_ids(node):
    node.set(mig="2:1g.10gb,1g.10gb,2g.20gb")  # GIs 7 (slice 0), 8 (slice 1), 4 (slice 2)
    first = node.hold([(2, 3000, "compute gi=7 ci=0")])
    second = node.hold([(2, 5000, "compute gi=4")])
    result = node.nvml(
        snippet(
            MIG_READING,
            """
        gpu = N.nvmlDeviceGetHandleByIndex(2)
        v2 = N.nvmlDeviceGetMemoryInfo(gpu, version=N.nvmlMemory_v2)
        emit({"mig": mig_reading(2), "used": v2.used // MIB,
              "parent": [[p.pid, p.usedGpuMemory // MIB, p.gpuInstanceId, p.computeInstanceId]
                         for p in N.nvmlDeviceGetComputeRunningProcesses(gpu)]})
    """,
        )
    )
    by_gi = {d["gi"]: d for d in result["mig"]["devices"]}
    assert sorted(by_gi) == [4, 7, 8]
    assert by_gi[7]["compute"] == [[first.token, 3000, 7, 0]]
    assert by_gi[7]["memory"][:3] == [9984, 3000, 9984 - 3000]
    assert by_gi[4]["compute"] == [[second.token, 5000, 4, 0]]
    assert by_gi[8]["compute"] == [] and by_gi[8]["memory"][1] == 0
    assert result["used"] == 8000
    assert sorted(result["parent"]) == sorted([[first.token, 3000, 7, 0], [second.token, 5000, 4, 0]])


def test_mig_aggregate_needs_privilege(node):
    node.set(mig="0", mig_privileged=0)
    holder = node.hold([(0, 700, "compute gi=7 ci=0")])
    result = node.nvml("""
        N.nvmlInit()
        gpu = N.nvmlDeviceGetHandleByIndex(0)
        out = {}
        for name, call in (("memory", lambda: N.nvmlDeviceGetMemoryInfo(gpu)),
                           ("memory_v2", lambda: N.nvmlDeviceGetMemoryInfo(gpu, version=N.nvmlMemory_v2)),
                           ("compute", lambda: N.nvmlDeviceGetComputeRunningProcesses(gpu)),
                           ("compute_v2", lambda: N.nvmlDeviceGetComputeRunningProcesses_v2(gpu)),
                           ("other_gpu", lambda: N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByIndex(1)))):
            try:
                value = call()
                out[name] = "ok" if not isinstance(value, list) else len(value)
            except N.NVMLError as error:
                out[name] = error.value
        mig = N.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 2)  # GI 7
        out["instance"] = [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(mig)]
        emit(out)
    """)
    assert result == {
        "memory": 4,
        "memory_v2": 4,
        "compute": 4,
        "compute_v2": 4,  # NVML_ERROR_NO_PERMISSION
        "other_gpu": 0,
        "instance": [holder.token],
    }


def test_mig_handle_calls_and_errors(node):
    node.set(mig="0:3g.40gb,3g.40gb,1g.10gb")  # the third does not fit: two 3g fill all 8 slices
    result = node.nvml("""
        N.nvmlInit()
        gpu = N.nvmlDeviceGetHandleByIndex(0)
        plain = N.nvmlDeviceGetHandleByIndex(1)
        out = {"count": [], "errors": {}}
        def code(name, call):
            try:
                call()
                out["errors"][name] = 0
            except N.NVMLError as error:
                out["errors"][name] = error.value
        for k in range(7):
            try:
                out["count"].append(N.nvmlDeviceGetGpuInstanceId(N.nvmlDeviceGetMigDeviceHandleByIndex(gpu, k)))
            except N.NVMLError_NotFound:
                pass
        mig = N.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        code("index_7", lambda: N.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 7))
        code("not_mig", lambda: N.nvmlDeviceGetMigDeviceHandleByIndex(plain, 0))
        code("gi_of_gpu", lambda: N.nvmlDeviceGetGpuInstanceId(plain))
        code("parent_of_gpu", lambda: N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(plain))
        code("minor_of_mig", lambda: N.nvmlDeviceGetMinorNumber(mig))
        code("mig_mode_of_mig", lambda: N.nvmlDeviceGetMigMode(mig))
        with open(os.environ["GPUSIM_RUN"] + "/node.conf", "a") as conf:
            conf.write("mig=1:\\n")  # MIG off on GPU 0 (on GPU 1 instead): the handle is gone
        code("stale_handle", lambda: N.nvmlDeviceGetGpuInstanceId(mig))
        emit(out)
    """)
    assert result["count"] == [1, 2]
    assert result["errors"] == {
        "index_7": 2,
        "not_mig": 3,
        "gi_of_gpu": 3,
        "parent_of_gpu": 3,
        "minor_of_mig": 3,
        "mig_mode_of_mig": 3,
        "stale_handle": 2,
    }


# ---- process-list versions: _v3, _v2 (24-byte entries), v1 (16 bytes) and the no-v3 library ----

LIST_VERSIONS = """
    from ctypes import byref, c_uint, Structure, c_ulonglong
    class V1(Structure):
        _fields_ = [("pid", c_uint), ("usedGpuMemory", c_ulonglong)]
    def raw_list(symbol, entry, index):
        fn = N._nvmlGetFunctionPointer(symbol)
        handle = N.nvmlDeviceGetHandleByIndex(index)
        count = c_uint(0)
        assert fn(handle, byref(count), None) == N.NVML_ERROR_INSUFFICIENT_SIZE
        items = (entry * count.value)()
        assert fn(handle, byref(count), items) == 0
        return [[item.pid, item.usedGpuMemory // MIB] for item in items[:count.value]]
"""


def test_process_list_versions_agree(node):
    holders = [node.hold([(6, 100 + n, "compute")]) for n in range(3)]
    result = node.nvml(
        snippet(
            LIST_VERSIONS,
            """
        N.nvmlInit()
        emit({"v3": sorted(raw_list("nvmlDeviceGetComputeRunningProcesses_v3", N.c_nvmlProcessInfo_v2_t, 6)),
              "v2": sorted(raw_list("nvmlDeviceGetComputeRunningProcesses_v2", N.c_nvmlProcessInfo_v2_t, 6)),
              "v1": sorted(raw_list("nvmlDeviceGetComputeRunningProcesses", V1, 6)),
              "sizes": [ctypes.sizeof(N.c_nvmlProcessInfo_v2_t), ctypes.sizeof(V1)]})
    """,
        )
    )
    expected = sorted([holder.token, 100 + n] for n, holder in enumerate(holders))
    assert result == {"v3": expected, "v2": expected, "v1": expected, "sizes": [24, 16]}


def test_no_v3_library_lacks_only_the_v3_symbols(node, library_dir):
    node.env["LD_LIBRARY_PATH"] = str(library_dir / "no-v3")
    holder = node.hold([(4, 321, "compute")])
    result = node.nvml(
        snippet(
            LIST_VERSIONS,
            """
        N.nvmlInit()
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        present = {name: hasattr(lib, name) for name in (
            "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
            "nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetComputeRunningProcesses")}
        try:
            N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByIndex(4))
            public = "returned"
        except Exception as error:  # NVMLLibraryMismatchError (13.x) or NVMLError_FunctionNotFound (12.x)
            public = type(error).__name__
        emit({"present": present, "public": public,
              "v2": raw_list("nvmlDeviceGetComputeRunningProcesses_v2", N.c_nvmlProcessInfo_v2_t, 4)})
    """,
        )
    )
    assert result["present"] == {
        "nvmlDeviceGetComputeRunningProcesses_v3": False,
        "nvmlDeviceGetGraphicsRunningProcesses_v3": False,
        "nvmlDeviceGetMPSComputeRunningProcesses_v3": False,
        "nvmlDeviceGetComputeRunningProcesses_v2": True,
        "nvmlDeviceGetComputeRunningProcesses": True,
    }
    assert result["public"] in ("NVMLLibraryMismatchError", "NVMLError_FunctionNotFound")
    assert result["v2"] == [[holder.token, 321]]


# ---- the node knobs: gpunode up --mig / --no-v3 ------------------------------------------------

NODE_READING = r"""
import ctypes, json, os
import pynvml as N
N.nvmlInit()
gpu = N.nvmlDeviceGetHandleByIndex(0)
migs = [N.nvmlDeviceGetMigDeviceHandleByIndex(gpu, k) for k in range(3)]
caps = {}
for line in open("/proc/driver/nvidia-caps/mig-minors"):
    name, minor = line.split()
    caps[name] = int(minor)
print(json.dumps({
    "v3": hasattr(ctypes.CDLL("libnvidia-ml.so.1"), "nvmlDeviceGetComputeRunningProcesses_v3"),
    "gis": [N.nvmlDeviceGetGpuInstanceId(m) for m in migs],
    "dev_caps": sorted(os.listdir("/dev/nvidia-caps")),
    "gi7": caps["gpu0/gi7/access"], "gi7ci0": caps["gpu0/gi7/ci0/access"],
    "access": open("/proc/driver/nvidia/capabilities/gpu0/mig/gi7/ci0/access").read().split("\n")[0],
}))
"""


def test_node_with_mig_and_without_v3(simnode):
    node = simnode(gpus=2, mig="0", no_v3=True)
    assert node.info["driver_variant"] == "no-v3"
    assert [(i["profile"], i["gi"], i["caps"]) for i in node.info["mig"]["0"]] == [
        ("3g.40gb", 2, [21, 22]),
        ("2g.20gb", 4, [39, 40]),
        ("1g.10gb", 7, [66, 67]),
    ]
    reading = json.loads(node.py(NODE_READING))
    assert reading == {
        "v3": False,
        "gis": [2, 4, 7],
        "dev_caps": sorted(f"nvidia-cap{n}" for n in (1, 2, 21, 22, 39, 40, 66, 67)),
        "gi7": 66,
        "gi7ci0": 67,
        "access": "DeviceFileMinor: 67",
    }


@pytest.mark.parametrize(
    "mig, message",
    [
        ("0:5g.50gb", "unknown profile '5g.50gb'"),
        ("0:3g.40gb,3g.40gb,1g.10gb", "no free placement for 1g.10gb"),
        ("9", "GPU index 9 out of range"),
        ("0;0:7g.80gb", "GPU 0 given twice"),
    ],
)
def test_gpunode_refuses_a_mig_layout_that_cannot_exist(mig, message):
    sys.path.insert(0, str(REPO / "tests" / "sim"))
    import gpunode  # pylint: disable=import-outside-toplevel

    with pytest.raises(gpunode.GpunodeError, match=message):
        gpunode.mig_layout(mig, gpus=8)


def test_memory_info_v2_knob_leaves_only_v1(node):
    """memory_info_v2=0: the v2 call answers FUNCTION_NOT_FOUND (NVIDIA/nvidia-settings#78), v1 still answers."""
    node.set(memory_info_v2=0)
    result = node.nvml("""
        N.nvmlInit()
        handle = N.nvmlDeviceGetHandleByIndex(0)
        try:
            N.nvmlDeviceGetMemoryInfo(handle, version=N.nvmlMemory_v2)
            v2 = "answered"
        except N.NVMLError_FunctionNotFound:
            v2 = "FunctionNotFound"
        v1 = N.nvmlDeviceGetMemoryInfo(handle)
        emit({"v2": v2, "v1": [v1.total, v1.free, v1.used]})
    """)
    assert result == {
        "v2": "FunctionNotFound",
        "v1": [TOTAL_MIB * MIB, (TOTAL_MIB - RESERVED_MIB) * MIB, RESERVED_MIB * MIB],
    }


def test_v3_32_library_writes_32_byte_entries(tmp_path, library_dir):
    """The early-R535 variant (build/v3-32): 32-byte _v3 entries, which nvidia-ml-py's 24-byte struct garbles after
    the first entry; read with the 32-byte layout every PID is right. nvitop's probe: ConfComputeMemSizeInfo
    present, RunningProcessDetailList absent."""
    fake = FakeNode(tmp_path, library_dir / "v3-32")
    try:
        holders = [fake.hold([(1, 1000 + 100 * k, "compute")]) for k in range(3)]
        result = fake.nvml("""
            N.nvmlInit()
            handle = N.nvmlDeviceGetHandleByIndex(1)
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            class Legacy(ctypes.Structure):
                _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                            ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint),
                            ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]
            count = ctypes.c_uint(8)
            entries = (Legacy * 8)()
            assert lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), entries) == 0
            right = sorted([e.pid, e.usedGpuMemory // MIB] for e in entries[:count.value])
            garbled = [[p.pid, (p.usedGpuMemory or 0) // MIB] for p in N.nvmlDeviceGetComputeRunningProcesses(handle)]
            emit({"right": right, "garbled": garbled,
                  "symbols": [hasattr(lib, "nvmlDeviceGetConfComputeMemSizeInfo"),
                              hasattr(lib, "nvmlDeviceGetRunningProcessDetailList")]})
        """)
        assert result["right"] == sorted([h.token, 1000 + 100 * k] for k, h in enumerate(holders))
        assert result["garbled"][0] in result["right"] and sorted(result["garbled"]) != result["right"]
        assert result["symbols"] == [True, False]
    finally:
        fake.end_holders()
