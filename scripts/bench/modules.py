"""The `modules` section of scripts/bench/run.py: the node's side of the fleet, split (docs/scale.md).

One SSH node. Each fleet play (a one-ping play, reset_gpus.yml and check_gpus.yml on a clean node) runs once with an
interpreter that keeps the AnsiballZ script it is given on its standard input, then runs it; those scripts are then
run again in the node over SSH, as Ansible runs them (`/bin/sh -c 'PYTHON && sleep 0'`, the script on standard input,
the environment of an SSH session), in alternating rounds. For each module run: the CPU of the run with everything it
reaped (its NVML worker), the CPU of compiling Python sources inside it (`compile` on a `.py` file: the module, its
module_utils and ansible-core's), and the CPU of the same run where each source is compiled once. CPython's zipimport compiles each module it imports
twice (python/cpython#141276): once to build the module's spec (`zipimporter.get_filename`), once to run it. The third
figure puts a `sitecustomize` on PYTHONPATH for that run alone, which keeps each compiled code object for the second
call: it measures what that bug costs. Nothing of it is in the collection.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

# (name, playbook relative to the repository or None for the one-ping play); the module each sends to the node.
PLAYS = (("ping", None), ("gpu_kill", "playbooks/reset_gpus.yml"), ("gpu_wait", "playbooks/check_gpus.yml"))

PING_PLAY = """\
- name: One ping
  hosts: all
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""

# The interpreter of the capture runs: keeps its standard input (the AnsiballZ script) under DIR, then runs it.
CAPTURE = """\
#!/bin/sh
kept=$(mktemp %(dir)s/payload-XXXXXX)
cat > "$kept"
exec %(python)s "$@" < "$kept"
"""

# Inside the node: what compiling .py sources costs one module run (CPU, ms), the script run as Ansible's wrapper;
# "failed" where the module's result says so.
COMPILE_TIMER = r"""
import builtins, io, json, runpy, sys, time
spent = [0.0, 0]
real = builtins.compile
def timed(source, filename, *args, **kwargs):
    started = time.process_time()
    try:
        return real(source, filename, *args, **kwargs)
    finally:
        if str(filename).endswith(".py"):
            spent[0] += time.process_time() - started
            spent[1] += 1
builtins.compile = timed
path = sys.argv[1]
sys.argv = [path]  # the wrapper reads a second argument as a debug command
result, sys.stdout = sys.stdout, io.StringIO()
try:
    runpy.run_path(path, run_name="__main__")
except SystemExit:
    pass
result, sys.stdout = sys.stdout.getvalue(), result
failed = '"failed": true' in result
sys.stderr.write("\n" + json.dumps({"compile_ms": spent[0] * 1000, "compiles": spent[1], "failed": failed}) + "\n")
"""

# Inside the node: zipimport compiles each source once (python/cpython#141276), for the runs that put it on PYTHONPATH.
ONCE = """\
import zipimport
_compiled = {}
_compile_source = zipimport._compile_source
def _once(pathname, source):
    if (pathname, source) not in _compiled:
        _compiled[(pathname, source)] = _compile_source(pathname, source)
    return _compiled[(pathname, source)]
zipimport._compile_source = _once
"""

# Inside the node, over SSH: `rounds` alternating rounds of every kept script; prints the figures (JSON).
REPLAY = r"""
import json, os, resource, statistics, subprocess, sys
python, timer, once_dir, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
scripts = dict(argument.split("=", 1) for argument in sys.argv[5:])
plain_env = dict(os.environ)
once_env = dict(os.environ, PYTHONPATH=once_dir)

def cpu_ms(argv, script, env):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(script, "rb") as stdin:
        done = subprocess.run(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or b'"failed": true' in done.stdout:
        sys.exit("%s failed (rc %d): %r %r" % (script, done.returncode, done.stdout[-500:], done.stderr[-500:]))
    used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return used * 1000, done.stderr

figures = {name: {"cpu_ms": [], "cpu_once_ms": [], "compile_ms": [], "compiles": []} for name in scripts}
shell = ["/bin/sh", "-c", python + " && sleep 0"]

def plain(name):
    figures[name]["cpu_ms"].append(cpu_ms(shell, scripts[name], plain_env)[0])

def once(name):
    figures[name]["cpu_once_ms"].append(cpu_ms(shell, scripts[name], once_env)[0])

def compiling(name):
    timed = json.loads(cpu_ms([python, timer, scripts[name]], os.devnull, plain_env)[1].splitlines()[-1])
    if timed["failed"]:
        sys.exit("%s failed under the compile timer" % scripts[name])
    figures[name]["compile_ms"].append(timed["compile_ms"])
    figures[name]["compiles"].append(timed["compiles"])

for number in range(rounds):
    names = list(scripts)
    names = names[number % len(names):] + names[:number % len(names)]
    for name in names:
        for run in (plain, once, compiling) if number % 2 == 0 else (once, plain, compiling):
            run(name)
print(json.dumps({name: {key: statistics.median(values) for key, values in found.items()} for name, found in figures.items()}))
"""


