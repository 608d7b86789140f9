# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_server_host
short_description: Read in one pass what the vllm_server role checks on a host
version_added: 0.2.0
description:
  - The validate phase of the gpuops.nvidia.vllm_server role in one look at the host. The role checks what it
    returns on the controller, before anything is stopped.
  - It reads whether systemd runs (C(/run/systemd/system), the test of sd_booted(3)), the GPUs and their holders as
    M(gpuops.nvidia.gpu_facts) does, the configurations the role deployed (C(<config_dir>/<name>.json)), whether
    the given paths exist, and the drafter C(config.json) of each speculative config.
  - It reads the vLLM release of each executable of O(executables), once each. That is the C(Version) of the
    C(vllm-*.dist-info/METADATA) of the Python environment the executable runs in (that of the interpreter its
    first line names, or C(<bin>/..) of the executable), else what C(EXECUTABLE --version) prints (at most 60 s).
  - It reads the state of each instance's files (the SHA-256 of their content and their mode, never an API key).
  - It asks the running server of each deployed instance once whether it is healthy (C(GET /health), C(GET /v1/models))
    at the address its deployed configuration gives, with its API key file. It asks once whether a server answers
    on each port that an instance takes anew.
  - It lists the vLLM API servers of the host, whoever started them (RV(servers)).
  - It changes nothing.
author: gpuops maintainers (@gpuops)
requirements:
  - nvidia-ml-py >= 12.535.108 and psutil on the managed host, as for M(gpuops.nvidia.gpu_facts)
extends_documentation_fragment:
  - gpuops.nvidia.attributes
  - gpuops.nvidia.attributes.INFO_MODULE
options:
  instances:
    description:
      - The instances to deploy, each with C(name), C(port), and optionally C(host) and C(served_model_name).
    type: list
    elements: dict
    required: true
  paths:
    description: Paths to look for (model directories, vLLM executables).
    type: list
    elements: path
    default: []
  executables:
    description: vLLM executables whose vLLM release to read.
    type: list
    elements: path
    default: []
  images:
    description:
      - The container images of the instances that podman or docker runs, as C(runtime) and C(image), whose ID on the
        host to read (nothing is pulled). When given, the GPU names of the host's CDI specs are read too.
    type: list
    elements: dict
    default: []
  drafters:
    description: The C(model) and C(drafter_config) of each speculative config, whose drafter C(config.json) to read.
    type: list
    elements: dict
    default: []
  config_dir:
    description: Where the role keeps the instance configurations and API key files.
    type: path
    required: true
  state_dir:
    description: Where the role keeps the pidfiles of detached servers.
    type: path
    required: true
  log_dir:
    description: Where the servers write their logs.
    type: path
    required: true
  unit_prefix:
    description: Prefix of the systemd unit names (C(<unit_prefix><name>.service)).
    type: str
    default: vllm-
  systemd_dir:
    description: Where the role writes the systemd units.
    type: path
    default: /etc/systemd/system
  request_timeout:
    description: >-
      Seconds one HTTP request may take in all (connection, request, status line, headers and body). A server that sends its
      answer slowly fails at this deadline, with the URL and what had not come. A negative or non-finite value is refused
      before anything is read.
    type: float
    default: 5.0
  max_used_mib:
    description:
      - Used MiB per GPU that the driver's lists may leave unexplained, as in M(gpuops.nvidia.gpu_facts).
      - A negative value is refused.
    type: int
    default: 256
  driver_timeout:
    description: Seconds the NVML reading may take, as in M(gpuops.nvidia.gpu_facts) (greater than 0, at most 600).
    type: float
    default: 10.0
seealso:
  - module: gpuops.nvidia.gpu_facts
  - module: gpuops.nvidia.vllm_ready
"""

EXAMPLES = r"""
- name: Read what the vllm_server role checks
  gpuops.nvidia.vllm_server_host:
    instances: [{name: qwen, port: 8000}]
    paths: [/models/Qwen3-8B, /usr/local/bin/vllm]
    config_dir: /etc/vllm
    state_dir: /var/lib/vllm
    log_dir: /var/log/vllm
  register: host
"""

RETURN = r"""
systemd:
  description: Whether systemd runs on the host.
  returned: always
  type: bool
nvidia:
  description: The GPUs and their holders, as C(ansible_facts.nvidia) of M(gpuops.nvidia.gpu_facts).
  returned: always
  type: dict
deployed:
  description: The configuration of each instance the role deployed, by name, as in C(<config_dir>/<name>.json).
  returned: always
  type: dict
