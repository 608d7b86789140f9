"""tests/gpu/gpucheck/outcomes.py: which of the check's processes check_gpus names and reset_gpus signals, from the
modules' results (gpu_wait and gpu_kill, shapes of their RETURN docs)."""

from gpucheck import outcomes

OURS = {"inherited_child": 611, "nvml_only": 445, "torch_available": 446, "nvidia_smi": 448}


def test_check_gpus_names_holders_left_alone_and_suspects_of_one_gpu():
    result = {
        "gpus": [
            {
                "index": 0,
                "holders": [{"pid": 611}, {"pid": 7000}],
                "left_alone": [{"pid": 448, "reason": "protected GPU daemon (nvidia-smi)"}],
                "suspects": [445],
            },
            {"index": 1, "holders": [{"pid": 446}], "left_alone": [], "suspects": []},
        ]
    }
    assert outcomes.named_by_check(result, 0) == {"holders": [611, 7000], "left_alone": [448], "suspects": [445]}
    assert outcomes.named_by_check(result, 1)["holders"] == [446]
    assert outcomes.named_by_check({}, 0) == {"holders": [], "left_alone": [], "suspects": []}
    assert outcomes.names_of([611, 7000], OURS) == ["PID 7000", "inherited_child"]


def test_reset_gpus_signalled_or_would_signal():
    assert outcomes.signalled_by_reset({"signalled": [{"pid": 611, "signals": ["SIGTERM"]}]}) == [611]
    assert outcomes.signalled_by_reset({"would_signal": [{"pid": 611}, {"pid": 445}], "signalled": []}) == [445, 611]
    assert outcomes.signalled_by_reset({}) == []


def test_exactly_the_targets_of_ours_others_do_not_count():
    assert outcomes.exactly([611, 7000], ["inherited_child"], OURS) == (True, ["inherited_child"])
    assert outcomes.exactly([611, 445], ["inherited_child"], OURS) == (False, ["inherited_child", "nvml_only"])
    assert outcomes.exactly([], ["inherited_child"], OURS) == (False, [])
    assert outcomes.exactly([], [], OURS) == (True, [])
