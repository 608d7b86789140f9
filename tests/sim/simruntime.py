"""simruntime: the simulator's OCI runtime, with runc's command line, for podman 4.3.1 and conmon 2.1 in a node.

Run through tests/sim/simruntime (`/usr/bin/python3 -I simruntime.py ARGS`): the executable podman is given.

Test infrastructure (tests/sim/README.md, "The simulated OCI runtime"). Podman, conmon, catatonit and the kernel's
namespaces are real; this stands in for runc, which refuses to run without the host's devices cgroup hierarchy.
Standard library only, run by Debian 12's /usr/bin/python3 (3.11: no os.unshare, so libc through ctypes).

Commands (runc's, as podman's libpod/oci_conmon_common.go and conmon's src/runtime_args.c call them):
  [--root DIR] [--log FILE] [--log-format json|text] create --bundle B --pid-file P [--no-new-keyring] ID
  start ID | state ID | kill [--all] ID [SIGNAL] | delete [--force] ID | --version
`--systemd-cgroup` and `--console-socket` (a terminal) are refused; `exec` (podman exec, healthchecks) too.
Every command but --version and --help runs only in a simulated node, whatever --cgroup-manager says: a cgroup
namespace that is not the host's with its name=systemd hierarchy mounted at /sys/fs/cgroup/systemd (podman's wrapper,
tests/integration/containertools.py), a PID namespace of its own and gpusim-init's /run/gpusim and /run/gpusim/proc.
Elsewhere it refuses before it reads, makes or signals anything.

What create does, after runc 1.1 and the OCI runtime spec 1.0 (runtime.md "Lifecycle", "Operations"):
- the container's init is PID 1 of a new PID namespace (config-linux.md "Namespaces"; a namespace with a `path` is
  joined with setns): create forks a child that moves itself into the container's cgroup, unshares the namespaces
  and forks the init, then exits (runc's libcontainer/nsenter/nsexec.c double fork). The init is thereby an orphan
  of conmon, a child subreaper. When it dies the kernel kills the rest of its PID namespace (pid_namespaces(7)).
- the cgroup `linux.cgroupsPath` (config-linux.md "Cgroups path"), in the name=systemd hierarchy at
  /sys/fs/cgroup/systemd only, below the node's own cgroup. Create makes it (its parents may exist) and refuses the
  root cgroup and a cgroup that exists (runc 1.1 warns about a cgroup with processes, runc 1.2 refuses it: runc PRs
  3223, 3782); state.json records it, and kill --all and delete act only on a cgroup create made. No other hierarchy
  is touched; `linux.resources` are not applied (no controller).
- the root file system (config.md "Root"), `mounts` (config.md "Mounts"; runc's libcontainer/rootfs_linux.go
  mountToRootfs), the default devices bound from the node's /dev (config-linux.md "Default Devices"; mknod is not
  allowed on shared machines, runc's bindMountDeviceNode does the same in a user namespace), `linux.devices` bound
  likewise, the /dev symlinks (setupDevSymlinks), pivot_root (pivotRoot; chroot with --no-pivot), a read-only root,
  `linux.maskedPaths` and `linux.readonlyPaths` (maskPath, readonlyPath), `hostname`, `linux.sysctl` of the
  namespaces it owns, `process` (cwd, env, user, rlimits, noNewPrivileges, oomScoreAdj, umask).
  Read-only: a remount changes one mount. The read-only root, a bind or rbind with `ro` and each of `readonlyPaths`
  are read-only at their top mount only, as runc 1.1's setReadonly, remount and readonlyPath make them: their
  submounts keep their flags. The `cgroup` mount and the /sys bound where a new sysfs is refused are read-only
  throughout (each submount remounted), as runc's cgroup mounts and a new sysfs are.
- the init waits on `exec.fifo` in the state directory until `start` reads it, then execs `process.args`
  (runc's libcontainer/standard_init_linux.go; container_linux.go exec).
- the pid file (the init's PID as the caller sees it) and state.json under --root/ID (default /run/simruntime).
Left out: seccomp, capabilities, AppArmor and SELinux labels (root keeps its own), resource limits through cgroups,
the devices cgroup, hooks (refused), user namespaces (refused), terminals (refused).
"""

import ctypes
import datetime
import errno
import json
import os
import platform
import re
import resource
import select
import signal
import sys
import time

