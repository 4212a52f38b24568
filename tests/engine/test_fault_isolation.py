"""One request cannot take the engine down: sampling parameters at their extremes stay
finite, a request whose sampling fails inside a step fails alone (its KV freed) while the
batch's other requests finish, a crash inside a step rebuilds the engine and resumes every
in-flight request from its partial output, and an engine past its restarts says it is dead."""

from __future__ import annotations

import asyncio

import pytest
import torch
from fastapi.testclient import TestClient

from venusrl.engine import runner as runner_module
from venusrl.engine.async_engine import AsyncEngine, EngineStopped, RequestFailed
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.server import create_app
from venusrl.model.sampling import as_int64, position_seed, sample
from venusrl.types import Priority, SamplingParams

GREEDY = SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(-1,))
PROMPTS = [list(range(3, 19)), list(range(40, 52)), list(range(70, 90))]


def make_engine(model_dir, **config) -> Engine:
    return Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=512, page_size=4, **config))


def in_use(engine: Engine) -> dict[str, int]:
    kv = engine.stats()["kv_tokens"]
    return {"in_use": kv["in_use"], "low_ref": kv["low_ref"], "high_ref": kv["high_ref"]}


def test_a_vanishing_temperature_is_greedy_not_nan():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    for temperature in (1e-300, 5e-324, 1e-6):
        token, logprob = sample(logits, SamplingParams(temperature=temperature), torch.Generator().manual_seed(1))
        assert token == int(logits.argmax()) and logprob == logprob  # not NaN


def test_a_vanishing_top_p_keeps_the_top_token():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    for top_p in (1e-300, 5e-324, 1e-45):
        token, _ = sample(logits, SamplingParams(top_p=top_p), torch.Generator().manual_seed(1))
        assert token == int(logits.argmax())


def test_extreme_temperature_and_seed_requests_are_served(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    reference = engine.generate([PROMPTS[0]], GREEDY)[0].output_ids
    tiny = SamplingParams(max_new_tokens=6, temperature=1e-300, stop_token_ids=(-1,))
    assert engine.generate([PROMPTS[0]], tiny)[0].output_ids == reference
    draws = {}
    for seed in (2**63, 2**64, 2**200, -(2**70)):
        seeded = SamplingParams(max_new_tokens=6, temperature=1.0, seed=seed, stop_token_ids=(-1,))
        first, again = engine.generate([PROMPTS[1], PROMPTS[1]], seeded)
        assert first.finish_reason == "length" and first.output_ids == again.output_ids  # reproducible
        draws[seed] = first.output_ids
    assert draws[2**64] == engine.generate([PROMPTS[1]], SamplingParams(
        max_new_tokens=6, temperature=1.0, seed=0, stop_token_ids=(-1,)))[0].output_ids  # folded mod 2**64
    assert in_use(engine) == {"in_use": 0, "low_ref": 0, "high_ref": 0}


def _fault_on_seed(monkeypatch, seed: int, after_tokens: int) -> list[int]:
    """Make the logits of the request seeded `seed` NaN at its output token `after_tokens`
    (sampling runs for the whole batch at once: the fault is in that request's row)."""
    real, raised = runner_module.sample_rows, []
    poisoned = as_int64(position_seed(seed, after_tokens))

    def faulty(logits, rows):
        hit = rows.seeds == poisoned
        if not raised and bool(hit.any()):
            raised.append(1)
            logits = logits.masked_fill(hit[:, None], float("nan"))
        return real(logits, rows)

    monkeypatch.setattr(runner_module, "sample_rows", faulty)
    return raised


def test_a_request_whose_sampling_fails_fails_alone(tiny_model_dir, monkeypatch):
    engine = make_engine(tiny_model_dir)
    reference = [o.output_ids for o in engine.generate(PROMPTS, GREEDY)]
    raised = _fault_on_seed(monkeypatch, seed=13, after_tokens=2)
    runner = AsyncEngine(engine)

    async def one(prompt, sampling):
        last = None
        async for last in runner.generate(prompt, sampling):  # noqa: B007 (the final output)
            pass
        return last

    async def scenario():
        faulty = SamplingParams(max_new_tokens=50, temperature=1.0, seed=13, stop_token_ids=(-1,))
        results = await asyncio.gather(one(list(range(100, 140)), faulty), *(one(p, GREEDY) for p in PROMPTS),
                                       return_exceptions=True)
        after = await one(PROMPTS[0], GREEDY)  # the engine serves the next request
        return results, after, await runner.acall(in_use), runner.alive

    try:
        (failed, *others), after, kv, alive = asyncio.run(scenario())
    finally:
        asyncio.run(runner.shutdown())
    assert raised == [1]
    assert isinstance(failed, RequestFailed) and "not finite" in str(failed)
    assert [o.output_ids for o in others] == reference and all(o.finish_reason == "length" for o in others)
    assert after.output_ids == reference[0]
    assert kv == {"in_use": 0, "low_ref": 0, "high_ref": 0}  # the failed request's KV was freed
    assert alive and runner.restarts == 0


def _crash_forward(model, on_calls: set[int] | None):
    """Make the model's forward raise on the given call numbers (None: on every call)."""
    real, calls = model.hidden_states, [0]

    def crashing(*args, **kwargs):
        calls[0] += 1
        if on_calls is None or calls[0] in on_calls:
            raise RuntimeError(f"injected forward fault at call {calls[0]}")
        return real(*args, **kwargs)

    model.hidden_states = crashing


def test_a_crash_inside_a_step_rebuilds_the_engine_and_resumes_every_request(tiny_model_dir):
    reference_engine = make_engine(tiny_model_dir)
    long = SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=(-1,))
    reference = [o for o in reference_engine.generate(PROMPTS, long)]
    engine = make_engine(tiny_model_dir)
    _crash_forward(engine.runner.model, on_calls={5})  # mid-decode: every request has partial output
    runner = AsyncEngine(engine)

    async def one(prompt):
        outputs = [o async for o in runner.generate(prompt, long, trajectory_id=f"t{prompt[0]}")]
        return outputs

    async def scenario():
        return await asyncio.gather(*(one(p) for p in PROMPTS)), runner.alive

    try:
        streams, alive = asyncio.run(scenario())
    finally:
        asyncio.run(runner.shutdown())
    assert runner.restarts == 1 and alive
    for outputs, expected in zip(streams, reference, strict=True):
        final = outputs[-1]
        assert final.finished and final.finish_reason == "length"
        assert final.prompt_len == expected.prompt_len
        assert final.output_ids == expected.output_ids  # resumed from the partial output, nothing lost
        assert len(final.logprobs) == len(final.weight_versions) == 12
        # the consumer saw every token exactly once across the re-issue
        assert [t for o in outputs for t in o.new_token_ids] == final.output_ids
    assert runner.engine is not engine and runner.engine.scheduler.cache.trajectories.keys() >= {"t3", "t40", "t70"}


