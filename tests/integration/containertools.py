"""Real podman inside a simulated node (issue 43): what a GPU host that runs vLLM in containers looks like.

What podman needs here, measured on this machine (Debian 12: podman 4.3.1, runc 1.1.5, catatonit 0.1.7):
- runc: crun refuses the host's hybrid cgroups ("cgroups in hybrid mode not supported").
- the cgroupfs manager (no systemd runs here) and the vfs storage driver.
- explicit ulimits: podman's default limits exceed the machine's hard ones ("setrlimit RLIMIT_NOFILE: Operation not
  permitted"); the role passes them through `vllm_server_container_options`.
- a cgroup view of the node's own cgroups. The node's mount namespace shows every hierarchy of the host; runc under
  the cgroupfs manager would make the container's cgroup in each, memory and cpu included (and runc 1.1 refuses to run
  without a devices hierarchy: "mountpoint for devices not found", also with --rootless=true). So `podman` on the
  node's PATH (this wrapper, as `systemctl` is the simulated one) runs the real podman in a mount namespace of its own
  whose /sys/fs/cgroup is a read-only tmpfs with two hierarchies only: name=systemd (no controllers), mounted from
  inside the node's cgroup namespace, so the container's cgroup is `/libpod_parent/libpod-<id>` below the node's
  cgroup, the path podman's cgroupfs manager writes on a real host; and devices, which runc requires (the
  container's cgroup is made there at the hierarchy's root, `/libpod_parent/libpod-<id>`, and removed with the
  container; `down` removes what a killed test left). memory, cpu and the other hierarchies are never mounted.
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
DEVICES_ROOT = Path("/sys/fs/cgroup/devices/libpod_parent")
IMAGE = "localhost/gpuops-simvllm:1"

_WRAPPER = """#!/bin/sh
# podman on simulated node %(node)s (tests/integration/containertools.py): the real podman, in a mount namespace whose
# /sys/fs/cgroup holds the node's name=systemd hierarchy and the devices hierarchy only.
exec unshare --mount --propagation private /bin/sh -c '
umount --recursive --lazy /sys/fs/cgroup &&
mount -t tmpfs -o mode=755 gpuops-cgroup-view /sys/fs/cgroup &&
mkdir /sys/fs/cgroup/systemd /sys/fs/cgroup/devices &&
mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd &&
mount -t cgroup -o devices cgroup /sys/fs/cgroup/devices &&
mount -o remount,ro,bind /sys/fs/cgroup &&
CONTAINERS_CONF=%(conf)s CONTAINERS_STORAGE_CONF=%(storage)s exec %(podman)s "$@"' podman "$@"
"""

_CONTAINERS_CONF = """[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "%(run)s/tmp"
"""

_STORAGE_CONF = """[storage]
driver = "vfs"
graphroot = "%(root)s/storage"
runroot = "%(run)s/runroot"
"""

# The runtime options this machine needs on `podman run` (role variable vllm_server_container_options).
RUN_OPTIONS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


# runc makes each container's cgroup in the host's devices hierarchy (see above). Shared machines allow cgroups only
# below a node's own name=systemd cgroup, so the podman tests run only where this variable says it is allowed.
DEVICES_CGROUP_OPT_IN = "GPUOPS_PODMAN_DEVICES_CGROUP"


def require_podman():
    """Skip the test unless DEVICES_CGROUP_OPT_IN is 1; then skip it where podman cannot run here, or fail it where
    CI is set (CONTRIBUTING.md, "Tests that skip")."""
    import pytest

    if os.environ.get(DEVICES_CGROUP_OPT_IN) != "1":
        pytest.skip(
            "runc makes the container's cgroup in the host's devices hierarchy, which shared machines do not allow: "
            "set %s=1 where it is allowed" % DEVICES_CGROUP_OPT_IN
        )
    missing = podman_missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)


def podman_missing():
    """Why podman cannot run here, or None."""
    if not os.path.exists(PODMAN) or not os.path.exists("/usr/sbin/runc"):
        return "podman and runc are not installed (make setup installs them: scripts/setup.sh)"
    if os.geteuid() != 0:
        return "podman in a simulated node needs root (it mounts the node's cgroup view)"
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
        conf.write_text(_CONTAINERS_CONF % {"run": "/run/gpusim/podman"})
        storage.write_text(_STORAGE_CONF % {"root": root, "run": "/run/gpusim/podman"})
        self.executable = Path(node.info["state_dir"]) / "bin" / "podman"
        self.executable.write_text(_WRAPPER % {"node": node.name, "conf": conf, "storage": storage, "podman": PODMAN})
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
        """Remove every container of this node (runc deletes their devices cgroups), then the devices cgroups that
        a container killed with its node left behind."""
        listed = self.podman("ps", "-aq", "--no-trunc", check=False).stdout.split()
        self.ids.update(listed)
        self.podman("rm", "-af", "-t", "0", check=False)
        for container_id in sorted(self.ids):
            try:
                (DEVICES_ROOT / ("libpod-" + container_id)).rmdir()
            except OSError:
                pass
        try:
            DEVICES_ROOT.rmdir()  # only when empty: another node's container keeps it
        except OSError:
            pass
