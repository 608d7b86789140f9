#!/usr/bin/env python
"""Print ansible_facts.nvidia from `ansible -o -m gpuops.nvidia.gpu_facts` (one line per host on stdin) as a table."""

import json
import sys


def said(value):
    """A value of the facts as printed: "not read" for None (no driver library, a GPU that does not answer)."""
    return "not read" if value is None else value


def show(host, result):
    if result.get("failed") or "ansible_facts" not in result:
        print("%s: %s" % (host, result.get("msg", "no facts")))
        return
    facts = result["ansible_facts"]["nvidia"]
    holders = {h["pid"]: h for h in facts["holders"]}
    driver = facts["driver"]
    print(
        "%s  driver %s"
        % (host, driver["driver_version"] or "not available: %s" % (driver["error"] or "no error given"))
    )
    print("  GPU  minor  used MiB / total MiB  reserved  holders")
    for gpu in facts["gpus"]:
        names = ", ".join("%d %s" % (pid, holders[pid]["comm"]) for pid in gpu["holder_pids"] if pid in holders)
        print(
            "  %3s  %5s  %8s / %-9s  %8s  %s"
            % (
                said(gpu["index"]),
                said(gpu["minor"]),
                said(gpu["memory_used_mib"]),
                said(gpu["memory_total_mib"]),
                said(gpu["memory_reserved_mib"]),
                names or "-",
            )
        )
    for holder in facts["holders"]:
        print(
            "  holder PID %-6d ppid %-6d state %s  %-16s %s"
            % (holder["pid"], holder["ppid"], holder["state"], holder["comm"], (holder["cmdline"] or "")[:70])
        )


def main():
    for line in sys.stdin:
        host, sep, payload = line.partition(" => ")
        if sep:
            show(host.split(" | ")[0], json.loads(payload))


if __name__ == "__main__":
    main()
