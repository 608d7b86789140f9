"""Issue 11, role and playbook side: role variable typos, empty selections, reports, summaries without
"None", check_gpus without the driver library and with a grace, ansible-doc samples."""

from __future__ import annotations

import ast
import datetime
import json
import os
import re
import stat
import subprocess

import pytest
import yaml

from ansible_run import REPO, VENV_BIN, module, only, playbook
from nodetools import alive, start_holder, wait_for
from simnode import inventory_file

RESET = REPO / "playbooks" / "reset_gpus.yml"
CHECK = REPO / "playbooks" / "check_gpus.yml"
REDEPLOY = REPO / "playbooks" / "redeploy_vllm.yml"
# What a line meant for people must never contain (an unknown value printed raw).
NEVER = ("None", "(GPUs )", "->  MiB", " MiB used,  ", ":  ->")


def _block(out, task):
    """The output of the task named `task` (up to the next TASK banner)."""
    start = out.index("TASK [%s" % task)
    end = out.find("\nTASK [", start + 1)
    return out[start : end if end > 0 else len(out)]


def test_unknown_role_variable_is_refused_before_anything_is_signalled(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.1)
    holder = start_holder(node, [0], mib=500)
    inventory = inventory_file(tmp_path, node)
    rc, out, recap = playbook(inventory, RESET, "-e", '{"reset_gpus_gpuss": [1]}')
    assert rc != 0 and "nothing was signalled: unknown variable(s) reset_gpus_gpuss (a typo?)" in out, out
    assert "reset_gpus_gpus, reset_gpus_grace_period" in out and "reset_gpus_hosts" in out, out
    assert alive(node, holder)
    # Refused, the role does not read the GPUs afterwards either (the refused value may be gpu_facts' too).
    assert re.search(r"Read GPU memory and holders after the reset\] \**\nskipping: ", out), out
    # A typo of the prefix (singular gpu) is refused too: ignored, it would widen the reset to every GPU and host.
    for given in ('{"reset_gpu_gpus": [1]}', '{"reset_gpu_hosts": "nosuch"}'):
        rc, out, recap = playbook(inventory, RESET, "-e", given)
        name = json.loads(given).popitem()[0]
        assert rc != 0 and "nothing was signalled: unknown variable(s) %s (a typo?)" % name in out, out
        assert "would signal" not in out and "  PID " not in out, out
    rc, out, recap = playbook(inventory, CHECK, "-e", '{"check_gpu_gpus": [1]}')
    assert rc != 0 and "check_gpus: nothing was checked: unknown variable(s) check_gpu_gpus (a typo?)" in out, out
    assert alive(node, holder)
    # The role's own defaults, the playbook's reset_gpus_hosts and the results it registers are known.
    rc, out, recap = playbook(inventory, RESET, "-e", '{"reset_gpus_hosts": "all", "reset_gpus_timeout": 30}')
    assert rc == 0 and "unknown variable" not in out and not alive(node, holder), out
    rc, out, recap = playbook(inventory, REDEPLOY, "-e", '{"vllm_server_instances": [], "vllm_server_stop_timout": 5}')
    assert rc != 0 and "nothing was stopped: unknown variable(s) vllm_server_stop_timout (a typo?)" in out, out
    assert "vllm_server_stop_timeout" in out
    rc, out, recap = playbook(inventory, REDEPLOY, "-e", '{"vllm_server_instances": [], "vllm_server_stop_timeout": 5}')
    assert "unknown variable" not in out and "lists no instance" in out, out  # past the check, to the role's own


def test_empty_selection_is_refused_and_omitted_selects_all(simnode, tmp_path):
    # Needs the modules' refusal of empty selections (issue 11): an empty list or match used to mean "all".
    node = simnode(gpus=2, release_latency=0.1)
    holders = [start_holder(node, [0], mib=500), start_holder(node, [1], mib=600)]
    inventory = inventory_file(tmp_path, node)
    for extra in (
        '{"reset_gpus_gpus": []}',
        '{"reset_gpus_match": ""}',
        '{"reset_gpus_pids": []}',
        '{"reset_gpus_users": []}',
        "reset_gpus_gpus=",
    ):
        rc, out, recap = playbook(inventory, RESET, "-e", extra)
        assert rc != 0 and "is empty" in out and "omit" in out, (extra, out)
        assert all(alive(node, pid) for pid in holders), extra
    rc, out, recap = playbook(inventory, RESET)
    assert rc == 0 and not any(alive(node, pid) for pid in holders), out