VERSION = "simruntime version 1.0\nspec: 1.0.2\n"
DEFAULT_ROOT = "/run/simruntime"
CGROUP_VIEW = "/sys/fs/cgroup/systemd"
INITIAL_CGROUP_NS = "cgroup:[4026531835]"  # PROC_CGROUP_INIT_INO, include/linux/proc_ns.h
INITIAL_PID_NS = "pid:[4026531836]"  # PROC_PID_INIT_INO
NODE_RUN = "/run/gpusim"  # every node has it, with the node's proc at /run/gpusim/proc (tests/sim/init/gpusim-init.c)
WAIT_S = 10.0  # every wait is bounded: the init's setup, start's fifo, delete's cgroup

CLONE = {
    "mount": 0x00020000,
    "cgroup": 0x02000000,
    "uts": 0x04000000,
    "ipc": 0x08000000,
    "user": 0x10000000,
    "pid": 0x20000000,
    "network": 0x40000000,
}
MS = {
    "ro": 1, "nosuid": 2, "nodev": 4, "noexec": 8, "sync": 16, "remount": 32, "mand": 64, "dirsync": 128,
    "noatime": 1024, "nodiratime": 2048, "bind": 4096, "rbind": 4096 | 16384, "relatime": 1 << 21,
    "strictatime": 1 << 24,
}  # fmt: skip
MS_CLEAR = {"rw": 1, "suid": 2, "dev": 4, "exec": 8, "async": 16, "nomand": 64, "atime": 1024, "diratime": 2048,
            "norelatime": 1 << 21, "nostrictatime": 1 << 24}  # fmt: skip
MS_BIND, MS_REMOUNT, MS_RDONLY, MS_REC, MS_MOVE = 4096, 32, 1, 16384, 8192
PROPAGATION = {
    "private": 1 << 18, "rprivate": (1 << 18) | MS_REC, "slave": 1 << 19, "rslave": (1 << 19) | MS_REC,
    "shared": 1 << 20, "rshared": (1 << 20) | MS_REC, "unbindable": 1 << 17, "runbindable": (1 << 17) | MS_REC,
}  # fmt: skip
RUNTIME_ONLY_OPTIONS = {"tmpcopyup", "notmpcopyup", "z", "Z", "U", "copy", "nocopy"}
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS = 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
DEFAULT_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_SYMLINKS = (("/proc/self/fd", "fd"), ("/proc/self/fd/0", "stdin"), ("/proc/self/fd/1", "stdout"),
                ("/proc/self/fd/2", "stderr"), ("/proc/kcore", "core"))  # fmt: skip
RLIMITS = {name: getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")}
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,1023}")

libc = ctypes.CDLL(None, use_errno=True)


class RuntimeError_(Exception):
    """A failure, said to the caller (stderr and the --log file) with exit status 1."""


class Options:
    root = DEFAULT_ROOT
    log = None
    log_format = "text"
    cgroups = True


def log(level, message):
    """runc's log: JSON lines ({"level", "msg", "time"}) in --log, which podman reads back for the error."""
    if Options.log:
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat()
        line = (
            json.dumps({"level": level, "msg": message, "time": stamp})
            if Options.log_format == "json"
            else ("%s %s: %s" % (stamp, level, message))
        )
        try:
            with open(Options.log, "a") as stream:
                stream.write(line + "\n")
        except OSError:
            pass


def check(result, what):
    if result != 0:
        error = ctypes.get_errno()
        raise RuntimeError_("%s: %s" % (what, os.strerror(error)))


def _encode(value):
    return None if value is None else value.encode()


def mount(source, target, fstype, flags, data=None):
    check(
        libc.mount(_encode(source), _encode(target), _encode(fstype), ctypes.c_ulong(flags), _encode(data)),
        "mount %s on %s (%s)" % (source, target, fstype),
    )


# --- state --------------------------------------------------------------------------------------------------------


def state_dir(container_id):
    if not ID_PATTERN.fullmatch(container_id) or container_id in (".", ".."):
        raise RuntimeError_("invalid container id %r" % container_id)
    return os.path.join(Options.root, container_id)


def load(container_id):
    try:
        with open(os.path.join(state_dir(container_id), "state.json")) as stream:
            return json.load(stream)
    except FileNotFoundError:
        raise RuntimeError_("container %s does not exist" % container_id) from None


def proc_stat(pid):
    """(state letter, start time in clock ticks) of `pid`, or None when it has none."""
    try:
        with open("/proc/%d/stat" % pid) as stream:
            fields = stream.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0], int(fields[19])


def init_alive(saved):
    seen = proc_stat(saved["pid"])
    return seen is not None and seen[0] not in "ZX" and seen[1] == saved["starttime"]


