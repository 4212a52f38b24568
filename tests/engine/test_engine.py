"""The engine's greedy output equals the model layer's (and so transformers'), whatever the
scheduler did on the way: prefix reuse, chunked prefill, retraction, abort and resume,
export and import into another engine, weight updates."""

import pytest
import torch

from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.model.checkpoint import load_model
from venusrl.model.generate import generate
from venusrl.types import Priority, SamplingParams

GREEDY = SamplingParams(max_new_tokens=24, temperature=0, stop_token_ids=(-1,))


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_model(tiny_model_dir)


def reference(model, prompt, params=GREEDY):
    return generate(model, prompt, params).token_ids


def prompts(n, length=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (length + 7 * i,), generator=g).tolist() for i in range(n)]


def test_batched_greedy_equals_reference(model):
    engine = Engine(model, EngineConfig(kv_capacity_tokens=4096, page_size=4))
    batch = prompts(6)
    for prompt, out in zip(batch, engine.generate(batch, GREEDY), strict=True):
        assert out.output_ids == reference(model, prompt)
        assert out.finish_reason == "length" and len(out.logprobs) == 24


def test_prefix_reuse_is_a_cache_hit_with_the_same_output(model):
    engine = Engine(model, EngineConfig(kv_capacity_tokens=4096, page_size=4))
    first = prompts(1, length=64)[0]
    out = engine.generate([first], GREEDY)[0]
    follow_up = first + out.output_ids + [5, 6, 7, 8, 9]
    cached_before = engine.stats()["cached_tokens"]
    again = engine.generate([follow_up], GREEDY)[0]
    assert engine.stats()["cached_tokens"] - cached_before >= 64
    assert again.output_ids == reference(model, follow_up)


def test_chunked_prefill(model):
    engine = Engine(model, EngineConfig(kv_capacity_tokens=4096, page_size=4, chunked_prefill_size=16,
                                        max_prefill_tokens=16))
    long_prompt = prompts(1, length=150, seed=3)[0]
    assert engine.generate([long_prompt], GREEDY)[0].output_ids == reference(model, long_prompt)


def test_retraction_under_a_tight_kv_pool_keeps_outputs(model):
    engine = Engine(model, EngineConfig(kv_capacity_tokens=256, page_size=4, max_running_requests=8))
    batch = prompts(6, length=20, seed=5)
    params = SamplingParams(max_new_tokens=40, temperature=0, stop_token_ids=(-1,))
    outs = engine.generate(batch, params)
    assert engine.stats()["retractions"] > 0, "the pool was meant to be too small for all six"
    for prompt, out in zip(batch, outs, strict=True):
        assert out.output_ids == reference(model, prompt, params)
    engine.scheduler.check_integrity()


def converse_through_a_small_pool(model, host_kv_capacity_tokens):
    """Three conversations through a pool that holds about one: each turn evicts the others'
    KV. Every output is checked against the model layer; returns the engine's stats."""
    engine = Engine(model, EngineConfig(kv_capacity_tokens=128, host_kv_capacity_tokens=host_kv_capacity_tokens,
                                        page_size=4))
    params = SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=(-1,))
    contexts = prompts(3, length=40, seed=11)
    for turn in range(3):
        for i, context in enumerate(contexts):
            request_id = engine.add_request(context, params, trajectory_id=f"conversation-{i}")
            out = engine.run_to_completion()[request_id]
            assert out.output_ids == reference(model, context, params), f"turn {turn}, conversation {i}"
            contexts[i] = context + out.output_ids + [turn + 1, 2, 3]
    engine.scheduler.check_integrity()
    return engine.stats()


def test_kv_evicted_to_the_host_tier_loads_back_with_the_same_output(model):
    device_only = converse_through_a_small_pool(model, 0)
    with_host = converse_through_a_small_pool(model, 1024)
    assert device_only["recomputed_tokens"] > 0
    assert with_host["host_saved_tokens"] > 0 and with_host["host_loaded_tokens"] > 0
    assert with_host["recomputed_tokens"] < device_only["recomputed_tokens"]


