# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_speculative_config
short_description: Validate a vLLM speculative decoding config against the drafter's config.json
version_added: 0.1.0
description:
  - Reads the drafter's C(config.json) on the managed host and checks the requested vLLM
    C(--speculative-config) against it, field by field, the way the vLLM release of O(vllm_version) reads it (0.32,
    0.33 or 0.34; default 0.34), before a server is started with it.
  - Wrong values there rarely make vLLM fail; the server starts and the acceptance rate collapses.
    Every mismatch is reported with the requested value, the drafter's value and what happens in vLLM.
  - What that vLLM release itself refuses at start is refused here too, naming the field, the value, what vLLM expects
    and why (sources in the vLLM wheels, C(vllm/config/speculative.py), C(vllm/config/utils.py),
    C(vllm/config/vllm.py)). Unknown fields (vLLM's config classes forbid them; a field of another release is named as
    such, for example C(disable_padded_drafter_batch) on 0.34), C(tensor_parallel_size), C(speculative_token_tree),
    C(custom_method) (0.34 fills it itself), methods the release does not know (V(medusa), V(mlp_speculator) from
    0.33, V(custom_class) in 0.34, unknown C(*_mtp) names). vLLM 0.34 also runs a method a vLLM plugin registers, so
    there a method that is not built in is accepted with a warning (the module cannot see the plugins), unless it is
    close to a built-in name (a typo).
    Per-model MTP methods such as V(deepseek_mtp) are accepted with a warning and passed as V(mtp), as vLLM rewrites them.
  - Values the drafter defines are filled in when not given (C(num_speculative_tokens) in O(speculative_config);
    C(method) when only C(model) is given, inferred from the drafter path as vLLM does).
  - The drafters of methods V(dflash), V(eagle), V(eagle3), V(mtp) are checked; V(ngram) needs none. vLLM's other
    methods (V(draft_model), V(suffix), V(ngram_gpu), V(dspark), V(custom_class) before 0.34,
    V(extract_hidden_states)) are accepted with a warning that no drafter was checked.
  - "DFlash: a requested C(target_layer_ids) is compared with C(dflash_config.target_layer_ids) on the
    same basis: both are 0-based target layer indices whose output the drafter was trained on. vLLM taps hidden state
    C(id + 1); hidden states 0..N exist on an N-layer target (N is the last layer's output, before the final norm),
    so C(id) up to N - 1 is valid (for EAGLE-3 aux ids, up to N). The vLLM tap ids are shown in RV(checks)."
  - "DFlash: the tapped layers are looked up in vLLM's order (V2 model runner): top-level
    C(eagle_aux_hidden_state_layer_ids), C(dflash_config.target_layer_ids) + 1, C(dspark_target_layer_ids) + 1, top-level
    C(target_layer_ids) + 1, C(dflash_config.layer_ids)/C(eagle_config.layer_ids). Speculators-format drafters
    (C(speculators_model_type: dflash), C(aux_hidden_state_layer_ids)) are converted as vLLM does. A key vLLM reads before
    the trained ids fails unless it equals them (then a warning). With the V1 runner forced,
    C(eagle_config.eagle_aux_hidden_state_layer_ids) replaces them; with V2 it is ignored (a warning)."
  - "DFlash: C(mask_token_id) from C(dflash_config) (over C(eagle_config)), else the top level; the attention layout
    from C(layer_types), C(dflash_config.use_swa), C(dflash_config.swa_window_size) else C(sliding_window); causality
    from the top-level C(is_causal), else C(dflash_config.causal) (C(dflash_config.is_causal) is not read by vLLM: it
    fails when it disagrees with what vLLM does). Mixed sliding/full layers need vLLM's V2 model runner, the default in
    0.32 and 0.33: RV(environment) holds C(VLLM_USE_V2_MODEL_RUNNER=1) to keep it, and O(environment) forcing V1
    (C(VLLM_USE_V2_MODEL_RUNNER=0)) is refused, as vLLM refuses it at start. vLLM 0.34 has no V1 runner and does not
    read the variable (a warning when it is set)."
  - "DFlash: C(num_speculative_tokens) above C(block_size - 1) is a warning: vLLM serves it, the extra positions
    were never trained."
  - "Token budget (vllm-project/vllm#50708): with O(extra_args), C(num_speculative_tokens) is checked against
    C(--max-num-batched-tokens), C(--max-num-seqs) and C(--enable-lora) as the release checks it at start (0.33 and
    0.34: DFlash needs C(K + 1) query tokens per request, EAGLE, MTP and draft models C(K); 0.32: DFlash C(K) new
    slots, a draft model 1, the others none), with the arithmetic in the message; values not given take vLLM's
    defaults for each GPU class (2048/256, 8192/1024, 16384/1024), and the message says which value is such a
    default (the vllm_server role knows the GPU: it checks its class only)."
  - Read-only; C(changed) is always V(false).
author: gpuops maintainers (@gpuops)
extends_documentation_fragment:
  - gpuops.nvidia.attributes
  - gpuops.nvidia.attributes.INFO_MODULE
options:
  speculative_config:
    description:
      - The config as passed to C(vllm serve --speculative-config), as a dictionary.
      - C(method) (a method of the release; omitted, it is inferred from C(model) as vLLM does) and C(model) (the drafter
        directory on the managed host; not for V(ngram); for V(mtp) it may be omitted, vLLM then uses the target
        checkpoint and O(drafter_config) must point at the target's config.json).
      - "Every field of the release's C(SpeculativeConfig) is accepted (C(-) in a key is read as C(_), as vLLM does); the
        common ones are type-checked: C(num_speculative_tokens), C(draft_tensor_parallel_size) (1 or the target's tensor
        parallel size), C(quantization), C(max_model_len), C(revision), C(code_revision), C(attention_backend),
        C(draft_sample_method) (V(greedy) or V(probabilistic)), C(enforce_eager), C(disable_padded_drafter_batch),
        C(parallel_drafting), C(prompt_lookup_min), C(prompt_lookup_max); the others are passed for vLLM to check.
        C(prompt_lookup_*) with another method than ngram, or C(model) with ngram, are warnings (vLLM ignores them), and
        so are the fields vLLM 0.34 documents as without effect (C(parallel_drafting),
        C(suffix_decoding_max_spec_factor), C(suffix_decoding_min_token_prob))."
      - "For V(dflash), what the drafter defines can be stated to have it checked: C(target_layer_ids) (0-based,
        as in C(dflash_config.target_layer_ids)), C(mask_token_id), C(layer_types) (one of V(sliding_attention) or
        V(full_attention) for all layers, or a list with one per drafter layer), C(sliding_window), C(block_size).
        vLLM reads these from config.json: they are checked, never put into RV(speculative_config)."
      - C(num_speculative_tokens) defaults to the drafter's value (DFlash C(block_size - 1), MTP layer count,
        speculators C(proposal_methods[].speculative_tokens)); V(ngram) requires it.
    type: dict
    required: true
  drafter_config:
    description:
      - Path of the drafter's C(config.json), or of the directory holding it, on the managed host.
      - Defaults to C(<model>/config.json).
    type: path
  target_num_layers:
    description:
      - Number of hidden layers of the target model, to check the hidden-state taps against.
      - Defaults to the drafter's C(num_target_layers); when both are known they must agree.
    type: int
  allow_fields:
    description:
      - Further field names to accept and pass to vLLM unchecked, for fields of vLLM releases newer than this
        module knows (vLLM refuses unknown fields at start).
    type: list
    elements: str
    default: []
  extra_args:
    description:
      - Further C(vllm serve) arguments of the server (as in the role's C(extra_args)). Read for the token budget
        (C(--max-num-batched-tokens), C(--max-num-seqs), C(--enable-lora)) and C(--disable-log-stats).
      - C(--disable-log-stats) removes every C(vllm:spec_decode_*) metric; a warning, refused with O(acceptance_gate).
    type: list
    elements: str
    default: []
  environment:
    description:
      - Environment of the server. C(VLLM_USE_V2_MODEL_RUNNER=0) forces vLLM's V1 model runner, which refuses mixed
        sliding/full DFlash drafters and reads C(eagle_config.eagle_aux_hidden_state_layer_ids).
    type: dict
    default: {}
  vllm_version:
    description:
      - The vLLM release the server runs, whose facts apply. V(0.32.0), V(0.33.0) or V(0.34.0) (what
        C(make check-vllm-source) compares with their wheels). The vllm_server role passes the release it read from
        the instance's executable.
    type: str
    choices: ["0.32.0", "0.33.0", "0.34.0"]
    default: "0.34.0"
  acceptance_gate:
    description:
      - An acceptance gate will read the server's speculative-decoding metrics; C(--disable-log-stats) in O(extra_args)
        is then refused.
    type: bool
    default: false
notes:
  - The drafter must be on the managed host; Hugging Face ids are not downloaded.
  - Checked against the vLLM 0.32.0, 0.33.0 and 0.34.0 wheels. vLLM releases before the DFlash layer fix tapped
    C(target_layer_ids) without the C(+ 1), one layer early.
seealso:
  - name: vLLM speculative decoding
    description: vLLM's documentation of C(--speculative-config).
    link: https://docs.vllm.ai/en/latest/features/spec_decode.html
  - name: DFlash
    description: Block-diffusion drafters (z-lab).
    link: https://github.com/z-lab/dflash
"""

EXAMPLES = r"""
- name: Validate the DFlash drafter config before starting vLLM
  gpuops.nvidia.vllm_speculative_config:
    speculative_config:
      method: dflash
      model: /models/Qwen3.6-27B-DFlash
      target_layer_ids: [1, 16, 31, 46, 61]
      mask_token_id: 248070
  register: spec

- name: Start vLLM with the validated config and the environment it needs
  ansible.builtin.command:
    argv: [vllm, serve, /models/Qwen3.6-27B, --speculative-config, "{{ spec.speculative_config_json }}"]
  environment: "{{ spec.environment }}"

- name: Also check the token budget and the metrics the acceptance gate reads, with the server's arguments
  gpuops.nvidia.vllm_speculative_config:
    speculative_config:
      method: dflash
      model: /models/Qwen3.6-27B-DFlash
    extra_args: [--max-num-batched-tokens, "8192", --max-num-seqs, "256"]
    environment: {VLLM_USE_V2_MODEL_RUNNER: "1"}
    acceptance_gate: true

- name: EAGLE-3 head, number of speculative tokens taken from the drafter
  gpuops.nvidia.vllm_speculative_config:
    speculative_config:
      method: eagle3
      model: /models/Qwen3-235B-A22B-EAGLE3
    target_num_layers: 94

- name: MTP layers shipped inside the target checkpoint
  gpuops.nvidia.vllm_speculative_config:
    speculative_config:
      method: mtp
      num_speculative_tokens: 1
    drafter_config: /models/DeepSeek-V3/config.json

- name: N-gram lookup needs no drafter
  gpuops.nvidia.vllm_speculative_config:
    speculative_config:
      method: ngram
      num_speculative_tokens: 4
      prompt_lookup_max: 4
"""

RETURN = r"""
speculative_config:
  description: The validated config with the drafter's values filled in, to pass to C(--speculative-config).
  returned: success
  type: dict
  sample: {"method": "dflash", "model": "/models/Qwen3.6-27B-DFlash", "num_speculative_tokens": 15}
speculative_config_json:
  description: RV(speculative_config) as compact JSON, ready for C(--speculative-config).
  returned: success
  type: str
  sample: '{"method":"dflash","model":"/models/Qwen3.6-27B-DFlash","num_speculative_tokens":15}'
environment:
  description: Environment variables the vLLM server needs for this drafter (empty when none).
  returned: success
  type: dict
  sample: {"VLLM_USE_V2_MODEL_RUNNER": "1"}
filled:
  description: Fields of RV(speculative_config) taken from the drafter because they were not given.
  returned: success
  type: list
  elements: str
  sample: ["num_speculative_tokens"]
vllm_version:
  description: The vLLM release whose facts were applied (O(vllm_version)).
  returned: success
  type: str
  sample: "0.34.0"
drafter_config:
  description: Path of the drafter config.json that was read; V(null) for V(ngram).
  returned: success
  type: str
  sample: /models/Qwen3.6-27B-DFlash/config.json
checks:
  description: One entry per checked field.
  returned: success
  type: list
  elements: dict
  contains:
    field:
      description: Field name (config.json key or speculative config field).
      type: str
    status:
      description:
        - V(ok) requested and drafter agree; V(filled) taken from the drafter into RV(speculative_config);
          V(from_drafter) not requested, vLLM uses the drafter's value; V(warning) usable but worth fixing;
          V(mismatch) does not match.
      type: str
      choices: [ok, filled, from_drafter, warning, mismatch]
    requested:
      description: Requested value, V(null) when not given.
      type: raw
    drafter:
      description: Value the drafter defines (or the limit it sets).
      type: raw
    detail:
      description: What was checked, or why it does not match.
      type: str
  sample: [{"field": "target_layer_ids", "status": "ok", "requested": [1, 16, 31, 46, 61], "drafter": [1, 16, 31, 46, 61],
            "detail": "vLLM taps the hidden states entering target layers [2, 17, 32, 47, 62] (target_layer_ids + 1)"}]
mismatches:
  description:
    - Every field that does not match the drafter, also listed one per line in C(msg).
  returned: failure, when fields do not match the drafter
  type: list
  elements: dict
  contains:
    field:
      description: Field name.
      type: str
    requested:
      description: Requested value (for a stale config.json key, the value vLLM would use).
      type: raw
    drafter:
      description: The drafter's value.
      type: raw
    explanation:
      description: What vLLM does with the requested value.
      type: str
    source:
      description: V(drafter) a mismatch with the drafter's config.json; V(vllm) a value vLLM itself refuses at
        start (C(drafter) then holds what vLLM expects).
      type: str
  sample: [{"field": "mask_token_id", "requested": 248064, "drafter": 248070,
            "explanation": "the drafter fills the positions to draft with the embedding of token 248070; ...",
            "source": "drafter"}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _speculative


def main() -> None:
    module = AnsibleModule(argument_spec=_speculative.argument_spec(), supports_check_mode=True)
    _outcome.exit_with(module, _speculative.run(module.params))


if __name__ == "__main__":
    main()