def status(saved):
    if not init_alive(saved):
        return "stopped"
    fifo = os.path.join(state_dir(saved["id"]), "exec.fifo")
    return "created" if os.path.exists(fifo) else "running"


def cmd_state(args):
    (container_id,) = args
    saved = load(container_id)
    now = status(saved)
    shown = {key: saved[key] for key in ("ociVersion", "id", "bundle", "rootfs", "created", "owner")}
    shown.update(status=now, pid=saved["pid"] if now != "stopped" else 0, annotations=saved.get("annotations", {}))
    json.dump(shown, sys.stdout, indent=2)
    sys.stdout.write("\n")


# --- the node and its cgroup (name=systemd only) ------------------------------------------------------------------


def _unescape(text):
    """A path of /proc/self/mountinfo with its octal escapes (\\040 for a space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), text)


def mounts():
    """/proc/self/mountinfo (proc(5)): (root, mount point, mount options, file system type, super options) per mount,
    in mount order, paths unescaped."""
    found = []
    with open("/proc/self/mountinfo") as stream:
        for line in stream:
            fields = line.split()
            tail = fields.index("-")
            found.append(
                (_unescape(fields[3]), _unescape(fields[4]), fields[5].split(","), fields[tail + 1],
                 fields[tail + 3].split(","))
            )  # fmt: skip
    return found


def require_node():
    """Refuse to run outside a simulated node: the cgroup view, then the node's own PID namespace and gpusim-init's
    mounts. Checked before every command, so nothing is read, made or signalled elsewhere."""
    cgroup_view()
    kinds = {
        point: kind for _root, point, _options, kind, _supers in mounts()
    }  # the last mount at a point is the one seen
    if (
        os.readlink("/proc/self/ns/pid") == INITIAL_PID_NS
        or NODE_RUN not in kinds
        or kinds.get(NODE_RUN + "/proc") != "proc"
    ):
        raise RuntimeError_(
            "simruntime runs only in a simulated node (a PID namespace of its own, %s and the node's proc at %s/proc);"
            " this is not one" % (NODE_RUN, NODE_RUN)
        )


def cgroup_view():
    """CGROUP_VIEW when it is a name=systemd hierarchy seen from a cgroup namespace of its own, else an error: this
    runtime never makes a cgroup anywhere else (tests/sim/README.md, "Owner cgroups")."""
    if os.readlink("/proc/self/ns/cgroup") == INITIAL_CGROUP_NS:
        raise RuntimeError_("simruntime runs only inside a cgroup namespace of a node; this is the host's")
    seen = [entry for entry in mounts() if entry[1] == CGROUP_VIEW]
    if seen and seen[-1][0] == "/" and seen[-1][3] == "cgroup" and "name=systemd" in seen[-1][4]:
        return CGROUP_VIEW
    raise RuntimeError_(
        "simruntime runs only in a node's cgroup view: %s is not a name=systemd hierarchy mounted from the cgroup"
        " namespace's root" % CGROUP_VIEW
    )


def own_cgroup():
    with open("/proc/self/cgroup") as stream:
        for line in stream:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "name=systemd":
                return path
    return "/"


def cgroup_path(spec, container_id):
    """The container's cgroup as the node shows it (linux.cgroupsPath: absolute, or relative to ours), checked."""
    path = spec.get("linux", {}).get("cgroupsPath") or "/simruntime/" + container_id
    if ":" in path:
        raise RuntimeError_("cgroupsPath %r is the systemd driver's form: simruntime takes cgroupfs paths" % path)
    if not path.startswith("/"):
        path = os.path.join(own_cgroup(), path)
    return "/" + "/".join(plain_parts(path))


def plain_parts(path):
    """The names of cgroup `path`: plain ones, at least one (never the root cgroup), else an error."""
    parts = [part for part in path.split("/") if part]
    if any(part in (".", "..") or part.startswith("cgroup.") for part in parts):
        raise RuntimeError_("cgroupsPath %r is not a plain path" % path)
    if not parts:
        raise RuntimeError_("cgroupsPath %r is the root cgroup: a container needs a cgroup of its own" % path)
    return parts


def cgroup_dir(path):
    """The directory of cgroup `path` (as the node shows it) in the view, both checked again."""
    return os.path.join(cgroup_view(), *plain_parts(path))


def make_cgroup(path):
    """Make the container's cgroup: its parents may exist, the cgroup itself must not (another's processes)."""
    directory = cgroup_dir(path)
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    try:
        os.mkdir(directory)
    except FileExistsError:
        raise RuntimeError_("cgroup %s exists already: a container needs a cgroup of its own" % path) from None


