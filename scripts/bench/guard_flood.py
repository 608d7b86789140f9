"""A webhook flood at the guard's rulebook (docs/guard.md, "A fleet-wide event"): how long until every alert is decided.

    .venv/bin/python scripts/bench/guard_flood.py                      # 50 hosts, 1,000 alerts, check mode
    .venv/bin/python scripts/bench/guard_flood.py --remediate          # the same, the orphans ended (reset_gpus)
    .venv/bin/python scripts/bench/guard_flood.py --hosts 5 --copies 2

ansible-rulebook runs the shipped rulebook (gpuops.nvidia.gpu_guard, its source gpuops.nvidia.guard_webhook) over an
inventory of --hosts simulated nodes (tests/sim, local connection, forks as in ansible.cfg). Each node has --orphans
orphaned holders (forked children of creators that exited). Per host, Alertmanager's group: one alert per orphan,
one per orphan on a second GPU, --stale alerts for processes that have exited, and two malformed alerts; each group is
posted --copies times (Alertmanager's next notification, a retry), the calls spread evenly over --spread seconds
from 8 threads, as the groups of a fleet-wide event come: many calls before the first run takes the inbox, more while
it runs. The figure: from the first call to the moment every alert posted is in guard.jsonl. Asserted (it fails
otherwise): every alert in exactly one line, every orphan signalled (or, in check mode, in a "would signal" line),
nothing else signalled. It prints the load average, the playbook runs and the time.

Not a test: it reports; it needs what `make setup` installs (.venv, .venv-eda, Java). Nodes and daemons are its own
and ended at exit.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration")]

from ansible_api import guard_rulebook  # noqa: E402
from nodetools import alive, start_cuda_process  # noqa: E402
from ports import free_ports  # noqa: E402
from simnode import inventory_file, up  # noqa: E402

TOKEN = "flood-token"
ALERT = "GpuopsNvidiaOrphanedGpuMemory"


def ticks(node, pid):
    stat = node.exec("cat", "/proc/%d/stat" % pid).stdout
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def alert(host, pid, start, gpu, fingerprint):
    labels = {"alertname": ALERT, "inventory_hostname": host, "pid": str(pid), "start_ticks": str(start)}
    labels.update(gpu=str(gpu), comm="python", reason="exited_creator", instance="%s:9100" % host, job="node")
    return {
        "status": "firing",
        "labels": labels,
        "annotations": {"summary": "PID %s holds GPU memory" % pid},
        "startsAt": "2026-12-04T10:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph?g0.expr=gpuops_nvidia_guard_orphan_memory_bytes+%3E+0",
        "fingerprint": fingerprint,
    }


def group(node, orphans, stale):
    """Alertmanager's payload for the node's group: its alerts, as the shipped rule labels them."""
    alerts = []
    for pid, start in orphans.items():
        for gpu in (0, 1):
            alerts.append(alert(node.name, pid, start, gpu, "%s-%d-%d" % (node.name, pid, gpu)))
    for number in range(stale):  # processes that exited since the metrics were written
        alerts.append(alert(node.name, 400000 + number, 5, 0, "%s-stale-%d" % (node.name, number)))
    bad = alert(node.name, 1, 5, 0, "%s-bad-pid" % node.name)
    bad["labels"]["pid"] = "²"
    listed = dict(alert(node.name, 1, 5, 0, "%s-bad-labels" % node.name), labels=["pid", "1"])
    return {
        "receiver": "gpuops-guard",
        "status": "firing",
        "groupKey": '{}:{alertname="%s", inventory_hostname="%s"}' % (ALERT, node.name),
        "truncatedAlerts": 0,
        "alerts": alerts + [bad, listed],
    }


def post(port, payload):
    request = urllib.request.Request(
        "http://127.0.0.1:%d/alerts" % port,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer %s" % TOKEN},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 (loopback, this script's rulebook)
        return answer.status


def start_rulebook(work, inventory, port, remediate):
    argv, env = guard_rulebook(REPO, work, inventory, port, TOKEN, remediate)
    log = open(work / "ansible-rulebook.log", "w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=work)


def wait_listening(port, rulebook, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if rulebook.poll() is not None:
            raise SystemExit("ansible-rulebook exited (%s)" % rulebook.returncode)
        try:
            post(port, {"alerts": []})
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("the webhook did not answer within %d s" % timeout)


def logged(path):
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return lines, [a.get("fingerprint") for line in lines for a in line.get("alerts", [line.get("alert") or {}])]


def make_nodes(args, tag, nodes):
    """Nodes with orphans, each added to `nodes` as soon as it is up (the caller downs them, also on a failure)."""
    orphans = {}
    for number in range(args.hosts):
        node = up("gf-%s-%d" % (tag, number), gpus=4, release_latency=0.1)
        nodes.append(node)
        pids = [start_cuda_process(node, [gpu], 512, mode="inherit") for gpu in range(args.orphans)]
        orphans[node.name] = {pid: ticks(node, pid) for pid in pids}
    return orphans


def flood(args, work, nodes, orphans):
    inventory = inventory_file(work, *nodes)
    (port,) = free_ports(1)
    rulebook = start_rulebook(work, inventory, port, args.remediate)
    try:
        wait_listening(port, rulebook)
        calls = [group(node, orphans[node.name], args.stale) for node in nodes] * args.copies
        total = sum(len(call["alerts"]) for call in calls)
        load = os.getloadavg()
        started = time.monotonic()

        def at(numbered):
            time.sleep(max(0.0, started + numbered[0] * args.spread / len(calls) - time.monotonic()))
            return post(port, numbered[1])

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(at, enumerate(calls)))
        posted = time.monotonic() - started
        assert statuses == [200] * len(calls), statuses
        log = work / "guard.jsonl"
        while len(logged(log)[1]) < total and time.monotonic() - started < args.timeout:
            time.sleep(0.5)
        decided = time.monotonic() - started
        return {"calls": len(calls), "alerts": total, "posted_s": posted, "decided_s": decided, "load": load}
    finally:
        os.killpg(rulebook.pid, signal.SIGTERM)
        rulebook.wait(30)


def check(args, work, nodes, orphans, figures):
    lines, fingerprints = logged(work / "guard.jsonl")
    calls = [group(node, orphans[node.name], args.stale) for node in nodes] * args.copies
    posted = sorted(a["fingerprint"] for call in calls for a in call["alerts"])
    assert sorted(fingerprints) == posted, "alerts posted and alerts logged differ: %d vs %d" % (
        len(posted),
        len(fingerprints),
    )
    action = "signalled" if args.remediate else "would signal"
    done = {(line["host"], pid) for line in lines if line.get("action") == action for pid in line["result"]}
    wanted = {(host, pid) for host, pids in orphans.items() for pid in pids}
    assert done == wanted, "orphans not decided: %s" % sorted(wanted - done)
    figures["runs"] = (work / "ansible-rulebook.log").read_text().count("PLAY [Decide what the alerts ask")
    if args.remediate:
        for node in nodes:
            assert not any(alive(node, pid) for pid in orphans[node.name]), node.name


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--orphans", type=int, default=2, help="orphaned holders per host (at most 4)")
    parser.add_argument("--stale", type=int, default=4, help="alerts per host for processes that exited")
    parser.add_argument("--copies", type=int, default=2, help="times each host's group is posted")
    parser.add_argument("--spread", type=float, default=20, help="seconds over which the calls are posted")
    parser.add_argument("--remediate", action="store_true", help="guard_remediate: true (default: check mode)")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    tag = "%d" % os.getpid()
    nodes = []
    try:
        with tempfile.TemporaryDirectory(prefix="guard-flood-") as directory:
            work = Path(directory)
            orphans = make_nodes(args, tag, nodes)
            figures = flood(args, work, nodes, orphans)
            check(args, work, nodes, orphans, figures)
    finally:
        for node in nodes:
            node.down()
    print(
        "guard flood: %(alerts)d alerts in %(calls)d calls for %(hosts)d hosts (%(mode)s mode), posted in %(posted_s).1f s,"
        " all decided after %(decided_s).1f s in %(runs)d playbook run(s); load average before %(load)s on %(cpus)d CPUs"
        % dict(figures, hosts=args.hosts, mode="remediate" if args.remediate else "check", cpus=os.cpu_count())
    )


if __name__ == "__main__":
    main()
