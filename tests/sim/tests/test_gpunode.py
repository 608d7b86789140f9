"""Tests of tests/sim/gpunode: nodes are real PID + mount namespaces with a private /dev."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import polling

from simnode import GPUNODE, REPO, VENV_PYTHON, gpunode, inventory_file, up

POLL_DEADLINE_S = 10.0


def poll(condition, what: str, deadline_s: float = POLL_DEADLINE_S):
    """polling.wait_for every 10 ms: `condition`'s truthy value, or a failure after `deadline_s`."""
    return polling.wait_for(condition, deadline_s, 0.01, what)


def run_gpunode(*args: str, root: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    environment = dict(os.environ)
    if root is not None:
        environment["GPUNODE_ROOT"] = str(root)
    return subprocess.run(
        [str(GPUNODE), *args], capture_output=True, text=True, timeout=60, env=environment, check=False, **kwargs
    )


def process_state(node, pid: int) -> str | None:
    """State letter (R, S, Z...) of process `pid` as the node sees it, None if it has none."""
    return (
        node.py(
            "import sys\n"
            "try:\n"
            "    print(open(f'/proc/{sys.argv[1]}/stat').read().rsplit(')', 1)[1].split()[0])\n"
            "except FileNotFoundError:\n"
            "    print('-')\n",
            str(pid),
        )
        .strip()
        .replace("-", "")
        or None
    )


def boot_ticks() -> int:
    """Now, in the clock ticks since boot of a process's start time (/proc/PID/stat, field 22)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def host_processes_in(pidns: str, started_by: int | None = None) -> list[int]:
    """Host PIDs of the processes (zombies included) whose PID namespace is `pidns`; with `started_by` (boot_ticks()),
    only those started by then. The kernel reuses a freed namespace's inode number for the next namespace made (a
    parallel test's node): after a node is gone, only what started before it went can be its own."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != pidns:
                    continue
                started = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[19])
            except (OSError, ValueError, IndexError):
                continue
            if started_by is None or started <= started_by:
                found.append(int(entry))
    return found


def test_node_has_its_own_pid_namespace(simnode):
    node = simnode(no_driver=True)
    seen = json.loads(
        node.py(
            "import json, os\n"
            "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
            "print(json.dumps({'pids': pids, 'me': os.getpid(), 'init': open('/proc/1/comm').read().strip(),\n"
            "                  'pidns': os.readlink('/proc/self/ns/pid')}))"
        )
    )
    assert seen["init"] == "gpusim-init"
    assert seen["pidns"] == node.info["pidns"] != os.readlink("/proc/self/ns/pid")
    # init, and the Python that nsenter forked (setpriv execs it in place)
    assert seen["pids"] == [1, seen["me"]]
    assert node.info["init_pid"] in host_processes_in(node.info["pidns"])