def made_cgroup(saved):
    """The directory of the cgroup create made for the container (state.json says so), else None."""
    return cgroup_dir(saved["cgroup"]) if saved.get("cgroup") and saved.get("cgroup_made") else None


def remove_cgroup(directory):
    """SIGKILL what is left in the container's cgroup until it is empty, then remove it; bounded by WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        kill_pids(cgroup_pids(directory), signal.SIGKILL)
        try:
            if os.path.isdir(directory):
                os.rmdir(directory)
            return
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                raise RuntimeError_(
                    "cannot remove cgroup %s (processes %s): %s" % (directory, cgroup_pids(directory), error.strerror)
                ) from None
        time.sleep(0.02)


def kill_pids(pids, number):
    for pid in pids:
        try:
            os.kill(pid, number)
        except ProcessLookupError:
            pass


def cgroup_pids(directory):
    try:
        with open(os.path.join(directory, "cgroup.procs")) as stream:
            return [int(line) for line in stream if line.strip()]
    except FileNotFoundError:
        return []


# --- create -------------------------------------------------------------------------------------------------------


def parse_flags(args, known, switches=()):
    """runc-style flags (`--flag value`, `--flag=value`, switches) before the positional arguments."""
    values, rest = {}, []
    items = list(args)
    while items:
        item = items.pop(0)
        name, _equals, inline = item.partition("=")
        if name in switches:
            values[name] = True
        elif name in known:
            values[name] = inline if inline or "=" in item else items.pop(0)
        elif item.startswith("-") and item != "-":
            raise RuntimeError_("unknown option %s" % item)
        else:
            rest.append(item)
    return values, rest


def cmd_create(args):
    flags, rest = parse_flags(
        args, ("--bundle", "-b", "--pid-file", "--console-socket", "--preserve-fds"), ("--no-new-keyring", "--no-pivot")
    )
    if "--console-socket" in flags:
        raise RuntimeError_("simruntime runs no terminal (--console-socket): run the container without --tty")
    if len(rest) != 1:
        raise RuntimeError_("create takes one container id")
    container_id = rest[0]
    bundle = os.path.abspath(flags.get("--bundle") or flags.get("-b") or ".")
    with open(os.path.join(bundle, "config.json")) as stream:
        spec = json.load(stream)
    refuse_unsupported(spec)
    cgroup = cgroup_path(spec, container_id) if Options.cgroups else None
    directory = state_dir(container_id)
    os.makedirs(Options.root, mode=0o700, exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        raise RuntimeError_("container %s exists already" % container_id) from None
    made = False
    try:
        if cgroup:
            make_cgroup(cgroup)
            made = True
        create(spec, bundle, container_id, directory, flags, cgroup)
    except BaseException:
        undo_create(directory, cgroup if made else None)
        raise


def undo_create(directory, cgroup):
    """A failed create leaves nothing: the cgroup it made (and what is in it) and the state directory."""
    try:
        if cgroup:
            remove_cgroup(cgroup_dir(cgroup))
    except RuntimeError_ as error:
        log("error", "after a failed create: %s" % error)
        sys.stderr.write("simruntime: after a failed create: %s\n" % error)
    remove_tree(directory)


def refuse_unsupported(spec):
    process = spec.get("process") or {}
    if process.get("terminal"):
        raise RuntimeError_("simruntime runs no terminal (process.terminal): run the container without --tty")
    if any(spec.get("hooks", {}).values()):
        raise RuntimeError_("simruntime runs no OCI hooks (%s)" % ", ".join(sorted(spec["hooks"])))
    for namespace in spec.get("linux", {}).get("namespaces", []):
        if namespace["type"] == "user":
            raise RuntimeError_("simruntime makes no user namespace (rootless podman): run podman as root")
        if namespace["type"] not in CLONE:
            raise RuntimeError_("unknown namespace type %r" % namespace["type"])
    if not process.get("args"):
        raise RuntimeError_("process.args is empty")


def create(spec, bundle, container_id, directory, flags, cgroup):
    """The container's init, in the cgroup `cgroup` (made, as the node shows it, or None), and its state.json."""
    rootfs = os.path.join(bundle, spec["root"]["path"])
    cgroup_directory = cgroup_dir(cgroup) if cgroup else None
    os.mkfifo(os.path.join(directory, "exec.fifo"), 0o600)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        run_child(spec, rootfs, cgroup_directory, directory, write_end, flags)
    os.close(write_end)
    pid, message = await_init(read_end, child)
    if message != "ready":
        raise RuntimeError_(message)
    saved = {
        "ociVersion": spec.get("ociVersion", "1.0.2"),
        "id": container_id,
        "pid": pid,
        "starttime": proc_stat(pid)[1],
        "bundle": bundle,
        "rootfs": rootfs,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "owner": "",
        "cgroup": cgroup,  # as the node shows it: kill --all and delete find it through the view again
        "cgroup_made": bool(cgroup),
        "annotations": spec.get("annotations", {}),
    }
    write_atomic(os.path.join(directory, "state.json"), json.dumps(saved))
    if flags.get("--pid-file"):
        write_atomic(os.path.abspath(flags["--pid-file"]), str(pid))


