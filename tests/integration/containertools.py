"""Real podman inside a simulated node (issue 43): what a GPU host that runs vLLM in containers looks like.

What podman needs here, measured on this machine (Debian 12: podman 4.3.1, conmon 2.1.6, catatonit 0.1.7):
- the simulator's OCI runtime, `tests/sim/simruntime` (tests/sim/README.md, "The simulated OCI runtime"), as the
  simulator supplies the driver, nvidia-smi and systemctl. Every real runtime here needs the host's devices cgroup
  hierarchy, and shared machines allow cgroups only below a node's own name=systemd cgroup: runc 1.1.5 refuses to
  run without a devices hierarchy ("mountpoint for devices not found"); crun 1.8.1 runs with name=systemd alone up to
  `update_cgroup_v1_resources` (src/libcrun/cgroup-resources.c), which opens /sys/fs/cgroup/devices/<path> because
  podman 4.3.1 as root always adds a deny-all device rule (pkg/specgen/generate/oci_linux.go SpecGenToOCI).
  Podman, conmon, catatonit (`--init`) and the kernel's PID namespaces stay real.
- the cgroupfs manager (no systemd runs here) and the vfs storage driver.
- explicit ulimits: podman's default limits exceed the machine's hard ones ("setrlimit RLIMIT_NOFILE: Operation not
  permitted"); the role passes them through `vllm_server_container_options`.
- a cgroup view of the node's own cgroups. The node's mount namespace shows every hierarchy of the host; podman's
  cgroupfs manager would make cgroups in each, memory and cpu included. So `podman` on the node's PATH (this wrapper,
  as `systemctl` is the simulated one) runs the real podman in a mount namespace of its own whose /sys/fs/cgroup is a
  read-only tmpfs with one hierarchy: name=systemd (no controllers), mounted from inside the node's cgroup namespace,
  so the container's cgroup is `/libpod_parent/libpod-<id>` below the node's cgroup, the path podman's cgroupfs
  manager writes on a real host. simruntime makes it there and nowhere else, and removes it with the container.
- the host's network for a container without `--network` (containers.conf `netns = "host"`): nodes share the host's
  network, and podman's default bridge (CNI) would add a bridge and iptables rules to the host.
- storage and engine settings in files (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF set by the wrapper), not options:
  every podman command on the node (the role's, and the reset's `podman stop`) then finds the same containers, as on a
  real host where they live in /etc/containers.

The image is built here (no registry is reachable): a skeleton root file system (`podman import`), whose /usr, /etc,
the checkout and Python come in as read-only volumes, as a real deployment mounts its models; the simulated driver's
device files and run directory come in as volumes too (they are regular files: `--device` takes device nodes only).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PODMAN = "/usr/bin/podman"
CONMON = "/usr/bin/conmon"
CATATONIT = "/usr/libexec/podman/catatonit"
SIMRUNTIME = REPO / "tests" / "sim" / "simruntime"
IMAGE = "localhost/gpuops-simvllm:1"

# The node's name=systemd hierarchy alone at /sys/fs/cgroup/systemd, mounted inside the node's cgroup namespace (its
# root is the node's cgroup), in a read-only tmpfs over /sys/fs/cgroup; run in a mount namespace of its own.
CGROUP_VIEW = """umount --recursive --lazy /sys/fs/cgroup &&
mount -t tmpfs -o mode=755 gpuops-cgroup-view /sys/fs/cgroup &&
mkdir /sys/fs/cgroup/systemd &&
mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd &&
mount -o remount,ro,bind /sys/fs/cgroup"""

_WRAPPER = """#!/bin/sh
# podman on simulated node %(node)s (tests/integration/containertools.py): the real podman, in a mount namespace whose
# /sys/fs/cgroup holds the node's name=systemd hierarchy only; its OCI runtime is tests/sim/simruntime.
exec unshare --mount --propagation private /bin/sh -c '
%(view)s &&
CONTAINERS_CONF=%(conf)s CONTAINERS_STORAGE_CONF=%(storage)s exec %(podman)s "$@"' podman "$@"
"""

_CONTAINERS_CONF = """[engine]
runtime = "simruntime"
runtime_supports_json = ["simruntime"]
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "%(run)s/tmp"

[engine.runtimes]
simruntime = ["%(simruntime)s"]