def test_abort_returns_partial_output_and_resume_continues_it(model):
    engine = Engine(model, EngineConfig(kv_capacity_tokens=4096, page_size=4))
    prompt = prompts(1, length=40, seed=7)[0]
    request_id = engine.add_request(prompt, GREEDY, trajectory_id="t1")
    for _ in range(8):
        engine.step()
    partial = engine.abort(request_id)
    assert partial.finished and partial.finish_reason == "abort" and 0 < len(partial.output_ids) < 24
    cached_before = engine.stats()["cached_tokens"]
    rest = SamplingParams(max_new_tokens=24 - len(partial.output_ids), temperature=0, stop_token_ids=(-1,))
    resumed = engine.generate([prompt + partial.output_ids], rest)[0]
    assert partial.output_ids + resumed.output_ids == reference(model, prompt)
    assert engine.stats()["cached_tokens"] - cached_before >= 40


def test_stop_token_and_stop_string(tiny_model_dir, model):
    engine = Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=4096, page_size=4))
    prompt = prompts(1, seed=9)[0]
    expected = reference(model, prompt)
    stop_token = expected[5]
    out = engine.generate([prompt], SamplingParams(max_new_tokens=24, temperature=0, stop_token_ids=(stop_token,)))[0]
    assert out.finish_reason == "stop" and out.output_ids == expected[: expected.index(stop_token) + 1]
    text = engine.tokenizer.decode(expected[:10])
    stop_string = text[-3:]
    out = engine.generate([prompt], SamplingParams(max_new_tokens=24, temperature=0, stop_token_ids=(-1,),
                                                   stop=(stop_string,)))[0]
    assert out.finish_reason == "stop" and stop_string in engine.tokenizer.decode(out.output_ids)
    assert len(out.output_ids) <= 10


def test_weight_update_applies_at_a_boundary_and_versions_each_token(tiny_model_dir, model):
    engine = Engine(load_model(tiny_model_dir), EngineConfig(kv_capacity_tokens=4096, page_size=4))
    new_model = load_model(tiny_model_dir)
    with torch.no_grad():
        for p in new_model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    prompt = prompts(1, seed=11)[0]
    request_id = engine.add_request(prompt, GREEDY)
    for _ in range(5):
        engine.step()
    engine.update_weights(new_model.state_dict(), version=1)
    done = engine.run_to_completion()[request_id]
    assert done.weight_versions[:4] == [0] * 4 and done.weight_versions[-1] == 1
    assert engine.generate([prompt], GREEDY)[0].output_ids == reference(new_model, prompt)


def test_sampled_requests_with_a_seed_are_reproducible(model):
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=123, stop_token_ids=(-1,))
    first = Engine(model, EngineConfig(kv_capacity_tokens=4096)).generate(prompts(2), params)
    second = Engine(model, EngineConfig(kv_capacity_tokens=4096)).generate(prompts(2), params)
    assert [o.output_ids for o in first] == [o.output_ids for o in second]


@pytest.mark.parametrize(
    ("prompt", "message"),
    [([], "empty prompt"), ([1, 2, 100000], "outside the vocabulary"), (list(range(200)) * 30, "exceeds the KV pool")],
)
def test_bad_prompts_are_rejected_before_they_run(model, prompt, message):
    engine = Engine(model, EngineConfig(kv_capacity_tokens=1024))
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, GREEDY)
    assert not engine.has_work


def test_bad_weight_updates_are_refused_whole_and_change_nothing(tiny_model_dir, model):
    """A bad update fails at its call, naming the tensor, before any tensor is copied: the
    engine keeps its weights (same greedy tokens) and its version."""
    engine = Engine(load_model(tiny_model_dir), EngineConfig(kv_capacity_tokens=1024))
    prompt = prompts(1, seed=21)[0]
    before = engine.generate([prompt], GREEDY)[0].output_ids
    state = {k: v + 0.5 for k, v in model.state_dict().items()}  # every tensor copied first would show
    with pytest.raises(ValueError, match="not newer"):
        engine.update_weights(state, version=0)
    broken = dict(state)
    broken["model.norm.weight"] = torch.ones(3)
    with pytest.raises(ValueError, match="model.norm.weight has shape"):
        engine.update_weights(broken, version=1)
    with pytest.raises(ValueError, match="model.norm.weight has dtype torch.int64"):
        engine.update_weights({**state, "model.norm.weight": state["model.norm.weight"].long()}, version=1)
    partial = {k: v for k, v in state.items() if "layers.1" not in k}
    with pytest.raises(ValueError, match="missing"):
        engine.update_weights(partial, version=2)
    with pytest.raises(ValueError, match="unknown"):
        engine.update_weights({**state, "model.extra.weight": torch.ones(2)}, version=2)
    assert engine.weight_version == 0
    assert engine.generate([prompt], GREEDY)[0].output_ids == before


