"""The oracle: who holds what, who must be ended and who must be left alone, from the simulator's own bookkeeping.

It reads what nothing on a real driver shows and the collection never reads (tests/sim/README.md, "Creating a CUDA
context"): the context files (`<T>` or `<T>.<G>`: token T + (G << 32), one line per GPU) and the file position of
every `/dev/nvidia<minor>` fd, which is the token of the context that fd keeps alive. A process holds GPU i (MIG
instance G) when it is alive, not a zombie, and has an fd of GPU i's file at the token of a context with a line for i.
The selection is applied as the module's documentation words it, to that truth; nothing here calls the collection.
"""

from __future__ import annotations

import os
import re

# The daemons gpu_kill leaves alone by default, known by what they run (docs: gpu_kill, "protected").
PROTECTED = {
    "nvidia-persistenced",
    "nv-hostengine",
    "dcgm-exporter",
    "nvidia-fabricmanager",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
}
USERS = {"root": 0, "nobody": 65534}


def token_of(name: str) -> int:
    pid, _dot, generation = name.partition(".")
    return int(pid) + (int(generation or 0) << 32)


def context_lines(contexts: dict) -> dict:
    """{token: {index: gi or None}} of the context files."""
    out = {}
    for name, lines in contexts.items():
        entries = {}
        for line in lines:
            words = line.split()
            if not words:
                continue
            gi = next((int(w[3:]) for w in words if w.startswith("gi=")), None)
            entries[int(words[0])] = gi
        out[token_of(name)] = entries
    return out


def holders(truth: dict, minors: list) -> dict:
    """{pid: {index: set of MIG instance ids (None: the whole GPU)}} of live holders. An MPS client keeps its token on
    /dev/nvidiactl: it holds every GPU its context has a line for."""
    tokens = context_lines(truth["contexts"])
    index_of = {"/dev/nvidia%d" % minor: index for index, minor in enumerate(minors)}
    out: dict = {}
    for pid, process in truth["processes"].items():
        if process["state"] in ("Z", "X"):
            continue
        for path, position in process["fds"]:
            lines = tokens.get(position)
            if lines is None:
                continue
            indices = list(lines) if path == "/dev/nvidiactl" else [index_of.get(path)]
            for index in indices:
                if index in lines:
                    out.setdefault(int(pid), {}).setdefault(index, set()).add(lines[index])
    return out


def _on_selection(gpus: dict, wanted: list | None) -> bool:
    if wanted is None:
        return True
    for item in wanted:
        if item[0] in ("index", "uuid") and item[1] in gpus:
            return True
        if item[0] == "mig" and item[2] in gpus.get(item[1], ()):
            return True
    return False


def argv0(cmdline: str) -> str:
    return os.path.basename(cmdline.split(" ")[0]) if cmdline else ""


def decide(truth: dict, minors: list, selection: dict, args: dict, protected_pids: set) -> dict:
    """{pid: reason} for every holder: "selected", or why it is left alone."""
    options = selection["options"]
    out = {}
    for pid, gpus in holders(truth, minors).items():
        process = truth["processes"][str(pid)]
        names = {process["comm"], argv0(process["cmdline"])}
        if not _on_selection(gpus, selection.get("gpus")):
            reason = "other GPU"
        elif "pids" in args and pid not in args["pids"]:
            reason = "not in pids"
        elif options.get("match") and not re.search(options["match"], process["cmdline"]):
            reason = "no match"
        elif options.get("users") and process["uid"] not in {USERS[u] for u in options["users"]}:
            reason = "other user"
        elif names & set(options.get("exclude", [])):
            reason = "excluded"
        elif pid in protected_pids:
            reason = "protected"
        else:
            reason = "selected"
        out[pid] = reason
    return out
