# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_kill
short_description: End exactly the selected processes that hold NVIDIA GPUs
version_added: 0.1.0
author: gpuops maintainers (@gpuops)
description:
  - Ensures that no selected process holds the selected GPUs. Holding a GPU means holding its memory; holders are
    attributed as in M(gpuops.nvidia.gpu_facts) (see docs/attribution.md). A process the driver lists on a GPU, and
    that this PID namespace confirms, holds it; a process the driver lists nowhere holds a GPU only where memory
    the driver's lists do not explain is left (an inherited handle, a zombie leader's thread, a mapping), found by a
    fuser-style scan of C(/proc) (fds of every thread, memory mappings). So orphaned vLLM C(VLLM::EngineCore) and
    C(VLLM::Worker_TP*) processes and children that only inherited a device handle are found whatever their names,
    while NVML clients (exporters, nvtop) and NCCL workers that merely have the device files open are never signalled.
  - A PID the driver lists that no process here confirms (inside a container the driver reports host PIDs) is
    never signalled; it is named in RV(foreign) and in the message.
  - Sends O(signal) to each selected holder, waits up to O(grace_period) seconds, sends SIGKILL to the ones left,
    and waits up to O(kill_wait) seconds for them to exit. A zombie counts as exited; a process stuck in
    uninterruptible sleep (state D) is reported as unkillable.
  - Each process is pinned before its first signal (a pidfd, checked against the start time seen by the scan;
    where pidfds are unavailable the start time is re-read before every signal), so a PID reused meanwhile is
    never signalled.
  - Never signals itself or its ancestors (the Ansible process chain and the SSH session), PID 1 or kernel threads.
    By default it also leaves alone the GPU daemons nvidia-persistenced, nv-hostengine (DCGM), dcgm-exporter,
    nvidia-fabricmanager, the MPS control daemon and server, Xorg / Xwayland and desktop compositors, known by what
    they run (C(/proc/PID/exe) is a root-owned binary of that name), never by a title anyone can set (C(exec -a),
    setproctitle). O(exclude) adds names, and only O(include_protected=true) lifts the default list. With
    O(wait=true), the memory a protected holder keeps counts, and such a GPU is not released (docs/attribution.md,
    "Protected by default").
  - When several holders are selected they are signalled together (vLLM's EngineCore and its TP workers end in
    parallel). After the round the GPUs are looked at again and new selected holders (for example children started
    meanwhile) are ended too, for at most 3 rounds. One that has the parent or the command line of a process just
    ended is a respawn; it is named in RV(respawned) with its parent, and a warning says to stop that parent.
  - Holders of the selected GPUs that O(pids), O(match), O(users), O(exclude) or the protection rules leave alone are
    listed in RV(left_alone) with the reason, and named in the message.
  - Returns C(changed=true) only when something was signalled, so a second run reports C(changed=false).
  - One run at a time per host. A run holds the host's lock (a POSIX record lock on
    C(/run/lock/gpuops-nvidia-gpu_kill.lock); C(/run), then the temp directory, where that cannot be made) from its
    first look to its last; a second run waits for it up to O(lock_timeout), then looks and reports only what it ended
    itself (with a warning saying it waited, and for which run). Two runs at once would signal the same processes,
    and each would report the other's signals and exits as its own. The lock goes with the process that held it,
    however it ended. Check mode takes no lock; it warns when another run is ending processes now.
  - Bad input fails before anything is signalled; an unknown GPU index (indices are ASCII digits) or UUID, an
    invalid regex, an unknown user, a PID of 0 or less, a selection option given as null, an empty or blank
    string, an empty list or a list with a blank entry (a template that rendered nothing would otherwise mean
    "everything"; leave the option out to select any), with O(stop_owners=true) a unit that reaches beyond the
    selection (see O(stop_spanning_owners)), a negative or non-finite (nan, inf) time, a time above its bound (given
    with each option; a typo, or milliseconds for seconds, would otherwise leave the run silent for hours), an
    O(driver_timeout) of 0, an unknown signal.
  - Without the NVIDIA driver library it works from the C(/proc) scan alone (all GPUs, or GPUs mapped through
    C(/proc/driver/nvidia)) and says so in a warning.