def test_priority_and_trajectory_api(model):
    engine = Engine(model, EngineConfig(kv_capacity_tokens=4096, page_size=4))
    engine.start_trajectory("a", Priority.HIGH)
    engine.set_priority("a", Priority.LOW)
    out = engine.generate([prompts(1)[0]], GREEDY)[0]
    engine.release_trajectory("a")
    engine.step()
    assert out.finished
    engine.scheduler.check_integrity()


def test_keep_mode_reuses_old_kv_after_a_weight_update(tiny_model_dir, model):
    engine = Engine(load_model(tiny_model_dir), EngineConfig(kv_capacity_tokens=4096, page_size=4,
                                                             kv_after_weight_update="keep"))
    prompt = prompts(1, length=64, seed=12)[0]
    engine.generate([prompt], GREEDY)
    engine.update_weights({k: v + 0.01 for k, v in model.state_dict().items()}, version=1)
    cached_before = engine.stats()["cached_tokens"]
    out = engine.generate([prompt], GREEDY)[0]
    assert engine.stats()["cached_tokens"] - cached_before >= 60
    assert set(out.weight_versions) == {1}


def test_recompute_mode_drops_running_kv_and_finishes_correctly(tiny_model_dir, model):
    engine = Engine(load_model(tiny_model_dir), EngineConfig(kv_capacity_tokens=4096, page_size=4))
    batch = prompts(3, seed=13)
    ids = [engine.add_request(p, GREEDY) for p in batch]
    for _ in range(6):
        engine.step()
    engine.update_weights({k: v.clone() for k, v in model.state_dict().items()}, version=1)
    done = engine.run_to_completion()
    engine.scheduler.check_integrity()
    assert engine.stats()["kv_tokens"]["in_use"] == 0
    for prompt, request_id in zip(batch, ids, strict=True):  # same weights: same tokens after recompute
        assert done[request_id].output_ids == reference(model, prompt)
    # prefilling again with new weights is counted as dropped KV, not as recompute of evicted KV
    # (the live set's thrash gate reads recompute; the vLLM scheduler class counts the same way)
    assert engine.stats()["dropped_at_weight_update_tokens"] > 0 and engine.stats()["recomputed_tokens"] == 0


def test_export_import_into_another_engine(model):
    source = Engine(model, EngineConfig(kv_capacity_tokens=4096, page_size=4))
    target = Engine(model, EngineConfig(kv_capacity_tokens=4096, page_size=4))
    prompt = prompts(1, length=80, seed=14)[0]
    out = source.generate([prompt], GREEDY)[0]
    context = prompt + out.output_ids
    exported, kv = source.export_prefix(context)
    # the last sampled token was never fed back, so its KV does not exist yet
    assert exported == (len(context) - 1) // 4 * 4 and kv.num_tokens == exported
    assert target.import_prefix(context, kv) == exported
    follow_up = context + [1, 2, 3]
    again = target.generate([follow_up], GREEDY)[0]
    assert target.stats()["cached_tokens"] == exported
    assert again.output_ids == reference(model, follow_up)
    target.scheduler.check_integrity()


def test_import_of_a_mismatched_kv_shape_is_rejected(tiny_model_dir, tmp_path, model):
    from venusrl.model.tiny import make_tiny_model

    other = load_model(make_tiny_model(tmp_path / "other", kv_heads=4))
    source = Engine(other, EngineConfig(kv_capacity_tokens=1024, page_size=4))
    target = Engine(model, EngineConfig(kv_capacity_tokens=1024, page_size=4))
    prompt = prompts(1, length=40)[0]
    source.generate([prompt], GREEDY)
    _, kv = source.export_prefix(prompt)
    with pytest.raises(ValueError, match="does not fit pool"):
        target.import_prefix(prompt, kv)
    target.scheduler.check_integrity()


def test_messages_are_rendered_with_the_chat_template(tiny_model_dir, model):
    engine = Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=4096))
    messages = [{"role": "user", "content": "hello"}]
    request_id = engine.add_request(messages, GREEDY)
    out = engine.run_to_completion()[request_id]
    tokenizer = engine.tokenizer
    prompt = tokenizer.encode(tokenizer.render(messages, add_generation_prompt=True))
    assert out.prompt_len == len(prompt) and out.output_ids == reference(model, prompt)
    with pytest.raises(ValueError, match=r"messages\[0\].role"):
        engine.add_request([{"role": "nobody", "content": "x"}], GREEDY)
