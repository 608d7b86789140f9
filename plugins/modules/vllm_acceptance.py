# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_acceptance
short_description: Measure a vLLM server's speculative-decoding acceptance, over a warm-up or over a window of its traffic
version_added: 0.1.0
description:
  - Reads vLLM's speculative-decoding counters from C(GET /metrics) (C(vllm:spec_decode_num_drafts_total),
    C(vllm:spec_decode_num_draft_tokens_total), C(vllm:spec_decode_num_accepted_tokens_total) and
    C(vllm:spec_decode_num_accepted_tokens_per_pos_total)), sends one completion per prompt of O(prompts)
    (temperature 0, O(max_tokens) tokens, one at a time), reads the counters again and reports the differences.
  - RV(acceptance_rate) is accepted tokens / draft tokens; RV(mean_acceptance_length) is 1 + accepted tokens / drafts,
    the tokens produced per forward pass of the target model.
  - A drafter configured differently from how it was trained (wrong hidden-state layers, mask token or
    attention layout) does not make vLLM fail; acceptance collapses, often below 1%. With O(min_acceptance_rate)
    this module is the gate that catches it.
  - Fails when the server exports no speculative-decoding counters or counted no draft token during the warm-up.
  - With O(window) it sends nothing. It reads the counters, waits O(window) seconds and reads them again, so the
    figures are those of the traffic the server served in that window (acceptance that decays while a server runs,
    vllm-project/vllm#11188, is caught by running this periodically). A window without any draft passes, with
    RV(acceptance_rate) null and a message saying so.
  - A server started with C(--disable-log-stats) exports no C(vllm:) metric at all (vLLM then creates no stat logger);
    the module fails and says so.
  - Definitions as in vLLM 0.33 C(vllm/v1/spec_decode/metrics.py) (the Prometheus counters' C(rate()) ratios).
author: gpuops maintainers (@gpuops)
extends_documentation_fragment: [gpuops.nvidia.attributes, gpuops.nvidia.attributes.full_check, gpuops.nvidia.vllm_server]
attributes:
  check_mode:
    details:
      - Sends the warm-up completions in check mode too; they change nothing on the host.
  diff_mode:
    support: N/A
    details:
      - Changes nothing.
options:
  served_model_name:
    description:
      - The served model name to send the completions to; counters labelled with another model are ignored.
      - Any name the server serves works. vLLM 0.33 labels its metrics with the first served name only, so the
        counters of another name are read under the first one, found in C(GET /v1/models).
    type: str
    required: true
    aliases: [model]
  prompts:
    description: Warm-up prompts, sent in order. Default is four short fixed prompts (text and code).
    type: list
    elements: str
  max_tokens:
    description: Tokens to generate per prompt.
    type: int
    default: 128
  min_acceptance_rate:
    description: Fail when RV(acceptance_rate) is below this fraction (0-1). Not set, the rate is only reported.
    type: float
  request_timeout:
    default: 120.0
  window:
    description:
      - Watch instead of warming up, for this many seconds (above 0); O(prompts) and O(max_tokens) are then not used.
    type: float
seealso:
  - module: gpuops.nvidia.vllm_speculative_config
  - module: gpuops.nvidia.vllm_ready
  - name: vLLM speculative decoding metrics
    description: How vLLM counts drafts and accepted tokens.
    link: https://docs.vllm.ai/en/latest/features/spec_decode.html
"""

EXAMPLES = r"""
- name: Fail the deployment when fewer than 30% of the drafted tokens are accepted
  gpuops.nvidia.vllm_acceptance:
    url: http://127.0.0.1:8000
    served_model_name: qwen3.6-27b
    api_key: "{{ vault_vllm_api_key }}"
    max_tokens: 256
    min_acceptance_rate: 0.3
  register: acceptance

- name: Watch the production traffic for 5 minutes; fail below 30%
  gpuops.nvidia.vllm_acceptance:
    url: http://127.0.0.1:8000
    served_model_name: qwen3.6-27b
    window: 300
    min_acceptance_rate: 0.3

- name: Show it
  ansible.builtin.debug:
    msg: "acceptance {{ acceptance.acceptance_rate }}, {{ acceptance.mean_acceptance_length }} tokens per step, {{ acceptance.tokens_per_s }} tok/s"
"""

RETURN = r"""
acceptance_rate:
  description: Accepted tokens / draft tokens during the warm-up or the O(window) (0-1); null for a window without drafts.
  returned: success
  type: float
  sample: 0.7131
mean_acceptance_length:
  description: 1 + accepted tokens / drafts, tokens produced per target forward pass.
  returned: success
  type: float
  sample: 11.7
drafts:
  description: Drafts proposed during the warm-up (difference of C(vllm:spec_decode_num_drafts_total)).
  returned: success
  type: int
draft_tokens:
  description: Draft tokens proposed during the warm-up.
  returned: success
  type: int
accepted_tokens:
  description: Draft tokens accepted during the warm-up.
  returned: success
  type: int
accepted_per_position:
  description: Accepted tokens per draft position (index 0 is the first drafted token).
  returned: success
  type: list
  elements: int
acceptance_per_position:
  description: Accepted tokens at each draft position / drafts.
  returned: success
  type: list
  elements: float
window_s:
  description: Seconds between the two readings, with O(window).
  returned: success, with O(window)
  type: float
completions:
  description: Number of warm-up completions sent.
  returned: success, without O(window)
  type: int
completion_tokens:
  description: Tokens generated by the warm-up.
  returned: success, without O(window)
  type: int
elapsed_s:
  description: Seconds the warm-up took.
  returned: success, without O(window)
  type: float
tokens_per_s:
  description: Generated tokens per second over the sequential warm-up (single-stream throughput).
  returned: success, without O(window)
  type: float
before:
  description: Counters read before the warm-up (C(drafts), C(draft_tokens), C(accepted_tokens), C(accepted_per_position)).
  returned: success
  type: dict
after:
  description: Counters read after the warm-up.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _acceptance_run


def main() -> None:
    module = AnsibleModule(argument_spec=_acceptance_run.argument_spec(), supports_check_mode=True)
    _outcome.exit_with(module, _acceptance_run.run(module.params))


if __name__ == "__main__":
    main()
