"""One world's runs inside its node (run there with the venv's Python: `python inside.py ARGS_JSON [plant|truth]`).

Reads the simulator's truth (what tests/worlds/oracle.py judges by), then runs the collection's modules as Ansible
runs them (module main() with its arguments, tests/module_main.py's way): gpu_facts, gpu_kill in check mode, gpu_kill,
gpu_kill again. Prints one JSON object. `plant` only plants (the playbooks then decide), `truth` only reads the truth.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, ".collections"))
WORLD = "/run/gpusim/worlds"

from ansible.module_utils.testing import patch_module_args  # noqa: E402

from ansible_collections.gpuops.nvidia.plugins.modules import gpu_facts, gpu_kill  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plant  # noqa: E402


def _read(path, mode="r"):
    try:
        with open(path, mode) as handle:
            return handle.read()
    except OSError:
        return None


def processes():
    """{pid: {state, ppid, start, comm, cmdline, uid, exe, fds: [[device path, position]]}} from /proc."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _read("/proc/%s/stat" % name, "rb")
        if stat is None:
            continue
        close = stat.rindex(b")")
        fields = stat[close + 2 :].split()
        entry = {
            "state": fields[0].decode(),
            "ppid": int(fields[1]),
            "start": int(fields[19]),
            "comm": stat[stat.index(b"(") + 1 : close].decode(errors="replace"),
            "cmdline": (_read("/proc/%s/cmdline" % name, "rb") or b"")
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .strip(),
            "fds": [],
        }
        try:
            entry["uid"] = os.stat("/proc/" + name).st_uid
            entry["exe"] = os.readlink("/proc/%s/exe" % name)
        except OSError:
            entry["uid"], entry["exe"] = None, None
        try:
            fds = os.listdir("/proc/%s/fd" % name)
        except OSError:
            fds = []
        for fd in fds:
            try:
                target = os.readlink("/proc/%s/fd/%s" % (name, fd))
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                info = _read("/proc/%s/fdinfo/%s" % (name, fd)) or ""
                position = next((int(line.split()[1]) for line in info.splitlines() if line.startswith("pos:")), 0)
                entry["fds"].append([target, position])
        out[name] = entry
    return out


def contexts():
    """{file name: [line, ...]} of the simulator's context files."""
    directory = "/run/gpusim/contexts"
    out = {}
    for name in os.listdir(directory):
        if not name.startswith("."):
            text = _read(os.path.join(directory, name))
            if text is not None:
                out[name] = text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
    return out


def signals():
    directory = WORLD + "/sig"
    out = {}
    for name in os.listdir(directory):
        out[name] = [int(x) for x in (_read(os.path.join(directory, name)) or "").split()]
    return out


def truth():
    return {"processes": processes(), "contexts": contexts(), "signals": signals()}


def run(module, args):
    """(exit code, result) of module.main() with `args`."""
    stdout = io.StringIO()
    with patch_module_args(args), contextlib.redirect_stdout(stdout):
        try:
            module.main()
        except SystemExit as exited:
            code = exited.code
        else:
            code = None
    text = stdout.getvalue()
    try:
        return code, json.loads(text[text.index("{") :])
    except ValueError:
        return code, {"failed": True, "unparsed": text}


def _others():
    """Every process of this node but its init, this process and its ancestors. The pooled nodes run nothing but
    this harness, so these are what earlier worlds planted, whether their manifest names them or not (a planting that
    failed wrote none), and a run of this script that outlived its caller's timeout."""
    mine, pid = {1}, os.getpid()
    while pid > 1:
        mine.add(pid)
        try:
            pid = int(_read("/proc/%d/stat" % pid).rsplit(")", 1)[1].split()[1])
        except (AttributeError, IndexError, ValueError):
            break
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) not in mine]