def await_init(read_end, child):
    """(the init's PID, "ready" or the error it reported), read from the pipe within WAIT_S."""
    data, deadline = b"", time.monotonic() + WAIT_S
    with os.fdopen(read_end, "rb", buffering=0) as stream:
        while time.monotonic() < deadline:
            ready, _writable, _failed = select.select([stream], [], [], 0.1)
            if ready:
                chunk = stream.read(4096)
                if not chunk:
                    break
                data += chunk
    os.waitpid(child, 0)
    lines = data.decode(errors="replace").splitlines()
    pids = [int(line.split()[1]) for line in lines if line.startswith("pid ")]
    words = [line[len("init: ") :] for line in lines if line.startswith("init: ")]
    if not pids:
        raise RuntimeError_("the container's init did not start: %s" % (" ".join(lines) or "no word from it"))
    pid = pids[0]
    message = words[0] if words else "the container's init ended before it was ready"
    if message != "ready" and pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pid, message


def write_atomic(path, text):
    temporary = path + ".tmp"
    with open(temporary, "w") as stream:
        stream.write(text)
    os.rename(temporary, path)


def run_child(spec, rootfs, cgroup, directory, pipe, flags):
    """The middle process: into the cgroup, into the namespaces, fork the init (PID 1 there), report its PID, exit."""
    code = 1
    try:
        if cgroup:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as stream:
                stream.write(str(os.getpid()))
        new = enter_namespaces(spec)
        init = os.fork()
        if init == 0:
            run_init(spec, rootfs, directory, pipe, new, flags)
        os.write(pipe, b"pid %d\n" % init)
        code = 0
    except BaseException as error:  # noqa: B036 - the child never returns into create's code
        os.write(pipe, b"pid 0\ninit: %s\n" % str(error).encode())
    finally:
        os._exit(code)


def enter_namespaces(spec):
    """Join the namespaces with a path, unshare the others; returns the types made new."""
    new, unshare = set(), 0
    for namespace in spec.get("linux", {}).get("namespaces", []):
        kind = namespace["type"]
        if namespace.get("path"):
            descriptor = os.open(namespace["path"], os.O_RDONLY)
            check(libc.setns(descriptor, CLONE[kind]), "setns %s %s" % (kind, namespace["path"]))
            os.close(descriptor)
        else:
            new.add(kind)
            unshare |= CLONE[kind]
    check(libc.unshare(unshare), "unshare %s" % ",".join(sorted(new)))
    return new


def run_init(spec, rootfs, directory, pipe, new, flags):
    """PID 1 of the container: its root file system, then the process settings; waits for `start`, then execs."""
    try:
        state_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
        linux = spec.get("linux", {})
        if "mount" in new:
            prepare_rootfs(spec, rootfs, linux)
            enter_rootfs(rootfs, "--no-pivot" in flags)
            finish_rootfs(spec, linux)
        if "uts" in new and spec.get("hostname"):
            name = spec["hostname"].encode()
            check(libc.sethostname(name, len(name)), "sethostname")
        apply_sysctl(linux.get("sysctl", {}), new)
        process = spec["process"]
        apply_process(process)
        os.write(pipe, b"init: ready\n")
        os.close(pipe)
        fifo = os.open("exec.fifo", os.O_WRONLY | os.O_CLOEXEC, dir_fd=state_fd)  # blocks until `start`
        os.write(fifo, b"0")
        os.close(fifo)
        os.close(state_fd)
        finish_process(process, int(flags.get("--preserve-fds", 0)))
        os.execvpe(process["args"][0], process["args"], environment(process))
    except BaseException as error:  # noqa: B036
        try:
            os.write(pipe, b"init: %s\n" % str(error).encode())
        except OSError:
            log("error", "container init: %s" % error)
    os._exit(127)


# --- the root file system -----------------------------------------------------------------------------------------