def test_node_has_private_dev_and_run(simnode):
    node = simnode(gpus=2, minors=[3, 5], no_driver=True)
    (node.run_dir / "from-host").write_text("shared\n")
    listing = json.loads(
        node.py(
            "import json, os, stat\n"
            "def kind(path):\n"
            "    mode = os.lstat(path).st_mode\n"
            "    return ('chr' if stat.S_ISCHR(mode) else 'reg' if stat.S_ISREG(mode) else\n"
            "            'lnk' if stat.S_ISLNK(mode) else 'dir', oct(stat.S_IMODE(mode)))\n"
            "print(json.dumps({'dev': {name: kind('/dev/' + name) for name in os.listdir('/dev')},\n"
            "                  'run': sorted(os.listdir('/run')),\n"
            "                  'from_host': open('/run/gpusim/from-host').read(),\n"
            "                  'proc_init': open('/run/gpusim/proc/1/comm').read().strip()}))"
        )
    )
    dev = listing["dev"]
    for name in ("nvidia3", "nvidia5", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        assert dev[name] == ["reg", "0o666"], name
    assert not [
        name for name in dev if name.startswith("nvidia") and name[6:].isdigit() and name not in ("nvidia3", "nvidia5")
    ]
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        assert dev[name][0] == "chr", name
    assert dev["ptmx"][0] == dev["fd"][0] == "lnk"
    assert dev["pts"][0] == dev["shm"][0] == "dir"
    assert listing["run"] == ["gpusim"]
    assert listing["from_host"] == "shared\n"
    assert listing["proc_init"] == "gpusim-init"
    assert [gpu["minor"] for gpu in node.info["gpus"]] == [3, 5]
    assert "/dev/nvidia3" not in Path("/proc/self/mountinfo").read_text()


def test_devices_and_shared_memory_work_inside(simnode):
    node = simnode(gpus=1, no_driver=True)
    out = node.py(
        "import mmap, os, pty\n"
        "from multiprocessing import shared_memory\n"
        "fd = os.open('/dev/nvidia0', os.O_RDWR)\n"
        "os.lseek(fd, 12345, os.SEEK_SET)\n"
        "print(os.lseek(fd, 0, os.SEEK_CUR))\n"
        "os.ftruncate(fd, 4096)\n"
        "mmap.mmap(fd, 4096).close()\n"
        "segment = shared_memory.SharedMemory(create=True, size=4096)\n"
        "segment.close(); segment.unlink()\n"
        "master, slave = pty.openpty()\n"
        "print(os.ttyname(slave))\n"
    )
    offset, tty = out.split()
    assert offset == "12345"
    assert tty.startswith("/dev/pts/")


def test_two_nodes_do_not_see_each_others_processes(simnode):
    first, second = simnode(no_driver=True), simnode(no_driver=True)
    first.spawn("import time; time.sleep(600)  # holder-of-first")
    second.spawn("import time; time.sleep(600)  # holder-of-second")
    listing = (
        "import os\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    print(open(f'/proc/{pid}/cmdline').read().replace('\\0', ' '))\n"
    )
    seen_by_first, seen_by_second = first.py(listing), second.py(listing)
    assert "holder-of-first" in seen_by_first and "holder-of-second" not in seen_by_first
    assert "holder-of-second" in seen_by_second and "holder-of-first" not in seen_by_second


def test_exec_passes_stdin_stdout_stderr_and_status(simnode):
    node = simnode(no_driver=True)
    result = run_gpunode("exec", node.name, "--", "sh", "-c", "cat; echo oops >&2; exit 7", input="hello\n")
    assert (result.returncode, result.stdout, result.stderr) == (7, "hello\n", "oops\n")
    killed = run_gpunode("exec", node.name, "--", "sh", "-c", "kill -TERM $$")
    assert killed.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM)
    assert node.exec("pwd").stdout.strip() == os.getcwd()
    assert node.exec("sh", "-c", "command -v vllm").stdout.strip() == str(node.state_dir / "bin" / "vllm")


def test_vllm_on_path_is_a_console_script_of_the_venv(simnode):
    node = simnode(no_driver=True)
    vllm = node.state_dir / "bin" / "vllm"
    assert vllm.read_text().splitlines()[0] == f"#!{VENV_PYTHON}"
    assert "serve" in node.exec("vllm", "--help").stdout


def test_command_gets_sigterm_when_the_exec_caller_dies(simnode):
    node = simnode(no_driver=True)
    pid_file = node.run_dir / "sleeper.pid"
    # gpunode exec execs nsenter, so this Popen's PID is nsenter's.
    caller = subprocess.Popen(
        [
            str(GPUNODE),
            "exec",
            node.name,
            "--",
            "sh",
            "-c",
            "echo $$ > /run/gpusim/sleeper.pid.tmp; mv /run/gpusim/sleeper.pid.tmp "
            "/run/gpusim/sleeper.pid; exec sleep 600",
        ],
        stdin=subprocess.DEVNULL,
    )
    try:
        sleeper = int(poll(lambda: pid_file.exists() and pid_file.read_text(), "the command to start"))
        assert process_state(node, sleeper) in ("S", "R")
    finally:
        caller.kill()
        caller.wait()
    poll(lambda: process_state(node, sleeper) is None, "the command to end after SIGTERM")


def test_init_reaps_orphans(simnode):
    node = simnode(no_driver=True)
    orphan = node.spawn("pass")
    poll(lambda: process_state(node, orphan) is None, "init to reap the orphan")


def test_no_reap_leaves_a_zombie(simnode):
    node = simnode(no_driver=True, no_reap=True)
    orphan = node.spawn("pass")
    poll(lambda: process_state(node, orphan) == "Z", "the orphan to exit")
    ppid = node.py(f"print(open('/proc/{orphan}/stat').read().rsplit(')', 1)[1].split()[1])")
    assert ppid.strip() == "1"