extends_documentation_fragment: [gpuops.nvidia.attributes, gpuops.nvidia.attributes.no_diff, gpuops.nvidia.nvml,
  gpuops.nvidia.selection]
attributes:
  check_mode:
    details:
      - Reports in RV(would_signal) what would be signalled and sends nothing.
      - With O(wait=true), fails where the wait would fail whatever was ended (a selected GPU that the driver answers
        with an error, such as one that fell off the bus, or a driver that does not answer), with the wait's words and
        next step. The selected GPUs that no selected holder holds and that are not free (memory that no process
        explains, holders left alone) are named in RV(would_stay) and the message, since a real run waits its whole
        timeout for them unless the driver frees their memory first. Memory that ending the holders might free is
        not predicted.
options:
  gpus:
    description:
      - GPUs whose holders are selected, as NVML indices (ASCII digits), GPU UUIDs or MIG UUIDs (C(MIG-...)). Omitted,
        all GPUs; null, an empty list or a blank entry is refused.
      - A MIG UUID selects the holders of that MIG instance only (the process-list entry's instance ids, or the
        instance's capability files in C(/dev/nvidia-caps)); the parent's index or GPU UUID selects every instance.
    type: list
    elements: raw
  pids:
    description: Only these PIDs (of holders of the selected GPUs) are selected. Omitted, any; null, an empty list or a blank entry is refused.
    type: list
    elements: int
  match:
    description:
      - Only holders whose full command line (C(/proc/PID/cmdline) joined by spaces) matches this Python regex (search).
      - Omitted, any; null, an empty or blank string is refused.
    type: str
  users:
    description:
      - Only holders owned by these users (names that exist on the host, or numeric UIDs).
      - Omitted, any; null, an empty list or a blank entry is refused.
    type: list
    elements: str
  signal:
    description: First signal to send, by name (V(SIGTERM), V(TERM), V(SIGINT)...) or number.
    type: str
    default: SIGTERM
  grace_period:
    description: Seconds to wait after O(signal) before sending SIGKILL (at most 3600).
    type: float
    default: 10.0
  kill_wait:
    description: Seconds to wait for exit after SIGKILL before reporting a process as a survivor (at most 600).
    type: float
    default: 5.0
  exclude:
    description: Process names (kernel comm or basename of argv[0]) never to signal, added to the default protected list.
    type: list
    elements: str
    default: []
  include_protected:
    description: Also signal the default protected GPU daemons (nvidia-persistenced, DCGM, fabric manager, MPS, Xorg, compositors).
    type: bool
    default: false
  driver_timeout:
    description: Seconds to wait for NVML to answer (greater than 0, at most 600) before going on from the C(/proc) scan alone.
    type: float
    default: 10.0
  units:
    description:
      - Only holders in these systemd units (the unit whose cgroup holds the process; V(vllm@a) means V(vllm@a.service)).
        Omitted, any; null, an empty list or a blank entry is refused. See docs/owners.md for how owners are read.
    type: list
    elements: str
  containers:
    description:
      - Only holders in these containers, by full 64-hex id or a unique prefix of 12 or more hex characters.
        Omitted, any; null, an empty list or a blank entry is refused.
    type: list
    elements: str
  pods:
    description: Only holders in these Kubernetes pods, by pod UID or V(NAMESPACE/NAME). Omitted, any; null, an empty list or a blank entry is refused.
    type: list
    elements: str
  slurm_jobs:
    description: Only holders in these Slurm jobs (job ids). Omitted, any; null, an empty list or a blank entry is refused.
    type: list
    elements: str
  stop_owners:
    description:
      - When a selected holder belongs to a systemd unit with a C(Restart=) policy, run C(systemctl stop UNIT) before
        its PIDs are ended, so the unit does not start it again (RV(stopped_units)).
      - Stopping a unit ends every process of its cgroup, not only the selected holders. A unit is stopped only when all
        it runs is the selection's own work (the selected holders, what they started, and where their owner block
        names a vLLM API server, torchrun or an MPI launcher (agents whose processes are one job), that agent and what
        it started). A unit that also runs anything else (a holder of another GPU, a holder the selection leaves alone,
        a process that holds no GPU, such as cron beside a cron job) is stopped only with O(stop_spanning_owners).
        A unit that runs this module itself (its Ansible process chain) is never stopped.
      - Every process a stop ends is named, in check mode and in the run (RV(unit_processes), the message and the
        summary of O(wait=true)).
      - "A holder in a docker or podman container (not a pod's) has its container stopped first, through its runtime:
        C(podman stop -t N ID) or C(docker stop -t N ID), N the O(grace_period), the call bounded at N + 60 seconds
        (RV(stopped_containers)). The same rule as for a unit applies to every process of the container's cgroup
        (RV(container_processes)); the container's init (PID 1 of its PID namespace, as C(--init) runs it) is no work
        of its own. A container that a systemd service runs (quadlet) is stopped with C(systemctl stop UNIT)."
      - For holders in a pod or another runtime's container the runtime is never called; the command that stops the
        owner is reported in RV(owner_commands) and a warning, and the PIDs are ended.
      - When false (the default), the PIDs are ended and a warning names each owner that will restart them.
      - In check mode, RV(would_signal) entries carry C(owner), C(owner_note) (why ending the PID alone will not last)
        and C(owner_command) (what stops the owner); the summary of O(wait=true) says them per holder.
    type: bool
    default: false
  stop_spanning_owners:
    description:
      - With O(stop_owners=true), also stop a unit that runs processes beyond the selection (holders of GPUs outside
        the selection, holders left alone by O(pids), O(match), O(users) or the protection rules, and processes that
        hold no GPU and are not the selection's own work; see O(stop_owners)). Stopping the unit ends them too; the
        message and RV(owners_beyond_selection) name them and their GPUs.
      - One option for all of them, as one question is asked of the operator (stop this unit although it runs more
        than what was selected?). The list of what it runs beyond the selection says what that means.
      - When false (the default), such a unit is not stopped and nothing is signalled. The module fails, naming the
        unit, its processes beyond the selection and their GPUs; check mode fails the same way.
      - Containers and pods are never stopped (see O(stop_owners)); what their stop command would end beyond the
        selection is named in RV(owners_beyond_selection) and the message.
    type: bool
    default: false
  lock_timeout:
    description:
      - Seconds to wait for another gpu_kill run on this host to end (at most 3600). When it has not ended by then,
        the module fails, naming that run, and signals nothing.
    type: float
    default: 120.0
  wait:
    description:
      - After ending the holders, wait until the selected GPUs are released, exactly as M(gpuops.nvidia.gpu_wait) with the
        same selection, and return the state after (RV(after)), the wait's report (RV(wait)) and the summary lines of the
        reset_gpus role (RV(summary)), so the common path of a reset is one module run.
      - When nothing was ended, the first look of the wait is the one the module already took (no second scan).
      - The module fails when the GPUs are not released within O(wait_timeout) (RV(wait_timed_out) true, RV(wait) says
        per GPU what holds it and the next step). In check mode it does not wait, and fails only where the wait would
        fail whatever was ended (see the check_mode attribute).
    type: bool
    default: false
  wait_timeout:
    description: With O(wait=true), seconds to wait for the release (0 is one look; at most 3600).
    type: float
    default: 60.0
  fail_unreleased:
    description:
      - With O(wait=true), whether GPUs not released within O(wait_timeout) fail the module.
      - V(false) returns the same result without failing (RV(released) false, RV(wait_timed_out) true, RV(wait) per
        GPU), for a caller that goes on waiting, as the reset_gpus role does after its first slice. Every other failure
        still fails the module.
    type: bool
    default: true
  max_used_mib:
    description:
      - Used memory in MiB at or below which a GPU without selected holders counts as released (see
        M(gpuops.nvidia.gpu_wait)); also the tolerance for memory the driver's lists do not explain.
    type: int
    default: 256
  poll_interval:
    description: With O(wait=true), seconds between two looks at the GPUs (at most 60).
    type: float
    default: 0.02
notes:
  - The module fails when a selected process survives SIGKILL, with the survivors and the reason in RV(survived).
seealso:
  - module: gpuops.nvidia.gpu_facts
  - module: gpuops.nvidia.gpu_wait
"""

EXAMPLES = r"""
- name: End everything that holds any GPU (orphaned vLLM engines and workers included)
  gpuops.nvidia.gpu_kill:

- name: End the holders of GPUs 0-3 only, giving them 30 s to shut down
  gpuops.nvidia.gpu_kill:
    gpus: [0, 1, 2, 3]
    grace_period: 30

- name: End only vLLM processes of user svc-llm on one GPU, by UUID
  gpuops.nvidia.gpu_kill:
    gpus: [GPU-5a3e1c2b-0000-4000-8000-000000000000]
    match: 'VLLM::|vllm serve'
    users: [svc-llm]

- name: Dry run in check mode
  gpuops.nvidia.gpu_kill:
  check_mode: true
  register: plan
"""

RETURN = r"""
would_signal:
  description:
    - In check mode, the selected holders that would be signalled (same fields as the holders of gpu_facts, C(owner)
      included), with C(owner_note), C(owner_command) and C(owner_label) as in RV(signalled).
  returned: always
  type: list
  elements: dict
would_stay:
  description:
    - In check mode with O(wait=true), the wait's words for the selected GPUs that no selected holder holds and that
      are not free, as a wait that ends on them says them, with their next step. Ending the holders would not free
      them.
  returned: check mode with O(wait=true), where there are such GPUs
  type: str
signalled:
  description:
    - Holders that were signalled, each with C(signals), the signal names sent in order, and C(exited_after_s)
      (seconds from the first signal to the observed exit) for those that exited.
    - Each carries its C(owner) block (as in gpu_facts) and, from it, C(owner_note) (why ending the PID alone will not
      last, as with a unit with a C(Restart=) policy, a container or pod, a live respawning agent; else null),
      C(owner_command) (the command that stops the owner for good, for example C(systemctl stop vllm@a.service) or
      C(docker stop 4f1c3a9e0b7d); null where there is none) and C(owner_label) (the Prometheus label value of
      bounded cardinality, C(pod:UID), C(container:12 hex), C(slurm_job:ID), C(unit:NAME), or an empty string).
  returned: always
  type: list
  elements: dict
  sample: [{"pid": 4242, "comm": "VLLM::EngineCor", "cmdline": "VLLM::EngineCore", "gpus": [0], "signals": ["SIGTERM"]}]
exited:
  description: Signalled holders that exited, as in RV(signalled), with C(signals) and C(exited_after_s), seconds from the first signal to the observed exit.
  returned: always
  type: list
  elements: dict
survived:
  description: Signalled holders still alive after SIGKILL, as in RV(signalled), with C(state) and C(reason) (for example unkillable in state D).
  returned: always
  type: list
  elements: dict
protected:
  description: Holders of the selected GPUs left alone by the protection rules or O(exclude), with C(reason).
  returned: always
  type: list
  elements: dict
left_alone:
  description:
    - Every holder of the selected GPUs that was not selected, with C(reason) (not in O(pids), command line not matching
      O(match), user not in O(users), excluded, protected GPU daemon, this module's own process chain, PID 1).
  returned: always
  type: list
  elements: dict
foreign:
  description:
    - Entries of the driver's process lists on the selected GPUs that no process in this PID namespace confirms
      (C(pid), C(used_mib), C(type), C(gpu), C(reason) C(absent) or C(not_holding), C(comm) of the unrelated process
      with that PID). Never signalled; run on the host to end them.
  returned: always
  type: list
  elements: dict
released:
  description: With O(wait=true), whether every selected GPU was released within O(wait_timeout).
  returned: when O(wait=true) and not in check mode
  type: bool
wait_timed_out:
  description:
    - With O(wait=true), true when the GPUs were not released, within O(wait_timeout) or before it when waiting could
      not help (a lost GPU, a hung driver; RV(wait) says which). The module then failed, unless O(fail_unreleased=false).
  returned: when O(wait=true) and not in check mode
  type: bool
wait:
  description:
    - With O(wait=true), the wait as M(gpuops.nvidia.gpu_wait) reports it, C(elapsed_s), C(polls), C(msg),
      C(memory_checked), C(driver) and C(gpus) (per selected GPU, with C(next_step) where not released).
  returned: when O(wait=true) and not in check mode
  type: dict
after:
  description: With O(wait=true), the GPUs and their holders at the wait's last look, in the structure of RV(before).
  returned: when O(wait=true) and not in check mode
  type: dict
summary:
  description:
    - With O(wait=true), the per-host summary of the reset_gpus role, one string per line, what was (or would be)
      signalled and left alone (PIDs of O(pids) that hold no selected GPU are named), the outcome, and per selected
      GPU its used memory (MiB) and holder count before and after. Never C(None), empty GPU lists or a false
      "released".
    - Each holder line names the holder's owner (C(pod NAMESPACE/NAME), C(docker container 12HEX), C(Slurm job ID),
      C(unit NAME)) where one is known; where ending the PID alone will not last, the next line gives C(owner_note)
      and C(owner_command). Units stopped with O(stop_owners=true) are named.
  returned: when O(wait=true)
  type: list
  elements: str
  sample: ["signalled 1 process(es) in 0.21 s",
           "  PID 9 python3 (GPUs 0, unit vllm@a.service): SIGTERM, exited after 0.09 s",
           "    ending it alone will not last: systemd unit vllm@a.service restarts it (Restart=always); stop the owner: systemctl stop vllm@a.service",
           "memory released after 0.52 s more", "GPU 0 NVIDIA H100 80GB HBM3: 75034 -> 0 MiB used, holders 1 -> 0"]
would_stop_units:
  description: In check mode with O(stop_owners=true), the systemd units that a real run would stop first.
  returned: always
  type: list
  elements: str
would_stop_containers:
  description:
    - In check mode with O(stop_owners=true), the docker and podman containers that a real run would stop first, each
      with C(id) (64 hex), C(runtime) and C(command) (the stop it would run, with its timeout).
  returned: always
  type: list
  elements: dict
stopped_containers:
  description: The docker and podman containers stopped with O(stop_owners=true), as in RV(would_stop_containers).
  returned: always
  type: list
  elements: dict
container_processes:
  description:
    - With O(stop_owners=true), per container id that is (or in check mode would be) stopped, every process of its
      cgroup, as RV(unit_processes) gives them for a unit; C(why) also C(the container's init) and
      C(the container's monitor).
  returned: always
  type: dict
unit_processes:
  description:
    - With O(stop_owners=true), per systemd unit that is (or in check mode would be) stopped, every process of its
      cgroup, which the stop ends, the selected holders first. Each has C(pid), C(comm), C(cmdline), C(start_ticks),
      C(gpus) (the GPUs it holds; empty for none), C(beyond) (true for a process beyond the selection) and C(why)
      (C(selected), C(part of the selected work), C(holds no GPU), C(outside the selection),
      C(not selected (REASON))); in a real run also C(ended), whether it was gone once C(systemctl stop) returned.
  returned: always
  type: dict
  sample: {"cron.service": [{"pid": 9, "comm": "python3", "gpus": [4], "beyond": false, "why": "selected"},
           {"pid": 5, "comm": "cron", "gpus": [], "beyond": true, "why": "holds no GPU"}]}
lock_waited_s:
  description: Seconds this run waited for another gpu_kill run on this host to end (0.0 when none ran).
  returned: always
  type: float
owners_beyond_selection:
  description:
    - With O(stop_owners=true), the owners of selected holders that run processes beyond the selection (stopping
      the owner would end them too), holders of other GPUs or left alone and, for a unit, processes that hold no GPU.
      Each has C(kind) (V(unit), V(container) or V(pod)), C(owner) (in words), C(unit) (the unit's name; null for a
      container or pod), C(command) (what stops it) and C(processes) (C(pid), C(comm), C(gpus), C(reason)).
  returned: always
  type: list
  elements: dict
stopped_units:
  description: Systemd units stopped with O(stop_owners=true) before their holders were ended.
  returned: always
  type: list
  elements: str
owner_commands:
  description:
    - With O(stop_owners=true), the commands that stop the pods and the containers of other runtimes of the selected
      holders (not run).
  returned: always
  type: list
  elements: str
respawned:
  description:
    - Selected holders that appeared after others were ended, with the parent or command line of one of them, with
      C(replaces) (the PID that was ended) and C(parent) (C(pid), C(comm)); otherwise as in RV(signalled).
  returned: always
  type: list
  elements: dict
not_signalled:
  description: Selected holders that were not signalled because they exited, or their PID was reused, before the signal (entries as in RV(signalled)).
  returned: always
  type: list
  elements: dict
not_holding:
  description: PIDs from O(pids) that hold none of the selected GPUs (nothing to do for them).
  returned: always
  type: list
  elements: int
gpus:
  description: The selected NVML indices (parents of selected MIG instances included), or null for all GPUs.
  returned: always
  type: list
  elements: int
mig_instances:
  description: Per GPU index (as a string) of which only some MIG instances were selected, their MIG UUIDs.
  returned: always
  type: dict
  sample: {"0": ["MIG-1f0c9c5e-2d6b-5a3e-9c1a-000000000004"]}
driver:
  description: State of the NVIDIA driver library, as in gpu_facts.
  returned: always
  type: dict
elapsed_s:
  description: Seconds the module spent looking and signalling (the wait of O(wait=true) is in RV(wait)).
  returned: always
  type: float
before:
  description:
    - The GPUs and their holders as read before anything was signalled, in the structure of the C(nvidia) facts
      of M(gpuops.nvidia.gpu_facts) (C(driver), C(gpus) with memory in MiB and C(holder_pids), C(holders),
      C(unmapped_minors), C(index_source)), so that a play needs no separate gpu_facts task before the kill.
  returned: when the GPUs could be read (not when an option is invalid)
  type: dict
  sample: {"driver": {"available": true}, "gpus": [{"index": 0, "memory_used_mib": 72874, "holder_pids": [4242]}],
           "holders": [{"pid": 4242, "comm": "python3", "cmdline": "python3 train.py", "gpus": [0]}], "unmapped_minors": [],
           "index_source": "nvml"}
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus, _kill, _outcome


def main() -> None:
    module = AnsibleModule(argument_spec=_kill.argument_spec(), supports_check_mode=True)
    _gpus.check_libraries(module, missing_required_lib)
    # A null selection option is None in params, as one left out: the action plugin refused it on the controller.
    outcome = _kill.run(
        module.params, check_mode=module.check_mode, run_command=module.run_command, which=module.get_bin_path
    )
    _outcome.exit_with(module, outcome)


if __name__ == "__main__":
    main()