@pytest.mark.slow
def test_report_dir_is_created_and_report_failure_never_hides_the_reset(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.1)
    holder = start_holder(node, [0], mib=500)
    inventory = inventory_file(tmp_path, node)
    reports, textfile = tmp_path / "new" / "reports", tmp_path / "gpuops_nvidia.prom"
    extra = {"reset_gpus_report_dir": str(reports), "reset_gpus_textfile": str(textfile)}
    rc, out, recap = playbook(inventory, RESET, "-e", json.dumps(extra))
    assert rc == 0 and not alive(node, holder), out
    assert stat.S_IMODE(reports.stat().st_mode) == 0o755
    assert json.loads((reports / ("%s.json" % node.name)).read_text())["outcome"] == "released"
    # Destinations that cannot be written are refused before anything is signalled: a report directory that cannot
    # be made (a file is in the way), a textfile whose directory does not exist or is a file, a relative textfile.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    textfile.unlink()
    holder = start_holder(node, [1], mib=600)
    for bad, words in (
        (
            {"reset_gpus_report_dir": str(blocker / "reports")},
            "reset_gpus_report_dir %s cannot hold the report: %s is not a directory" % (blocker / "reports", blocker),
        ),
        (
            {"reset_gpus_textfile": str(tmp_path / "none" / "x.prom")},
            "reset_gpus_textfile %s cannot be written on the host: %s does not exist"
            % (tmp_path / "none" / "x.prom", tmp_path / "none"),
        ),
        ({"reset_gpus_textfile": str(blocker / "x.prom")}, "%s is not a directory" % blocker),
        ({"reset_gpus_textfile": "x.prom"}, "reset_gpus_textfile must be an absolute path on the host ending in .prom"),
    ):
        for check in ((), ("--check",)):
            rc, out, recap = playbook(inventory, RESET, "-e", json.dumps(dict(extra, **bad)), *check)
            assert rc != 0 and "nothing was signalled: reset_gpus_" in out and words in out, (bad, check, out)
            assert alive(node, holder), (bad, check)
            assert "would signal" not in out, out
    assert not textfile.exists()
    # A textfile that passes that check and still cannot be written (the path is a directory) is said; the reset's
    # outcome stands and the JSON report is written.
    textfile.mkdir()
    extra["reset_gpus_textfile"] = str(textfile)
    rc, out, recap = playbook(inventory, RESET, "-e", json.dumps(extra))
    assert rc == 0 and recap[node.name]["failed"] == 0 and not alive(node, holder), out
    assert "textfile not written to %s" % textfile in out
    assert json.loads((reports / ("%s.json" % node.name)).read_text())["outcome"] == "released"
    # A failed reset stays failed when its textfile cannot be written either, and its report is written.
    node.set(stray_mib={1: 5000})
    rc, out, recap = playbook(inventory, RESET, "-e", json.dumps(dict(extra, reset_gpus_timeout=0.5)))
    assert rc != 0 and recap[node.name]["failed"] == 1 and "textfile not written" in out, out
    assert json.loads((reports / ("%s.json" % node.name)).read_text())["outcome"] == "failed"