def resolve(rootfs, path):
    """`path` inside `rootfs` with its symlinks resolved inside it (runc's securejoin)."""
    parts, done, hops = [part for part in path.split("/") if part], "", 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            done = os.path.dirname(done)
            continue
        candidate = done + "/" + part
        full = rootfs + candidate
        if os.path.islink(full):
            hops += 1
            if hops > 40:
                raise RuntimeError_("too many symlinks in %s" % path)
            target = os.readlink(full)
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                done = ""
            continue
        done = candidate
    return rootfs + (done or "/")


def mount_flags(options):
    flags, propagation, data = 0, 0, []
    for option in options:
        if option in MS:
            flags |= MS[option]
        elif option in MS_CLEAR:
            flags &= ~MS_CLEAR[option]
        elif option in PROPAGATION:
            propagation |= PROPAGATION[option]
        elif option not in RUNTIME_ONLY_OPTIONS:
            data.append(option)
    return flags, propagation, ",".join(data) or None


def make_mountpoint(target, source_is_dir):
    if os.path.lexists(target):
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if source_is_dir:
        os.mkdir(target, 0o755)
    else:
        with open(target, "a"):
            pass


def bind(source, target, flags, propagation):
    """A bind (rbind with MS_REC) and its flags: MS_RDONLY and the others apply to the top mount only, as in runc."""
    make_mountpoint(target, os.path.isdir(source))
    mount(source, target, "bind", MS_BIND | (flags & MS_REC))
    extra = flags & ~(MS_BIND | MS_REC)
    if extra:
        mount(None, target, None, MS_BIND | MS_REMOUNT | extra)
    if propagation:
        mount(None, target, None, propagation)


def read_only_below(target):
    """Each mount below `target` remounted read-only, keeping its nosuid, nodev, noexec and atime flags (a remount
    changes one mount: MS_REC does not apply to it)."""
    kept = ("nosuid", "nodev", "noexec", "noatime", "nodiratime", "relatime")
    for _root, point, options, _kind, _supers in mounts():
        if point.startswith(target.rstrip("/") + "/"):
            flags = MS_BIND | MS_REMOUNT | MS_RDONLY
            for option in options:
                flags |= MS[option] if option in kept else 0
            mount(None, point, None, flags)


def prepare_rootfs(spec, rootfs, linux):
    """runc's prepareRoot and mountToRootfs: the propagation, rootfs a mount point, each of `mounts`, /dev."""
    propagation = PROPAGATION.get(linux.get("rootfsPropagation", "rslave"), PROPAGATION["rslave"])
    mount(None, "/", None, propagation)
    mount(rootfs, rootfs, "bind", MS_BIND | MS_REC)
    for entry in spec.get("mounts", []):
        mount_one(rootfs, entry)
    dev = resolve(rootfs, "/dev")
    listed = {device["path"] for device in linux.get("devices", [])}
    for name in DEFAULT_DEVICES:
        if "/dev/" + name not in listed and os.path.exists("/dev/" + name):
            target = resolve(rootfs, "/dev/" + name)
            if not os.path.ismount(target):
                bind("/dev/" + name, target, 0, 0)
    for device in linux.get("devices", []):
        if os.path.exists(device["path"]):
            bind(device["path"], resolve(rootfs, device["path"]), 0, 0)
        else:
            log("warning", "device %s is not on this node and mknod is not allowed here: skipped" % device["path"])
    for source, name in DEV_SYMLINKS:
        if not os.path.lexists(os.path.join(dev, name)):
            os.symlink(source, os.path.join(dev, name))
    if os.path.isdir(os.path.join(dev, "pts")) and not os.path.lexists(os.path.join(dev, "ptmx")):
        os.symlink("pts/ptmx", os.path.join(dev, "ptmx"))
    cwd = spec["process"].get("cwd", "/")
    os.makedirs(resolve(rootfs, cwd), exist_ok=True)


def mount_one(rootfs, entry):
    kind, source, options = entry.get("type", "bind"), entry.get("source", ""), entry.get("options", [])
    flags, propagation, data = mount_flags(options)
    target = resolve(rootfs, entry["destination"])
    if kind == "bind" or flags & MS_BIND:
        if not os.path.exists(source):
            raise RuntimeError_("mount %s: its source %s does not exist" % (entry["destination"], source))
        bind(source, target, flags | MS_BIND, propagation)
    elif kind == "cgroup":
        # The caller's cgroup view (name=systemd only), read-only; no hierarchy of the host is mounted.
        bind("/sys/fs/cgroup", target, MS_REC | MS_RDONLY | (flags & ~MS_RDONLY), propagation)
        read_only_below(target)
    elif kind == "sysfs":
        make_mountpoint(target, True)
        try:
            mount(source or "sysfs", target, "sysfs", flags, data)
        except RuntimeError_:
            bind("/sys", target, MS_REC | MS_RDONLY | MS_BIND, 0)
            read_only_below(target)
    else:
        make_mountpoint(target, True)
        mount(source or kind, target, kind, flags, data)
        if propagation:
            mount(None, target, None, propagation)


