"""`venusrl bench weight-push` runs every CPU placement end to end on a tiny shape, pairs each
new transport with today's path, and finds the engines' weights bit-identical to the
trainer's (figures are the benchmark's, not asserted here)."""

import pytest

from venusrl.bench.weight_push import measure_weight_push


def test_every_placement_is_measured_paired_and_delivers_identical_weights(tmp_path):
    result = measure_weight_push("tiny", "cpu", "bfloat16", "float32", repeats=2, workdir=tmp_path,
                                 progress=lambda line: None)
    placements = result["placements"]
    assert list(placements) == ["device_copy", "host_copy", "shared_memory", "socket", "broadcast"]
    assert result["bit_identical"] == {"in_process": True, "engine_process": True}
    assert result["engine_dtype"] == "bfloat16" and result["trainer_dtype"] == "float32"
    for name, against in (("device_copy", "host_copy"), ("shared_memory", "socket"), ("broadcast", "socket")):
        assert placements[name]["speedup"]["against"] == against
        assert len(placements[name]["speedup"]["samples"]) == 2
    assert all(len(p["seconds"]["samples"]) == 2 and p["first_push_s"] > 0 for p in placements.values())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model_shape": "qwen3-70b"}, "model_shape 'qwen3-70b' is not one of"),
    ({"placements": ["carrier_pigeon"]}, "placements \\['carrier_pigeon'\\]"),
    ({"device": "cuda", "placements": ["broadcast"]}, "broadcast over NCCL needs the engine on another GPU"),
    ({"repeats": 0}, "repeats must be at least 1"),
])
def test_bad_arguments_are_refused_before_any_work(kwargs, message):
    with pytest.raises(ValueError, match=message):
        measure_weight_push(**{"model_shape": "tiny", **kwargs})