running:
  description:
    - For each instance of O(instances) that is deployed, one look at its server where its deployed configuration
      put it.
    - C(ready) (healthy and serving its name), C(process_exited) (no server process runs), C(last_error) (what was
      seen, or null), C(pid) (the server's main PID, or 0).
  returned: always
  type: dict
ports:
  description:
    - For each instance whose port differs from the deployed one (or that is not deployed), what answers there.
      Null when the connection is refused, else what was seen.
  returned: always
  type: dict
servers:
  description:
    - The vLLM API servers of the host, whoever started them. A server is known by its process - a Python process that
      runs vLLM's server (C(vllm serve), C(python -m vllm.entrypoints.cli.main serve),
      C(python -m vllm.entrypoints.openai.api_server)), listening or still loading its model (vLLM listens once it is
      loaded); a launcher of several API servers is one server.
    - C(pid), C(start_ticks), C(sid), C(user) (UID), C(argv) and C(command) (its command line; the values of
      C(--api-key) and C(--hf-token) are not shown), C(cwd), C(log_file) (where its standard output goes),
      C(cuda_visible_devices) (the one variable read from its environment), C(listen) (C([address, port]) of each
      listening socket; empty while it loads), C(host) and C(port) (what its command line binds; C(port) is vLLM's
      default 8000 without C(--port), null with C(--uds), C(--headless), C(--api-server-count 0) or a C(--config) file
      without C(--port)), C(own_network) (whether it shares the module's network namespace; false for a container
      on a bridge network, whose sockets are not in C(listen); null where not readable), C(model),
      C(served_model_name), C(tensor_parallel_size), C(data_parallel_size) (from its command line), C(tree) (its
      descendants' PIDs), C(holders), C(gpus) and C(mig) (what its tree holds, as in C(nvidia)), C(systemd_unit),
      C(container_id) (the container its cgroup names, or null).
    - C(recorded_by) - the deployed instance whose pidfile, unit or container it is, or null for a server the role did
      not start.
  returned: always
  type: list
  elements: dict
files:
  description:
    - For each instance of O(instances), the state of its files by what they are (C(configuration), C(API key),
      C(systemd unit)) - null for a missing file, else C(sha256) (of the content) and C(mode). The role compares
      them with what it would write (M(gpuops.nvidia.vllm_server_files) compares the same way).
  returned: always
  type: dict
paths:
  description: For each path of O(paths), C(exists), C(isdir) and C(executable).
  returned: always
  type: dict
vllm_versions:
  description:
    - For each path of O(executables), C(version) (the vLLM release, as its package metadata or C(--version) gives
      it, or null), C(source) (the C(METADATA) file read, or the command run) and C(error) (why no version was
      read, or null).
  returned: always
  type: dict
  sample: {"/opt/vllm/bin/vllm": {"version": "0.34.0", "error": null,
           "source": "/opt/vllm/lib/python3.12/site-packages/vllm-0.34.0.dist-info/METADATA"}}
drafters:
  description:
    - One entry per item of O(drafters), its C(model) and C(drafter_config), with C(path) (the C(config.json) read),
      C(config) (its content) and C(error) (why it could not be read, or null).
  returned: always
  type: list
  elements: dict
missing_dirs:
  description: Which of O(config_dir), O(state_dir) and O(log_dir) do not exist yet.
  returned: always
  type: list
  elements: str
containers:
  description:
    - Per deployed instance that a container runtime runs, its container as the runtime inspects it (C(id), C(image_id),
      C(image), C(status), C(running), C(pid), C(exit_code), C(health), C(labels)); null where there is no container of
      its name, C(error) where the runtime failed.
  returned: always
  type: dict
images:
  description: Per C("RUNTIME IMAGE") of O(images), the image's ID on this host, or null when the host does not have it.
  returned: always
  type: dict
cdi:
  description:
    - The device names of the host's CDI specs (C(nvidia.com/gpu=0)), in C(/etc/cdi) and C(/var/run/cdi); read only
      when O(images) is given.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus, _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _host_run


def main() -> None:
    module = AnsibleModule(argument_spec=_host_run.argument_spec(), supports_check_mode=True)
    outcome = _host_run.run(
        module.params,
        module.run_command,
        module.get_bin_path,
        lambda: _gpus.check_libraries(module, missing_required_lib),
    )
    _outcome.exit_with(module, outcome)


if __name__ == "__main__":
    main()