def enter_rootfs(rootfs, no_pivot):
    """runc's pivotRoot: pivot_root(".", ".") and the old root detached; with --no-pivot, MS_MOVE and chroot."""
    if no_pivot:
        os.chdir(rootfs)
        mount(rootfs, "/", None, MS_MOVE)
        os.chroot(".")
        os.chdir("/")
        return
    old_root = os.open("/", os.O_DIRECTORY | os.O_RDONLY)
    new_root = os.open(rootfs, os.O_DIRECTORY | os.O_RDONLY)
    os.fchdir(new_root)
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise RuntimeError_("pivot_root: unknown system call number on %s" % platform.machine())
    check(libc.syscall(number, b".", b"."), "pivot_root")
    os.fchdir(old_root)
    mount(None, ".", None, PROPAGATION["rslave"])
    check(libc.umount2(b".", MNT_DETACH), "umount the old root")
    os.chdir("/")
    os.close(old_root)
    os.close(new_root)


def finish_rootfs(spec, linux):
    """A read-only root (root.readonly), then linux.readonlyPaths and linux.maskedPaths (runc's readonlyPath and
    maskPath: a path that does not exist is skipped)."""
    if spec["root"].get("readonly"):
        mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    for path in linux.get("readonlyPaths", []):
        if os.path.exists(path):
            mount(path, path, "bind", MS_BIND | MS_REC)
            mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY)  # the top mount only, as runc's readonlyPath
    for path in linux.get("maskedPaths", []):
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_RDONLY)
        elif os.path.exists(path):
            mount("/dev/null", path, "bind", MS_BIND)


def apply_sysctl(values, new):
    """linux.sysctl, only for namespaces of its own (runc refuses a sysctl of a namespace it shares with the host)."""
    for key, value in values.items():
        ipc = key.startswith(("kernel.msg", "kernel.sem", "kernel.shm", "fs.mqueue.")) and "ipc" in new
        if not (
            ipc
            or key.startswith("net.")
            and "network" in new
            or key in ("kernel.hostname", "kernel.domainname")
            and "uts" in new
        ):
            raise RuntimeError_("sysctl %s is not in a namespace of the container's own" % key)
        with open("/proc/sys/" + key.replace(".", "/"), "w") as stream:
            stream.write(value)


# --- the process --------------------------------------------------------------------------------------------------


def apply_process(process):
    for limit in process.get("rlimits", []):
        number = RLIMITS.get(limit["type"])
        if number is None:
            raise RuntimeError_("unknown rlimit %s" % limit["type"])
        try:
            resource.setrlimit(number, (limit["soft"], limit["hard"]))
        except (OSError, ValueError) as error:
            raise RuntimeError_("setrlimit %s: %s" % (limit["type"], error)) from None
    if "oomScoreAdj" in process:
        with open("/proc/self/oom_score_adj", "w") as stream:
            stream.write(str(process["oomScoreAdj"]))


