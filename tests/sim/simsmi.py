"""Simulated `nvidia-smi` of simulated GPU nodes: test infrastructure (tests/sim/README.md, "Recovery").

Only the two management calls a GPU reset needs, run as root inside a node (bin/nvidia-smi, first on PATH):

- `nvidia-smi -pm 0|1 [-i ID[,ID]...]`: persistence mode of those GPUs (all without -i), written to node.conf's
  `persistence` key, which the fake driver library answers nvmlDeviceGetPersistenceMode from.
- `nvidia-smi --gpu-reset -i ID[,ID]...` (also `-r`): refused, with nvidia-smi's message and exit code, when the
  caller is not root (4), an ID names no GPU (6), a GPU is lost (15), a GPU's NVLink peers (node key `nvlink`) are
  not all listed (255), or a GPU is in use (255): another process has its device file open or mapped, its
  persistence mode is on, or a client without a process holds it (node key `kernel_clients`: a display driven by
  nvidia-drm, GPUDirect RDMA). Else each GPU is reset: the memory no context explains (`stray_mib`) is freed, a
  recovery action of GPU reset (1) or drain and reset (4) goes back to none, pending row remapping and page
  retirement are applied (no longer pending).

IDs are NVML indices, UUIDs or PCI bus ids, as nvidia-smi's -i takes them. Standard library only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import gpunode

EXIT_NO_PERMISSION = 4
EXIT_NOT_FOUND = 6
EXIT_GPU_LOST = 15
EXIT_OTHER = 255
IN_USE_HELP = (
    "{count} device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA "
    "application, graphics application such as an X server, or a monitoring application such as another instance "
    "of nvidia-smi). Please first kill all processes using this device and all compute applications running in the "
    "system."
)


def _entries(text: str) -> dict[int, str]:
    """INDEX:VALUE,... of node.conf as {index: value}."""
    entries = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        index, _sep, value = item.partition(":")
        entries[int(index)] = value
    return entries


def _joined(entries: dict[int, str]) -> str:
    return ",".join(f"{index}:{value}" for index, value in sorted(entries.items()))


class Gpus:
    def __init__(self, conf: dict[str, str]):
        self.conf = conf
        self.count = int(conf["gpus"])
        self.uuids = conf["uuids"].split(",")
        self.buses = conf["pci_bus_ids"].split(",")
        self.minors = [int(minor) for minor in conf["minors"].split(",")]

    def resolve(self, ident: str) -> int | None:
        if ident.isdigit() and int(ident) < self.count:
            return int(ident)
        for index in range(self.count):
            bus = self.buses[index]
            if ident in (self.uuids[index], bus) or ident.upper() in (bus, bus[4:]):
                return index
        return None

    def in_list(self, key: str) -> set[int]:
        return {int(item) for item in self.conf.get(key, "").split(",") if item.strip()}

    def group(self, index: int) -> set[int]:
        for text in self.conf.get("nvlink", "").split(","):
            members = {int(member) for member in text.split("+") if member.strip()}
            if index in members:
                return members
        return {index}

    def persistent(self, index: int) -> bool:
        own = _entries(self.conf.get("persistence", "")).get(index)
        return (own if own is not None else self.conf.get("persistence_mode", "1")) == "1"


def _device_users(path: str) -> set[int]:
    """PIDs (other than this one) with `path` open (an fd of any thread) or mapped, matched by device and inode."""
    try:
        target = os.stat(path)
    except OSError:
        return set()
    key = (target.st_dev, target.st_ino)
    proc = "/run/gpusim/proc" if os.path.exists("/run/gpusim/proc/self") else "/proc"
    users = set()
    for name in os.listdir(proc):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        if _has_open(f"{proc}/{name}", key) or _has_mapped(f"{proc}/{name}/maps", key):
            users.add(int(name))
    return users


def _has_open(process: str, key: tuple[int, int]) -> bool:
    try:
        tasks = os.listdir(process + "/task")
    except OSError:
        return False
    for task in tasks:
        directory = f"{process}/task/{task}/fd"
        try:
            fds = os.listdir(directory)
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"{directory}/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == key:
                return True
    return False


def _has_mapped(maps: str, key: tuple[int, int]) -> bool:
    try:
        lines = Path(maps).read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[4] == str(key[1]):
            major, _sep, minor = fields[3].partition(":")
            if os.makedev(int(major, 16), int(minor, 16)) == key[0]:
                return True
    return False


def _ids(argv: list[str]) -> list[str] | None:
    for k, argument in enumerate(argv):
        if argument in ("-i", "--id") and k + 1 < len(argv):
            return [part for part in argv[k + 1].split(",") if part]
        if argument.startswith("--id="):
            return [part for part in argument.split("=", 1)[1].split(",") if part]
    return None


def _option(argv: list[str], short: str, long: str) -> str | None:
    for k, argument in enumerate(argv):
        if argument == short and k + 1 < len(argv):
            return argv[k + 1]
        if argument.startswith(long + "="):
            return argument.split("=", 1)[1]
    return None


def _resolve(gpus: Gpus, ids: list[str]) -> list[int] | None:
    indices = []
    for ident in ids:
        index = gpus.resolve(ident)
        if index is None:
            print(f"No devices were found matching {ident}", file=sys.stderr)
            return None
        indices.append(index)
    return indices


def persistence(conf_path: Path, gpus: Gpus, indices: list[int], mode: str) -> int:
    entries = _entries(gpus.conf.get("persistence", ""))
    for index in indices:
        if os.geteuid() != 0:
            print(f"Unable to set persistence mode for GPU {gpus.buses[index]}: Insufficient Permissions")
            print("Terminating early due to previous errors.")
            return EXIT_NO_PERMISSION
        entries[index] = mode
    gpus.conf["persistence"] = _joined(entries)
    gpunode.write_conf(conf_path, gpus.conf)
    for index in indices:
        print(f"{'Enabled' if mode == '1' else 'Disabled'} persistence mode for GPU {gpus.buses[index]}.")
    print("All done.")
    return 0


def _refusal(gpus: Gpus, indices: list[int]) -> tuple[int, str] | None:
    """Why the reset of `indices` is refused (exit code, message), or None."""
    if os.geteuid() != 0:
        return EXIT_NO_PERMISSION, f"Unable to reset GPU {gpus.buses[indices[0]]}: Insufficient Permissions"
    lost = gpus.in_list("lost") & set(indices)
    if lost:
        return EXIT_GPU_LOST, f"Unable to reset GPU {gpus.buses[min(lost)]}: GPU is lost"
    for index in indices:
        missing = sorted(gpus.group(index) - set(indices))
        if missing:
            return (
                EXIT_OTHER,
                "GPU %s is linked by NVLink to GPU(s) %s, which must be reset with it in one command."
                % (gpus.buses[index], ", ".join(gpus.buses[peer] for peer in missing)),
            )
    busy = [
        index
        for index in indices
        if gpus.persistent(index)
        or index in gpus.in_list("kernel_clients")
        or _device_users(f"/dev/nvidia{gpus.minors[index]}")
    ]
    if busy:
        lines = ["The following GPUs could not be reset:"]
        lines += [f"  GPU {gpus.buses[index]}: In use by another client" for index in busy]
        return EXIT_OTHER, "\n".join(lines) + "\n\n" + IN_USE_HELP.format(count=len(busy))
    return None


def reset(conf_path: Path, gpus: Gpus, indices: list[int]) -> int:
    refusal = _refusal(gpus, indices)
    if refusal:
        print(refusal[1])
        return refusal[0]
    conf = gpus.conf
    stray = {index: mib for index, mib in _entries(conf.get("stray_mib", "")).items() if index not in indices}
    actions = {
        index: action
        for index, action in _entries(conf.get("recovery_action", "")).items()
        if index not in indices or action not in ("1", "4")
    }
    rows = _entries(conf.get("remapped_rows", ""))
    for index in set(rows) & set(indices):
        corrected, uncorrected, _pending, failure = rows[index].split(":")
        rows[index] = f"{corrected}:{uncorrected}:0:{failure}"
    retired = sorted(gpus.in_list("retired_pending") - set(indices))
    conf.update(
        stray_mib=_joined(stray),
        recovery_action=_joined(actions),
        remapped_rows=_joined(rows),
        retired_pending=",".join(str(index) for index in retired),
    )
    gpunode.write_conf(conf_path, {key: value for key, value in conf.items() if value != ""})
    for index in indices:
        print(f"GPU {gpus.buses[index]} was successfully reset.")
    print("All done.")
    return 0


def main(argv: list[str], run_dir: str = "/run/gpusim") -> int:
    conf_path = Path(run_dir, "node.conf")
    gpus = Gpus(gpunode.read_conf(conf_path))
    ids = _ids(argv)
    indices = _resolve(gpus, ids) if ids is not None else list(range(gpus.count))
    if indices is None:
        return EXIT_NOT_FOUND
    mode = _option(argv, "-pm", "--persistence-mode")
    if mode is not None:
        if mode.upper() in ("ENABLED", "DISABLED"):
            mode = "1" if mode.upper() == "ENABLED" else "0"
        return persistence(conf_path, gpus, indices, mode)
    if "--gpu-reset" in argv or "-r" in argv:
        if ids is None:
            print("Resetting all GPUs at once is not simulated: give -i.", file=sys.stderr)
            return EXIT_OTHER
        return reset(conf_path, gpus, indices)
    print("nvidia-smi (simulated): only -pm and --gpu-reset are simulated", file=sys.stderr)
    return EXIT_OTHER


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