POISON = 97  # a token the injected fault makes the forward fail on, every time


def test_a_request_the_forward_always_crashes_on_fails_alone(tiny_model_dir):
    """Crash 1: everything re-issued; crash 2 in a row: the batch is held and re-issued one
    request at a time; the crash with the poison as the probe fails it alone. The others
    finish with the tokens they would have had, and the engine stays up."""
    engine = make_engine(tiny_model_dir)
    long = SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=(-1,))
    reference = [o.output_ids for o in engine.generate(PROMPTS, long)]
    model, real = engine.runner.model, engine.runner.model.hidden_states

    def crashing(ids, *args, **kwargs):
        if bool((ids == POISON).any()):
            raise RuntimeError("injected fault: the forward cannot take this input")
        return real(ids, *args, **kwargs)

    model.hidden_states = crashing
    runner = AsyncEngine(engine)

    async def one(prompt):
        last = None
        async for last in runner.generate(prompt, long):  # noqa: B007 (the final output)
            pass
        return last

    async def scenario():
        results = await asyncio.gather(one([POISON, 5, 6, 7]), *(one(p) for p in PROMPTS), return_exceptions=True)
        return results, await one(PROMPTS[1]), runner.alive

    try:
        (poisoned, *others), after, alive = asyncio.run(scenario())
    finally:
        asyncio.run(runner.shutdown())
    assert isinstance(poisoned, RequestFailed) and "crashed on it" in str(poisoned)
    assert [o.output_ids for o in others] == reference
    assert after.output_ids == reference[1] and alive and runner.restarts == 3


def test_a_rebuilt_engine_keeps_trajectories_versions_and_fresh_request_ids(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    old_ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    engine.start_trajectory("kept", Priority.HIGH)
    engine.step()
    engine.set_priority("kept", Priority.PROMOTED)  # queued, not yet applied: carried over too
    engine.start_trajectory("gone", Priority.LOW)
    engine.release_trajectory("gone")
    engine.weight_version = 7
    fresh = engine.rebuilt()
    assert fresh.weight_version == 7 and engine.runner is None  # the old KV pool is let go
    assert fresh.add_request(PROMPTS[0], GREEDY) not in old_ids
    fresh.step()
    assert {k: t.priority for k, t in fresh.scheduler.cache.trajectories.items() if isinstance(k, str)} == {
        "kept": Priority.PROMOTED}


def test_an_engine_past_its_restarts_is_dead_and_health_says_so(tiny_model_dir):
    engine = make_engine(tiny_model_dir, max_restarts=2)
    runner = AsyncEngine(engine)
    app = create_app(runner, engine.tokenizer, "tiny")
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        _crash_forward(engine.runner.model, on_calls=None)

        async def doomed():
            async for _ in runner.generate(PROMPTS[0], GREEDY):
                pass

        with pytest.raises(EngineStopped):
            asyncio.run(doomed())
        assert not runner.alive and runner.restarts == 2
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "dead"
        assert "injected forward fault" in health.json()["error"]
        assert client.get("/stats").status_code == 503
        response = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2})
        assert response.status_code == 503 and response.json()["error"]["type"] == "server_error"


def test_extreme_sampling_over_http_leaves_the_engine_serving(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    runner = AsyncEngine(engine)
    with TestClient(create_app(runner, engine.tokenizer, "tiny")) as client:
        for extreme in ({"temperature": 1e-300}, {"seed": 2**64}, {"seed": 2**63, "temperature": 2.0},
                        {"top_p": 1e-300}, {"top_k": 2**63}, {"temperature": 1e308}):
            response = client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 4, **extreme})
            assert response.status_code in (200, 400), response.text  # refused or served; never a 5xx
        response = client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0})
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
        assert client.get("/health").json()["status"] == "ok"
        assert runner.alive and runner.restarts == 0
    asyncio.run(runner.shutdown())