def cleanup():
    """End every process earlier worlds left on this node (all started by this harness) and their bookkeeping."""
    previous = _others()
    for pid in previous:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while any(os.path.exists("/proc/%d" % pid) for pid in previous) and time.monotonic() < deadline:
        time.sleep(0.02)
    for directory in ("/run/gpusim/contexts", "/run/gpusim/released", WORLD + "/sig", WORLD):
        if os.path.isdir(directory):
            for name in os.listdir(directory):
                path = os.path.join(directory, name)
                if os.path.isfile(path):
                    os.unlink(path)


def _plant_once(world):
    """Plant through a planter that exits, so the world's processes are orphans of the node's init. Raises
    PlantingFailed with the planter's error where it wrote no manifest."""
    planter = os.fork()
    if planter == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            plant.plant(world)
        except BaseException as error:  # noqa: B036 - said to the parent, which decides
            with open(WORLD + "/plant.error", "w") as handle:
                handle.write("%s: %s" % (type(error).__name__, error))
        finally:
            os._exit(0)
    os.waitpid(planter, 0)
    text = _read(WORLD + "/manifest.json")
    if text is None:
        raise PlantingFailed(_read(WORLD + "/plant.error") or "the planter wrote no manifest")
    return json.loads(text)


class PlantingFailed(Exception):
    """The world could not be planted (a harness failure, never the collection's): the run stops rather than judge a
    world that is not there."""


def plant_world(world):
    """The world planted, once more after a cleanup where the first planting failed (a machine too busy for its
    bounds); a second failure raises PlantingFailed."""
    try:
        return _plant_once(world)
    except PlantingFailed:
        cleanup()
        os.makedirs(WORLD + "/sig", exist_ok=True)
        return _plant_once(world)


def resolve(selection, manifest, node):
    """Module arguments of a symbolic selection: gpus as [kind, index(, gi)], pids as [process id, role]."""
    args = dict(selection["options"])
    if selection.get("gpus") is not None:
        gpus = []
        for item in selection["gpus"]:
            if item[0] == "index":
                gpus.append(str(item[1]))
            elif item[0] == "uuid":
                gpus.append(node["uuids"][item[1]])
            else:
                gpus.append(node["mig"][str(item[1])][str(item[2])])
        args["gpus"] = gpus
    if selection.get("pids") is not None:
        wanted = {tuple(item) for item in selection["pids"]}
        pids = sorted({e["pid"] for e in manifest if (e["id"], e["role"]) in wanted})
        args["pids"] = pids or [999999]
    return args


def main():
    if sys.argv[2:] == ["truth"]:
        json.dump(truth(), sys.stdout)
        return
    spec = json.loads(_read(sys.argv[1]))
    if sys.argv[2:] == ["plant"]:  # a world the playbooks decide (world.run_playbook_world)
        cleanup()
        os.makedirs(WORLD + "/sig", exist_ok=True)
        manifest = plant_world(spec["world"])
        json.dump(
            {"manifest": manifest, "args": resolve(spec["selection"], manifest, spec["node"]), "before": truth()},
            sys.stdout,
        )
        return
    clock = [time.monotonic()]
    seconds = {}

    def lap(name):
        clock.append(time.monotonic())
        seconds[name] = round(clock[-1] - clock[-2], 3)

    cleanup()
    os.makedirs(WORLD + "/sig", exist_ok=True)
    manifest = plant_world(spec["world"])
    args = resolve(spec["selection"], manifest, spec["node"])
    out = {"manifest": manifest, "args": args, "before": truth(), "phases": seconds}
    lap("plant")
    out["facts"] = run(gpu_facts, {})
    lap("facts")
    out["check"] = run(gpu_kill, dict(args, _ansible_check_mode=True))
    out["after_check"] = {"signals": signals()}
    lap("check")
    out["kill"] = run(gpu_kill, args)
    out["after"] = truth()
    lap("kill")
    out["again"] = run(gpu_kill, args)
    out["last"] = truth()
    lap("again")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