def test_python_wrapper_runs_inside_the_node(simnode):
    node = simnode(no_driver=True)
    probe = (
        "import os, shutil\n"
        "print(open('/proc/1/comm').read().strip(), os.readlink('/proc/self/ns/pid'),\n"
        "      shutil.which('vllm'), os.getcwd())"
    )
    from_host = subprocess.run(
        [node.info["python"], "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    expected = ["gpusim-init", node.info["pidns"], str(node.state_dir / "bin" / "vllm"), os.getcwd()]
    assert from_host == expected
    # From inside the node the wrapper runs Python directly (no second nsenter).
    assert node.exec(node.info["python"], "-c", probe).stdout.split() == expected
    assert node.exec("sh", "-c", 'echo "$PATH"').stdout.count(str(node.state_dir / "bin")) == 1


def test_exec_on_a_downed_node_fails_clearly(simnode):
    node = simnode(no_driver=True)
    node.down()
    result = run_gpunode("exec", node.name, "--", "true")
    assert result.returncode == 1
    assert f"node {node.name} is not running" in result.stderr
    with pytest.raises(gpunode.GpunodeError, match="is not running"):
        node.exec("true")
    assert run_gpunode("down", node.name).returncode == 0  # idempotent


def test_dead_node_is_reported_and_replaced(simnode):
    node = simnode(no_driver=True)
    killed = boot_ticks()
    os.kill(node.info["init_pid"], signal.SIGKILL)
    poll(lambda: not host_processes_in(node.info["pidns"], killed), "the node's processes to end")
    listed = run_gpunode("list").stdout.splitlines()
    assert f"{node.name}\tdead" in listed
    result = run_gpunode("exec", node.name, "--", "true")
    assert result.returncode == 1 and f"node {node.name} is not running" in result.stderr
    wrapper = subprocess.run([node.info["python"], "-c", "pass"], capture_output=True, text=True, check=False)
    assert wrapper.returncode == 1 and f"node {node.name} is not running" in wrapper.stderr
    replacement = up(node.name, no_driver=True)  # downed by the fixture under the same name
    assert f"{node.name}\trunning" in run_gpunode("list").stdout.splitlines()
    assert replacement.py("print(open('/proc/1/comm').read())").strip() == "gpusim-init"


def test_up_refuses_a_running_name(simnode):
    node = simnode(no_driver=True)
    result = run_gpunode("up", node.name, "--no-driver")
    assert result.returncode == 1
    assert "already exists and is running" in result.stderr
    assert node.exec("true").returncode == 0


def test_up_rejects_bad_knobs(tmp_path):
    try:
        for args, message in (
            (["--gpus", "2", "--minors", "0"], "minors: 1 entries for 2 GPUs"),
            (["--gpus", "2", "--lost", "2"], "lost: GPU index 2 out of range"),
            (["--stray-mib", "0-100"], "is not INDEX:MiB"),
        ):
            result = run_gpunode("up", "bad", "--no-driver", *args, root=tmp_path)
            assert result.returncode == 1 and message in result.stderr, result.stderr
        assert not (tmp_path / "bad").exists()
        assert run_gpunode("up", "a/b", root=tmp_path).returncode == 1
    finally:
        run_gpunode("down", "--all", root=tmp_path)


def test_set_rewrites_node_conf(simnode):
    node = simnode(gpus=2, no_driver=True, lost=[1])
    node.set(release_latency=2.5, stray_mib={0: 1024}, lost=None)
    conf = gpunode.read_conf(node.run_dir / "node.conf")
    assert conf["release_latency"] == "2.5" and conf["stray_mib"] == "0:1024"
    assert "lost" not in conf
    assert (
        node.py("print(open('/run/gpusim/node.conf').read())").strip()
        == (node.run_dir / "node.conf").read_text().strip()
    )
    for bad, message in (
        ("gpus=4", "fixed when the node is made"),
        ("colour=blue", "unknown key"),
        ("lost=5", "out of range"),
        ("persistence_mode=2", "does not match"),
        ("release_latency", "is not KEY=VALUE"),
    ):
        result = run_gpunode("set", node.name, bad)
        assert result.returncode == 1 and message in result.stderr, result.stderr
    assert gpunode.read_conf(node.run_dir / "node.conf") == conf


def test_h200_preset_sets_the_measured_figures_and_options_beside_it_win(simnode):
    node = simnode(gpus=1, no_driver=True, preset="h200", reserved_mib=700)
    conf = gpunode.read_conf(node.run_dir / "node.conf")
    assert {key: conf[key] for key in gpunode.PRESETS["h200"]} == dict(gpunode.PRESETS["h200"], reserved_mib="700")
    assert conf["memory_total_mib"] == "143771" and conf["context_overhead_mib"] == "518"
    assert node.info["gpus"][0]["name"] == "NVIDIA H200" and node.info["release_latency"] == 0.15
    plain = gpunode.read_conf(simnode(gpus=1, no_driver=True).run_dir / "node.conf")
    assert plain["name"] == "NVIDIA H100 80GB HBM3" and "context_overhead_mib" not in plain
    result = run_gpunode("up", "bad", "--no-driver", "--preset", "h100")
    assert result.returncode == 2 and "invalid choice: 'h100'" in result.stderr, result.stderr
    assert run_gpunode("set", node.name, "context_overhead_mib=-1").returncode == 1


def test_down_all_leaves_nothing_behind(tmp_path):
    root = tmp_path / "root"
    try:
        nodes = [up(f"all-{index}", root=root, no_driver=index == 0) for index in range(2)]
        for node in nodes:
            node.spawn("import time; time.sleep(600)")
            node.exec("sh", "-c", "exec sleep 600 </dev/null >/dev/null 2>&1 &")
    finally:
        downed = boot_ticks()
        result = run_gpunode("down", "--all", root=root)
    assert result.returncode == 0, result.stderr
    assert list(root.iterdir()) == []
    assert str(root) not in Path("/proc/self/mountinfo").read_text()
    for node in nodes:
        assert host_processes_in(node.info["pidns"], downed) == []
        assert not gpunode._alive(node.info["unshare_pid"], node.info["unshare_start_time"])
    assert run_gpunode("list", root=root).stdout == ""
    absent = run_gpunode("down", "all-0", root=root)
    assert absent.returncode == 0 and "no node all-0" in absent.stderr


def test_inventory_lists_nodes_with_their_interpreter(simnode):
    first, second = simnode(no_driver=True), simnode(no_driver=True)
    lines = run_gpunode("inventory", first.name, second.name).stdout.splitlines()
    assert lines == ["[gpunodes]"] + [
        f"{node.name} ansible_connection=local ansible_python_interpreter={node.info['python']} gpuops_nvidia_venv=''"
        for node in (first, second)
    ]


def test_ansible_runs_inside_each_node(simnode, tmp_path):
    nodes = [simnode(no_driver=True), simnode(no_driver=True)]
    inventory = inventory_file(tmp_path, *nodes)
    result = subprocess.run(
        [
            str(VENV_PYTHON.parent / "ansible"),
            "-i",
            str(inventory),
            "all",
            "-m",
            "command",
            "-a",
            "sh -c 'cat /proc/1/comm; readlink /proc/self/ns/pid'",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for node in nodes:
        expected = f"{node.name} | CHANGED | rc=0 >>\ngpusim-init\n{node.info['pidns']}\n"
        assert expected in result.stdout + "\n", result.stdout


def test_pynvml_lists_the_configured_gpus(simnode):
    node = simnode(gpus=3, model_name="NVIDIA A100-SXM4-80GB", minors=[0, 2, 4])
    devices = json.loads(
        node.py(
            "import json, pynvml\n"
            "pynvml.nvmlInit()\n"
            "handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]\n"
            "print(json.dumps([[pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetMinorNumber(h),\n"
            "                   pynvml.nvmlDeviceGetUUID(h)] for h in handles]))"
        )
    )
    assert devices == [["NVIDIA A100-SXM4-80GB", gpu["minor"], gpu["uuid"]] for gpu in node.info["gpus"]]
    assert [gpu["minor"] for gpu in node.info["gpus"]] == [0, 2, 4]


def test_no_driver_node_has_no_nvml_library(simnode):
    node = simnode(no_driver=True)
    out = node.py(
        "import pynvml\n"
        "try:\n"
        "    pynvml.nvmlInit()\n"
        "except pynvml.NVMLError_LibraryNotFound:\n"
        "    print('library not found')\n"
    )
    assert out.strip() == "library not found"


# ---------------------------------------------------------------------------------------------
# owner cgroups (tests/sim/README.md "Owner cgroups") and the simulated systemctl

COLLECTIONS = REPO / ".collections"
# Reads /proc/PID/cgroup inside the node and what the production parser makes of it (the collection as it
# resolves under .collections: _owners imports _procscan).
_READ_OWNER = (
    "import json, sys\n"
    f"sys.path.insert(0, {str(COLLECTIONS)!r})\n"
    "from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners as owners\n"
    "text = open('/proc/%s/cgroup' % sys.argv[1]).read()\n"
    "line = [l for l in text.splitlines() if ':name=systemd:' in l][0]\n"
    "print(json.dumps({'path': line.split(':', 2)[2], 'owner': owners.parse_cgroup(text),\n"
    "                  'block': owners.owner_of(int(sys.argv[1]))}))\n"
)
CID = "4f1c3a9e0b7d2c6e8a5f1b3d9c7e2a4b6d8f0e1c3a5b7d9f2e4c6a8b0d1f3e5a"
POD_UID = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
POD_ = POD_UID.replace("-", "_")
OWNER_CASES = [
    ("/system.slice/system-vllm.slice/vllm@a.service", {"systemd_unit": "vllm@a.service"}),
    (
        f"/system.slice/docker-{CID}.scope",
        {"systemd_unit": f"docker-{CID}.scope", "container_id": CID, "runtime": "docker"},
    ),
    (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_}.slice/cri-containerd-{CID}.scope",
        {
            "systemd_unit": f"cri-containerd-{CID}.scope",
            "container_id": CID,
            "runtime": "containerd",
            "pod_uid": POD_UID,
        },
    ),
    (
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_}.slice/crio-{CID}.scope",
        {"systemd_unit": f"crio-{CID}.scope", "container_id": CID, "runtime": "cri-o", "pod_uid": POD_UID},
    ),
    (
        f"/kubepods.slice/kubepods-pod{POD_}.slice/cri-containerd-{CID}.scope",
        {
            "systemd_unit": f"cri-containerd-{CID}.scope",
            "container_id": CID,
            "runtime": "containerd",
            "pod_uid": POD_UID,
        },
    ),
    (
        "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
        {"systemd_unit": "slurmstepd.scope", "slurm_job": "4242"},
    ),
    ("/slurm/uid_0/job_77/step_batch/task_0", {"slurm_job": "77"}),
]


def owner_node(simnode):
    node = simnode(gpus=1)
    if node.cgroup_root is None:
        pytest.skip(f"no owner cgroups here: {node.info['cgroup_unsupported']}")
    return node


def read_owner(node, pid: int) -> dict:
    return json.loads(node.py(_READ_OWNER, str(pid)))


def test_owner_cgroups_show_host_paths_inside_the_node(simnode):
    node = owner_node(simnode)
    pids = [node.spawn("import time; time.sleep(600)", cgroup=path) for path, _owner in OWNER_CASES]
    for pid, (path, expected) in zip(pids, OWNER_CASES):
        seen = read_owner(node, pid)
        assert seen["path"] == path  # what a real host shows: the node's parent is not visible
        assert seen["owner"] == dict(dict.fromkeys(seen["owner"]), **expected)
        # on the host the same process sits under the node's own cgroup
        assert len((node.cgroup_root / path.lstrip("/") / "cgroup.procs").read_text().split()) == 1
    plain = node.spawn("import time; time.sleep(600)")
    assert read_owner(node, plain)["path"] == "/"  # the node's root cgroup: no owner
    assert read_owner(node, plain)["block"] == dict.fromkeys(read_owner(node, plain)["block"])


def test_owner_cgroups_are_under_the_node_parent_only(simnode):
    node = owner_node(simnode)
    root = node.cgroup_root
    assert root.parent == gpunode.CGROUP_HIERARCHY / gpunode.CGROUP_PARENT
    node.spawn("import time; time.sleep(600)", cgroup="/system.slice/vllm.service")
    unit = root / "system.slice" / "vllm.service"
    assert len(unit.joinpath("cgroup.procs").read_text().split()) == 1
    # the node's init and every process entering it are in the node's cgroup tree, nothing else is
    host_procs = {int(pid) for pid in (root / "cgroup.procs").read_text().split()}
    assert node.info["init_pid"] in host_procs and node.info["unshare_pid"] in host_procs
    assert os.getpid() not in host_procs


def test_down_removes_owner_cgroups(simnode, tmp_path):
    node = up("t-owners-down", root=tmp_path / "nodes", gpus=1)
    try:
        if node.cgroup_root is None:
            pytest.skip(f"no owner cgroups here: {node.info['cgroup_unsupported']}")
        for path, _owner in OWNER_CASES:
            node.spawn("import time; time.sleep(600)", cgroup=path)
        assert (node.cgroup_root / "kubepods.slice").is_dir()
    finally:
        node.down()
    assert not node.cgroup_root.exists()


def test_exec_cgroup_option(simnode):
    node = owner_node(simnode)
    root = str(node.state_dir.parent)
    result = run_gpunode(
        "exec",
        node.name,
        "--cgroup",
        "/system.slice/x.service",
        "--",
        "grep",
        "name=systemd",
        "/proc/self/cgroup",
        root=root,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(":name=systemd:/system.slice/x.service")
    refused = run_gpunode("exec", node.name, "--cgroup", "/../escape", "--", "true", root=root)
    assert refused.returncode == 1 and "invalid cgroup path" in refused.stderr
    assert not (node.cgroup_root.parent / "escape").exists()


def test_simulated_systemctl_show_and_stop(simnode):
    node = owner_node(simnode)
    node.set_units({"vllm@a.service": {"Restart": "always", "TimeoutStopSec": 2}})
    unit = "/system.slice/system-vllm.slice/vllm@a.service"
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    in_unit = [node.spawn("import time; time.sleep(600)", cgroup=unit), node.spawn(stubborn, cgroup=unit)]
    other = node.spawn("import time; time.sleep(600)", cgroup="/system.slice/other.service")
    assert node.exec("systemctl", "show", "-p", "Restart", "--value", "--", "vllm@a.service").stdout == "always\n"
    assert node.exec("systemctl", "show", "-p", "Restart", "--value", "other.service").stdout == "no\n"
    assert read_owner(node, in_unit[0])["block"]["unit_restart"] == "always"  # production code, simulated systemctl
    shown = node.exec("systemctl", "show", "vllm@a").stdout
    assert f"ControlGroup={unit}\n" in shown and "ActiveState=active\n" in shown
    started = time.monotonic()
    node.exec("systemctl", "stop", "vllm@a.service")
    assert 1.5 < time.monotonic() - started < 10  # SIGTERM, 2 s TimeoutStopSec, SIGKILL for the stubborn one
    for pid in in_unit:
        assert process_state(node, pid) in (None, "Z")
    assert process_state(node, other) not in (None, "Z")
    assert not (node.cgroup_root / unit.lstrip("/")).exists()
    assert node.exec("systemctl", "is-active", "vllm@a.service", check=False).returncode == 3
    missing = node.exec("systemctl", "stop", "nothere.service", check=False)
    assert missing.returncode == 5 and "Unit nothere.service not loaded." in missing.stderr

    # A user manager's unit (inside user@1000.service) and an LXD container's own unit are not the system manager's:
    # it answers for them as for any unit it does not know (exit 0, not-found, inactive: systemd#1105).
    sleep = "import time; time.sleep(600)"
    node.spawn(sleep, cgroup="/user.slice/user-1000.slice/user@1000.service/app.slice/llm.service")
    node.spawn(sleep, cgroup="/lxc.payload.c1/system.slice/vllm.service")
    for unit in ("llm.service", "vllm.service"):
        shown = node.exec("systemctl", "show", "-p", "LoadState,ActiveState", "--", unit)
        assert sorted(shown.stdout.split()) == ["ActiveState=inactive", "LoadState=not-found"], (unit, shown.stdout)
        assert node.exec("systemctl", "stop", unit, check=False).returncode == 5
    shown = node.exec("systemctl", "show", "-p", "LoadState,ActiveState", "--", "user@1000.service").stdout
    assert sorted(shown.split()) == ["ActiveState=active", "LoadState=loaded"]