[containers]
# Nodes share the host's network: a container without --network gets the host's, never a bridge (CNI would add
# one, with iptables rules, to the host).
netns = "host"
"""

_STORAGE_CONF = """[storage]
driver = "vfs"
graphroot = "%(root)s/storage"
runroot = "%(run)s/runroot"
"""

# The runtime options this machine needs on `podman run` (role variable vllm_server_container_options).
RUN_OPTIONS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


def require_podman(node):
    """Skip the test where podman cannot run on `node`, or fail it where CI is set (CONTRIBUTING.md, "Tests that
    skip")."""
    import pytest

    missing = podman_missing(node)
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)


def podman_missing(node):
    """Why podman cannot run on simulated node `node`, or None."""
    absent = [path for path in (PODMAN, CONMON, CATATONIT) if not os.path.exists(path)]
    if absent:
        return "%s not installed (make setup installs podman: scripts/setup.sh)" % ", ".join(absent)
    if os.geteuid() != 0:
        return "podman in a simulated node needs root (it mounts the node's cgroup view)"
    if node.info.get("cgroup") is None:
        return "node %s has no cgroups of its own, which simruntime needs for the containers' cgroups: %s" % (
            node.name,
            node.info.get("cgroup_unsupported"),
        )
    return None


class PodmanHost:
    """Podman on a simulated node: `podman(...)` runs it there, `build()` imports the image."""

    def __init__(self, node, tmp_path):
        self.node = node
        root = Path(tmp_path) / "podman"
        run = Path(node.info["run_dir"]) / "podman"  # the node's /run/gpusim/podman, on the host
        for directory in (root, run / "tmp"):
            directory.mkdir(parents=True, exist_ok=True)
        conf, storage = root / "containers.conf", root / "storage.conf"
        conf.write_text(_CONTAINERS_CONF % {"run": "/run/gpusim/podman", "simruntime": SIMRUNTIME})
        storage.write_text(_STORAGE_CONF % {"root": root, "run": "/run/gpusim/podman"})
        self.executable = Path(node.info["state_dir"]) / "bin" / "podman"
        self.executable.write_text(
            _WRAPPER % {"node": node.name, "view": CGROUP_VIEW, "conf": conf, "storage": storage, "podman": PODMAN}
        )
        self.executable.chmod(0o755)
        self.ids: set[str] = set()

    def podman(self, *args, check=True, timeout=120):
        return self.node.exec("podman", *args, check=check, timeout=timeout)

    def build(self, tag=IMAGE, entrypoint=("/bin/sh",)):
        """Import a skeleton root file system as image `tag` (its /usr, /etc and the checkout come as volumes)."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name in ("usr", "etc", "tmp", "proc", "dev", "sys", "run", "root", "var", "var/tmp", "work"):
                entry = tarfile.TarInfo(name)
                entry.type, entry.mode = tarfile.DIRTYPE, 0o1777 if name in ("tmp", "var/tmp") else 0o755
                tar.addfile(entry)
            for name, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")):
                entry = tarfile.TarInfo(name)
                entry.type, entry.linkname = tarfile.SYMTYPE, target
                tar.addfile(entry)
        tarball = Path(self.node.info["run_dir"]) / "podman" / "image.tar"
        tarball.write_bytes(buffer.getvalue())
        change = "ENTRYPOINT %s" % json.dumps(list(entrypoint))
        self.podman("import", "--change", change, "/run/gpusim/podman/image.tar", tag)
        return self.podman("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()

    def volumes(self, gpus):
        """The volumes a simulated vLLM needs in the container: the host's /usr and /etc, Python and the checkout
        (read-only), the node's driver library and `vllm`, its run directory, and the device files of `gpus`."""
        state = self.node.info["state_dir"]
        python_root = str(Path(os.path.realpath(REPO / ".venv" / "bin" / "python")).parents[2])
        read_only = ["/usr", "/etc", str(REPO), python_root, state]
        devices = ["/dev/nvidia%d" % gpu["minor"] for gpu in self.node.info["gpus"] if gpu["index"] in gpus]
        devices += ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        args = []
        for path in read_only:
            args += ["-v", "%s:%s:ro" % (path, path)]
        for path in ["/run/gpusim"] + devices:
            args += ["-v", "%s:%s" % (path, path)]
        return args

    def remember(self, container_id):
        self.ids.add(container_id)

    def inspect(self, name, template):
        return self.podman("inspect", "--format", template, name).stdout.strip()

    def clean(self):
        """Remove every container of this node (simruntime removes their cgroups; `gpunode down` removes the node's
        cgroup tree, with what a container killed with its node left)."""
        listed = self.podman("ps", "-aq", "--no-trunc", check=False).stdout.split()
        self.ids.update(listed)
        self.podman("rm", "-af", "-t", "0", check=False)