def _timestamps(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _timestamps(item)
    elif isinstance(value, list):
        for item in value:
            yield from _timestamps(item)
    elif isinstance(value, str) and re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d", value):
        yield value


def test_report_message_agrees_with_wait_seconds_and_times_carry_utc(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=1.0)
    start_holder(node, [0], mib=500)
    inventory = inventory_file(tmp_path, node)
    reports = tmp_path / "reports"
    extra = {"reset_gpus_report_dir": str(reports), "reset_gpus_progress_interval": 0.3}
    # The release may take several slices of 0.3 s; the message counts them all, as wait_seconds does.
    rc, out, recap = playbook(inventory, RESET, "-e", json.dumps(extra))
    assert rc == 0, out
    report = json.loads((reports / ("%s.json" % node.name)).read_text())
    seconds = float(re.match(r"^memory released after ([0-9.]+) s more$", report["message"]).group(1))
    assert abs(seconds - report["wait_seconds"]) < 0.01, report
    stamps = list(_timestamps(report))
    assert len(stamps) >= 2, report  # the report's time and the holder's start time
    for stamp in stamps:
        parsed = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        assert parsed.utcoffset() == datetime.timedelta(0), stamp
    assert (
        abs(
            (
                datetime.datetime.now(datetime.timezone.utc) - datetime.datetime.fromisoformat(report["time"])
            ).total_seconds()
        )
        < 120
    ), report["time"]
    # A failure: the message's time is the whole wait too.
    node.set(stray_mib={1: 5000})
    rc, out, recap = playbook(inventory, RESET, "-e", json.dumps(dict(extra, reset_gpus_timeout=1.0)))
    report = json.loads((reports / ("%s.json" % node.name)).read_text())
    seconds = float(re.match(r"^FAILED: not released after ([0-9.]+) s", report["message"]).group(1))
    assert rc != 0 and report["outcome"] == "failed" and abs(seconds - report["wait_seconds"]) < 0.06, report


def test_summary_without_driver_library_never_says_memory_released(simnode, tmp_path):
    node = simnode(gpus=2, no_driver=True, release_latency=0.1)
    start_holder(node, [0], mib=100)  # ended or not (attribution without memory is gpu_kill's), never "released"
    reports = tmp_path / "reports"
    rc, out, recap = playbook(
        inventory_file(tmp_path, node), RESET, "-e", json.dumps({"reset_gpus_report_dir": str(reports)})
    )
    assert rc == 0, out
    summary = _block(out, "gpuops.nvidia.reset_gpus : Summarize the reset")
    assert "memory released" not in summary and "no holder left after" in summary, summary
    assert "used memory not checked" in summary, summary
    assert not [word for word in NEVER if word in summary], summary
    report = json.loads((reports / ("%s.json" % node.name)).read_text())
    assert report["outcome"] == "no_holders" and report["memory_checked"] is False, report
    assert "memory released" not in report["message"]


def test_lost_gpu_progress_and_summary_never_print_none(simnode, tmp_path):
    node = simnode(gpus=2, lost=[1], release_latency=0.1)
    holder = start_holder(node, [0], mib=100)
    extra = {"reset_gpus_timeout": 1, "reset_gpus_progress_interval": 0.4}
    rc, out, recap = playbook(inventory_file(tmp_path, node), RESET, "-e", json.dumps(extra))
    assert rc != 0 and not alive(node, holder), out
    summary = _block(out, "gpuops.nvidia.reset_gpus : Summarize the reset")
    mine = [line for line in summary.splitlines() if "FAILED:" not in line]  # gpu_wait's own message aside
    # The lost GPU's name and minor come from /proc/driver/nvidia (NVML answers it GPU_IS_LOST).
    assert "GPU 1 NVIDIA H100 80GB HBM3: used memory unknown (GPU is lost)" in summary, summary
    assert not [word for line in mine for word in NEVER if word in line], summary
    progress = [line for line in out.splitlines() if "still waiting after" in line or "still held after" in line]
    if progress:  # a lost GPU may fail at the first look: then there is no progress line
        assert all("GPU 1 used memory unknown" in line and "None" not in line for line in progress), progress


def test_check_gpus_without_driver_library_fails_by_default(simnode, tmp_path):
    node = simnode(gpus=2, no_driver=True)
    inventory = inventory_file(tmp_path, node)
    rc, out, recap = playbook(inventory, CHECK, "-e", "check_gpus_wait=0")
    assert rc != 0 and "GPUs free" not in out, out
    # Without the library the GPUs may be known from /proc/driver/nvidia (2 GPUs) or not at all (every GPU).
    assert re.search(r"check_gpus %s: not checked: used memory of (GPU 0, 1|every GPU) not read" % node.name, out), out
    assert "no process holds them" in out and "check_gpus_allow_proc_only" in out
    assert "check_gpus summary: 1 host(s): 1 not checked (%s)" % node.name in out
    rc, out, recap = playbook(inventory, CHECK, "-e", '{"check_gpus_wait": 0, "check_gpus_allow_proc_only": true}')
    assert rc == 0 and "GPUs free" not in out, out
    assert re.search(r"used memory of (GPU 0, 1|every GPU) not read .*; accepted by check_gpus_allow_proc_only", out), (
        out
    )
    assert "check_gpus summary: 1 host(s): 1 without holders, memory not read (%s)" % node.name in out


def test_gpu_wait_require_memory_and_return_after(simnode, tmp_path):
    # check_gpus' one task per host: gpu_wait fails the host itself where memory could not be read (require_memory),
    # and leaves the GPUs' facts out (return_after=false) while its message and gpus still name the holders.
    (tmp_path / "bare").mkdir()
    bare = inventory_file(tmp_path / "bare", simnode(gpus=2, no_driver=True))
    status, result = only(module(bare, "gpuops.nvidia.gpu_wait", {"timeout": 0}))
    assert status == "SUCCESS" and result["memory_checked"] is False and "after" in result, result
    status, result = only(module(bare, "gpuops.nvidia.gpu_wait", {"timeout": 0, "require_memory": True}))
    assert status == "FAILED!" and result["msg"].startswith("not checked: used memory of "), result
    assert "no process holds them" in result["msg"] and "require_memory=false" in result["msg"], result

    node = simnode(gpus=2, release_latency=0.1)
    inventory = inventory_file(tmp_path, node)
    status, result = only(
        module(inventory, "gpuops.nvidia.gpu_wait", {"timeout": 0, "return_after": False, "require_memory": True})
    )
    assert status == "SUCCESS" and "after" not in result and result["memory_checked"] is True, result
    holder = start_holder(node, [1], mib=700)
    status, result = only(module(inventory, "gpuops.nvidia.gpu_wait", {"timeout": 0, "return_after": False}))
    assert (
        status == "FAILED!" and "after" not in result and [h["pid"] for h in result["gpus"][1]["holders"]] == [holder]
    ), result
    assert "GPU 1: 700 MiB used, held by PID %d" % holder in result["msg"], result
    status, result = only(module(inventory, "gpuops.nvidia.gpu_wait", {"timeout": 0}))
    assert status == "FAILED!" and result["after"]["gpus"][1]["holder_pids"] == [holder], result
    assert alive(node, holder)


def test_check_gpus_grace_and_one_greppable_line_per_host(simnode, tmp_path, monkeypatch):
    releasing = simnode(gpus=2, release_latency=3)
    clean = simnode(gpus=1)
    inventory = inventory_file(tmp_path, releasing, clean)

    def just_killed():
        pid = start_holder(releasing, [1], mib=3000)
        releasing.exec("kill", "-9", str(pid))
        wait_for(lambda: not alive(releasing, pid), 10, what="holder gone")

    just_killed()
    rc, out, recap = playbook(inventory, CHECK, "-e", "check_gpus_wait=0")
    assert rc != 0 and recap[releasing.name]["failed"] == 1 and recap[clean.name]["failed"] == 0, out
    assert "check_gpus %s: not free: GPU 1: 3000 MiB used" % releasing.name in out
    wait_for(lambda: "GPUs free" in playbook(inventory, CHECK, "-e", "check_gpus_wait=0")[1], 20, 0.5, "release")
    # With the default grace (5 s) the same state passes: the memory is released meanwhile.
    just_killed()
    monkeypatch.setenv("ANSIBLE_CALLBACK_FORMAT_PRETTY", "false")
    rc, out, recap = playbook(inventory, CHECK)
    assert rc == 0, out
    # What the documented `grep -o 'check_gpus [^"]*'` prints: every match, one per line.
    found = re.findall(r'check_gpus [^"]*', out)
    assert sorted(found[:2]) == sorted(
        [
            "check_gpus %s: GPUs free (2 checked): no holder, used memory at most 256 MiB each" % releasing.name,
            "check_gpus %s: GPUs free (1 checked): no holder, used memory at most 256 MiB each" % clean.name,
        ]
    ), out
    assert found[2:] == ["check_gpus summary: 2 host(s): 2 free"], out


def _docs(path):
    """DOCUMENTATION and RETURN of a module file, parsed as YAML."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in ("DOCUMENTATION", "RETURN"):
            found[node.targets[0].id] = yaml.safe_load(node.value.value)
    return found


def _samples(returns, prefix=""):
    for name, entry in (returns or {}).items():
        if "sample" in entry:
            yield prefix + name, entry
        yield from _samples(entry.get("contains"), prefix + name + ".")


_TYPES = {"dict": dict, "list": list, "str": str, "int": int, "float": (int, float), "bool": bool}


def test_every_return_sample_renders_as_written_in_ansible_doc():
    """ansible-doc prints each sample as YAML (lists in flow style) and then runs its markup filter over it,
    which strips anything like an RST directive (`.. name::`, the dots matching any character): a sample
    value `VLLM::Worker_TP` after `comm: ` came out as `comWorker_TP`. Every sample must survive that."""
    from ansible.cli.doc import DocCLI
    from ansible.module_utils.common.collections import is_sequence

    modules = sorted((REPO / "plugins" / "modules").glob("*.py"))
    checked = 0
    for path in modules:
        for name, entry in _samples(_docs(path).get("RETURN")):
            sample = entry["sample"]
            if "type" in entry and entry["type"] in _TYPES:
                assert isinstance(sample, _TYPES[entry["type"]]), (path.name, name, sample)
            # As DocCLI.add_fields renders a return value's keys.
            if is_sequence(sample):
                text = "sample: %s" % DocCLI._dump_yaml(sample, flow_style=True)
            else:
                text = DocCLI._dump_yaml({"sample": sample})
            assert DocCLI.tty_ify(text) == text, (path.name, name, text, DocCLI.tty_ify(text))
            assert yaml.safe_load(text)["sample"] == sample, (path.name, name)
            checked += 1
    assert checked >= 10
    # And the real command renders every module, gpu_kill's holder names intact.
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".collections"), ANSIBLE_NOCOLOR="1")
    names = ["gpuops.nvidia.%s" % path.stem for path in modules]
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-doc"), *names],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert [name for name in names if "> MODULE %s " % name not in proc.stdout] == [], proc.stderr
    assert "comWorker" not in proc.stdout and "comEngine" not in proc.stdout