def finish_process(process, preserve_fds):
    """The user (runc's setupUser: groups, gid, uid), umask, cwd, noNewPrivileges; fds above the preserved closed."""
    user = process.get("user", {})
    os.setgroups(user.get("additionalGids", []))
    os.setgid(user.get("gid", 0))
    os.setuid(user.get("uid", 0))
    if "umask" in user:
        os.umask(user["umask"])
    os.chdir(process.get("cwd", "/"))
    if process.get("noNewPrivileges"):
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.closerange(3 + preserve_fds, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def environment(process):
    return dict(item.split("=", 1) for item in process.get("env", []) if "=" in item)


# --- start, kill, delete ------------------------------------------------------------------------------------------


def cmd_start(args):
    """Open the exec fifo (the init, blocked opening it for writing, then writes and execs), bounded (runc's exec and
    awaitFifoOpen: it gives up when the init is gone)."""
    (container_id,) = args
    saved = load(container_id)
    if status(saved) != "created":
        raise RuntimeError_("cannot start a container that is %s" % status(saved))
    path = os.path.join(state_dir(container_id), "exec.fifo")
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            ready, _writable, _failed = select.select([descriptor], [], [], 0.05)
            if ready and os.read(descriptor, 1):
                os.unlink(path)
                return
            if not init_alive(saved):
                raise RuntimeError_("the container's init ended before it started")
        raise RuntimeError_("the container's init did not start within %.0f s" % WAIT_S)
    finally:
        os.close(descriptor)


def parse_signal(text):
    if text.isdigit():
        return int(text)
    name = text.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(getattr(signal.Signals, name))
    except AttributeError:
        raise RuntimeError_("unknown signal %r" % text) from None


def cmd_kill(args):
    flags, rest = parse_flags(args, (), ("--all", "-a"))
    if not 1 <= len(rest) <= 2:
        raise RuntimeError_("kill takes a container id and a signal")
    saved = load(rest[0])
    number = parse_signal(rest[1] if len(rest) == 2 else "SIGTERM")
    if flags:
        signal_all(saved, number)
        return
    if not init_alive(saved):
        raise RuntimeError_("container not running")
    os.kill(saved["pid"], number)


def signal_all(saved, number):
    """`number` to every process of the cgroup create made (runc's kill --all; no freezer here), else to the init."""
    cgroup = made_cgroup(saved)
    pids = cgroup_pids(cgroup) if cgroup else []
    if not pids and init_alive(saved):
        pids = [saved["pid"]]
    kill_pids(pids, number)


def cmd_delete(args):
    """Kill what is left (--force, or a created container), wait for the cgroup to empty, remove it and the state."""
    flags, rest = parse_flags(args, (), ("--force", "-f"))
    (container_id,) = rest
    try:
        saved = load(container_id)
    except RuntimeError_:
        if flags:
            return
        raise
    now = status(saved)
    if now == "running" and not flags:
        raise RuntimeError_("cannot delete container %s that is not stopped: running" % container_id)
    signal_all(saved, signal.SIGKILL)
    cgroup = made_cgroup(saved)
    if cgroup:
        remove_cgroup(cgroup)
    remove_tree(state_dir(container_id))


def remove_tree(directory):
    for name in os.listdir(directory):
        os.unlink(os.path.join(directory, name))
    os.rmdir(directory)


# --- main ---------------------------------------------------------------------------------------------------------

COMMANDS = {"create": cmd_create, "start": cmd_start, "state": cmd_state, "kill": cmd_kill, "delete": cmd_delete}
GLOBAL_VALUES = ("--root", "--log", "--log-format", "--cgroup-manager", "--criu", "--rootless")
GLOBAL_SWITCHES = ("--debug", "--systemd-cgroup", "--version", "-v", "--help", "-h")


def parse_global(argv):
    items = list(argv)
    while items and items[0].startswith("-"):
        item = items.pop(0)
        name, _equals, inline = item.partition("=")
        if name in GLOBAL_SWITCHES:
            value = True
        elif name in GLOBAL_VALUES:
            value = inline if "=" in item else items.pop(0)
        else:
            raise RuntimeError_("unknown global option %s" % item)
        if name == "--root":
            Options.root = value
        elif name == "--log":
            Options.log = value
        elif name == "--log-format":
            Options.log_format = value
        elif name == "--cgroup-manager":
            if value not in ("cgroupfs", "disabled"):
                raise RuntimeError_("--cgroup-manager %s: simruntime knows cgroupfs and disabled" % value)
            Options.cgroups = value == "cgroupfs"
        elif name == "--systemd-cgroup":
            raise RuntimeError_("--systemd-cgroup: no systemd runs here; use podman's cgroupfs manager")
        elif name in ("--version", "-v"):
            return "version", []
        elif name in ("--help", "-h"):
            return "help", []
        elif name == "--rootless" and value not in ("false", "auto"):
            raise RuntimeError_("--rootless %s: simruntime runs as root only" % value)
    if not items:
        return "help", []
    return items[0], items[1:]


def main(argv):
    try:
        command, args = parse_global(argv)
        if command == "version":
            sys.stdout.write(VERSION)
            return 0
        if command == "help":
            sys.stdout.write(__doc__)
            return 0
        require_node()
        if command == "exec":
            raise RuntimeError_("simruntime runs no exec (podman exec, healthchecks)")
        if command not in COMMANDS:
            raise RuntimeError_("unknown command %r" % command)
        COMMANDS[command](args)
        return 0
    except (RuntimeError_, OSError, ValueError, KeyError) as error:
        message = str(error) if isinstance(error, RuntimeError_) else "%s: %s" % (type(error).__name__, error)
        log("error", message)
        sys.stderr.write("simruntime: %s\n" % message)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
