"""The simulated vLLM as each release it models (SIMVLLM_VERSION; simvllm/facts.py): its version string and package
metadata (simvllm.install), its speculative-config fields and methods, its defaults. Run outside a node."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SIM_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SIM_DIR))

from simvllm import cli, engine, facts  # noqa: E402
from simvllm.install import install  # noqa: E402
from simvllm.specdecode import SpeculativeConfigError, SpeculativeDecoding  # noqa: E402

V32, V33, V34 = ({"SIMVLLM_VERSION": version} for version in ("0.32.0", "0.33.0", "0.34.0"))
DRAFTER_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "block_size": 16,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "sliding_window": 2048,
    "num_hidden_layers": 5,
}


@pytest.fixture
def drafter(tmp_path):
    directory = tmp_path / "dflash-drafter"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(DRAFTER_CONFIG))
    return str(directory)


def start_error(config, environ, max_num_batched_tokens=None):
    with pytest.raises(SpeculativeConfigError) as caught:
        SpeculativeDecoding.from_config(config, environ, max_num_batched_tokens)
    return str(caught.value)


# ---------------------------------------------------------------- the release modelled


def test_an_installation_is_its_release_whatever_the_environment_says(tmp_path):
    executable = install(str(tmp_path / "vllm-0.34"), "0.34.0")
    env = dict(os.environ, SIMVLLM_VERSION="0.33.0")
    done = subprocess.run([executable, "--version"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, "0.34.0\n"), done
    metadata = list((tmp_path / "vllm-0.34" / "lib").glob("python3*/site-packages/vllm-0.34.0.dist-info/METADATA"))
    assert len(metadata) == 1 and "\nName: vllm\nVersion: 0.34.0\n" in metadata[0].read_text()


@pytest.mark.parametrize(
    "text, version, release",
    [
        (None, "0.33.0", "0.33.0"),
        ("0.32.0", "0.32.0", "0.32.0"),
        ("0.33.1", "0.33.1", "0.33.0"),
        ("0.35.0", "0.35.0", "0.34.0"),
        ("0.26", "0.26", "0.32.0"),
        ("x", "0.33.0", "0.33.0"),
    ],
)
def test_the_version_knob(text, version, release):
    environ = {} if text is None else {"SIMVLLM_VERSION": text}
    assert (facts.version(environ), facts.release(environ)) == (version, release)
    assert facts.is_legacy(environ) is (text == "0.26")


def test_gpu_memory_utilization_defaults(monkeypatch):
    """0.32 and 0.33: 0.92; 0.34: None, the extensible KV cache, which takes what is free at start."""
    seen = {}
    monkeypatch.setattr("simvllm.api_server.run_api_server", lambda args: seen.setdefault("u", args) and 0)
    for environ, default in ((V32, 0.92), (V33, 0.92), (V34, None), ({"SIMVLLM_VERSION": "0.26"}, 0.9)):
        monkeypatch.setattr(os, "environ", dict(os.environ, **environ))
        seen.clear()
        assert cli.main(["serve", "/models/m"]) == 0
        assert seen["u"].gpu_memory_utilization == default, environ

    class Gpus:
        memory_total_mib = 1000

        def free_mib(self, index):
            return 640

    config = {"gpu_memory_utilization": None, "gpu_index": 0}
    assert engine._utilization(Gpus(), config, None) == 0.64
    assert engine._utilization(Gpus(), dict(config, gpu_memory_utilization=0.5), None) == 0.5


# ---------------------------------------------------------------- speculative configs per release


def test_fields_each_release_has():
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    for environ in (V32, V33):
        SpeculativeDecoding.from_config(dict(spec, disable_padded_drafter_batch=True), environ)
    message = start_error(dict(spec, disable_padded_drafter_batch=True), V34)
    assert "disable_padded_drafter_batch\n  Extra inputs are not permitted" in message
    SpeculativeDecoding.from_config(dict(spec, suffix_decoding_corpus_tokens=0), V34)
    assert "Extra inputs are not permitted" in start_error(dict(spec, suffix_decoding_corpus_tokens=0), V33)
    assert "Extra inputs are not permitted" in start_error(dict(spec, xpress_topc=1), V32)


def test_custom_method_is_set_by_vllm_0_34_itself():
    spec = {"method": "ngram", "num_speculative_tokens": 4, "custom_method": "mine"}
    assert "custom_method\n  Unexpected keyword argument" in start_error(spec, V34)
    assert "custom_method\n  Extra inputs are not permitted" in start_error(spec, V33)


def test_a_method_a_plugin_registers_runs_on_0_34_only():
    spec = {"method": "my_drafter", "num_speculative_tokens": 4}
    assert start_error(spec, V34) == "Unsupported speculative method: 'my_drafter'"
    plugin = dict(V34, SIMVLLM_SPECULATIVE_PLUGINS="my_drafter=ngram")
    assert SpeculativeDecoding.from_config(spec, plugin).method == "ngram"
    assert "type=literal_error, input_value='my_drafter'" in start_error(spec, dict(plugin, **V33))


def test_methods_each_release_has(tmp_path):
    heads = tmp_path / "medusa"
    heads.mkdir()
    (heads / "config.json").write_text("{}")
    spec = {"method": "medusa", "model": str(heads), "num_speculative_tokens": 3}
    assert SpeculativeDecoding.from_config(spec, V32).method == "medusa"
    assert "literal_error" in start_error(spec, V33)
    custom = {"method": "custom_class", "num_speculative_tokens": 3}
    assert SpeculativeDecoding.from_config(custom, V33).method == "custom_class"
    assert "Unsupported speculative method: 'custom_class'" in start_error(custom, V34)
    mtp = {"method": "nemotron3_5_transcribe_mtp", "model": str(heads), "num_speculative_tokens": 1}
    assert SpeculativeDecoding.from_config(mtp, V34).method == "mtp"
    assert "literal_error" in start_error(mtp, V33)


def test_0_34_has_no_v1_model_runner(drafter):
    spec = {"method": "dflash", "model": drafter, "num_speculative_tokens": 15}
    v1 = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert "Model Runner V1 does not support: mixed sliding/full dflash drafts" in start_error(spec, dict(V33, **v1))
    assert SpeculativeDecoding.from_config(spec, dict(V34, **v1)).drafter_agrees


def test_the_token_budget_each_release_checks(drafter):
    spec = {"method": "dflash", "model": drafter, "num_speculative_tokens": 15}
    assert "max_num_batched_tokens=16 and num_lookahead_tokens=16" in start_error(spec, V33, 16)
    assert "max_num_batched_tokens=16 and num_lookahead_tokens=16" in start_error(spec, V34, 16)
    assert SpeculativeDecoding.from_config(spec, V32, 16).drafter_agrees
    assert "max_num_batched_tokens=15 and scheduled_token_delta=15" in start_error(spec, V32, 15)