def bench_modules(args, workdir: Path, tools) -> dict:
    """The module run of each fleet play on one SSH node, split (module docstring). `tools`: run.py's helpers."""
    tools.ensure_tools("sshd")
    kept = workdir / "modules"
    kept.mkdir()
    node = tools.up(tools.node_name("modules"), gpus=8, ssh=True)
    try:
        python = tools.gpunode.node_python()
        capture = kept / "capture.sh"
        capture.write_text(CAPTURE % {"dir": shlex.quote(str(kept)), "python": shlex.quote(python)})
        capture.chmod(0o755)
        inventory = tools.write_inventory(workdir, [node])
        ping = workdir / "modules-ping.yml"
        ping.write_text(PING_PLAY)
        scripts = {}
        for name, play in PLAYS:
            before = set(kept.glob("payload-*"))
            # The task's interpreter is the capture's: no venv tried first (gpuops_nvidia_venv empty).
            tools.playbook(
                inventory,
                ping if play is None else tools.REPO / play,
                extra=["-e", json.dumps({"ansible_python_interpreter": str(capture), "gpuops_nvidia_venv": ""})],
            )
            new = sorted(set(kept.glob("payload-*")) - before)
            sent = [re.search(r"^ansible_module='([^']*)'", path.read_text(), re.MULTILINE) for path in new]
            if [found.group(1).rsplit(".", 1)[-1] if found else None for found in sent] != [name]:
                raise RuntimeError("%s: expected one run of it on the node, kept %d script(s)" % (name, len(new)))
            scripts[name] = new[0]
        timer, once = kept / "compile_timer.py", kept / "once"
        timer.write_text(COMPILE_TIMER)
        once.mkdir()
        (once / "sitecustomize.py").write_text(ONCE)
        replay = kept / "replay.py"
        replay.write_text(REPLAY)
        rounds = max(4, args.runs * 4)
        tools.log("modules: %d alternating rounds of %s on %s, over SSH" % (rounds, ", ".join(scripts), node.name))
        argv = node.ssh_argv(
            shlex.join(
                [python, str(replay), python, str(timer), str(once), str(rounds)]
                + ["%s=%s" % (name, path) for name, path in scripts.items()]
            )
        )
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0:
            raise RuntimeError("modules: the replay failed (rc %d): %s" % (done.returncode, done.stderr[-2000:]))
        figures = json.loads(done.stdout.splitlines()[-1])
    finally:
        node.down()
    for name, path in scripts.items():
        figures[name]["script_kib"] = path.stat().st_size / 1024
    return {"rounds": rounds, "modules": figures}


def rows(results: dict) -> list[str]:
    """Table rows of the modules section."""
    found = results["modules"]
    ping = found["ping"]

    def each(key: str, unit: str = " ms") -> str:
        return " / ".join(
            "%.0f%s" % (found[name][key], unit)
            + ("" if name == "ping" else " (%.2fx)" % (found[name][key] / ping[key]))
            for name in found
        )

    names = " / ".join(found)
    return [
        "| one SSH node, a module run as the fleet runs it (%s), CPU with its NVML worker | %s | | |"
        % (names, each("cpu_ms")),
        "| of which compiling Python sources (%s compilations; zipimport compiles most modules twice) | %s | | |"
        % (
            " / ".join("%d" % found[name]["compiles"] for name in found),
            " / ".join("%.0f ms" % found[name]["compile_ms"] for name in found),
        ),
        "| the same runs, each source compiled once (python/cpython#141276; a sitecustomize of the bench) | "
        "%s | | |" % each("cpu_once_ms"),
        "| the AnsiballZ script each run reads from its standard input | %s | | |" % each("script_kib", " KiB"),
    ]
