"""The vLLM `EngineClient` against our engine on the same tiny Qwen3 (fp32, head_dim 64, which
vLLM's CPU attention takes): greedy agreement, behaviour log-probs, venus's priority preemption
and a weight update mid-run. One vLLM engine serves the module (its start costs a minute on
two cores). Runs in the vLLM venv (`make test-vllm`); skipped where vLLM is not installed."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this venv: `make test-vllm` runs these tests "
                                   "in .venv-vllm (built by `make vllm-venv`)")

import torch  # noqa: E402

from venusrl.engine.config import EngineConfig  # noqa: E402
from venusrl.engine.engine import Engine  # noqa: E402
from venusrl.engine.vllm.backend import VLLMEngine  # noqa: E402
from venusrl.model.checkpoint import load_model  # noqa: E402
from venusrl.model.tiny import make_tiny_model  # noqa: E402
from venusrl.types import Priority, SamplingParams  # noqa: E402

BATCH = 4  # vLLM's max_num_seqs: the priority test fills it with LOW requests
NO_STOP = (-1,)  # a stop id no model samples: every request runs to max_new_tokens
# A weight update lands while the request runs: it is sent at 8 tokens and takes effect within a
# few steps (the weights file is a few MB), far fewer than the 190 tokens left.
UPDATE_RUN_TOKENS = 200


def _tiny(path, seed):
    return make_tiny_model(path, layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, seed=seed)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    model_dir, other_dir = _tiny(root / "model", seed=0), _tiny(root / "other", seed=1)
    runner = asyncio.Runner()
    config = EngineConfig(kv_capacity_tokens=8192, max_running_requests=BATCH, max_prefill_tokens=2048, page_size=32,
                          vllm_kv_connector="none")

    async def start():
        return VLLMEngine.start(model_dir, config)

    engine = runner.run(start())
    try:
        yield runner, engine, load_model(model_dir), load_model(other_dir)
    finally:
        runner.run(engine.shutdown())
        runner.close()


def _prompts(count, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, length), generator=g).tolist()


def _ours(model, prompts, max_new_tokens):
    """Our engine's greedy outputs (the reference)."""
    engine = Engine(model, EngineConfig(kv_capacity_tokens=8192, max_running_requests=len(prompts)))
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0, stop_token_ids=NO_STOP)
    return [o.output_ids for o in engine.generate(prompts, params)]


async def _collect(engine, prompt, params, priority, log=None, name=None, trajectory_id=None):
    last = None
    async for out in engine.generate(prompt, params, priority, trajectory_id):
        if log is not None and out.new_token_ids:
            log.append((name, len(out.output_ids)))
        last = out
    return last


def _low_request(engine, prompt, params, name, log, started=None):
    """A LOW request of trajectory `name` as a task; logs (name, tokens so far) per output and
    sets `started` once it has produced two tokens (it is running)."""

    async def run():
        last = None
        async for out in engine.generate(prompt, params, Priority.LOW, trajectory_id=name):
            if out.new_token_ids:
                log.append((name, len(out.output_ids)))
            if started is not None and len(out.output_ids) >= 2:
                started.set()
            last = out
        return last

    return asyncio.create_task(run())


async def _fill_batch_and_queue(engine, prompts, params, log):
    """BATCH LOW requests running (each has produced tokens), then one more queued in vLLM
    (vLLM reports it waiting); their tasks, the queued one last."""
    started = [asyncio.Event() for _ in range(BATCH)]
    tasks = [_low_request(engine, prompts[i], params, f"low{i}", log, started[i]) for i in range(BATCH)]
    for event in started:
        await event.wait()
    tasks.append(_low_request(engine, prompts[BATCH], params, f"low{BATCH}", log))
    while (await engine.stats()).waiting < 1:  # each engine step refreshes the stats
        await asyncio.sleep(0)
    return tasks


async def _update_mid_run(engine, prompt, params, weights, version):
    """A HIGH request that gets `weights` (as `version`) once it has 8 tokens; its output."""
    seen, last = asyncio.Event(), None

    async def consume():
        nonlocal last
        async for out in engine.generate(prompt, params, Priority.HIGH):
            if len(out.output_ids) >= 8:
                seen.set()
            last = out

    task = asyncio.create_task(consume())
    await seen.wait()
    await engine.update_weights(weights, version)
    await task
    return last


def test_greedy_agrees_with_our_engine(setup):
    runner, engine, ours, _ = setup
    prompts = _prompts(16, 32)
    params = SamplingParams(max_new_tokens=64, temperature=0, stop_token_ids=NO_STOP)

    async def run():
        return await asyncio.gather(*(_collect(engine, p, params, Priority.LOW) for p in prompts))

    outputs = runner.run(run())
    reference = _ours(ours, prompts, 64)
    same = [o.output_ids == r for o, r in zip(outputs, reference, strict=True)]
    first_diff = [next((i for i, (a, b) in enumerate(zip(o.output_ids, r, strict=True)) if a != b), None)
                  for o, r in zip(outputs, reference, strict=True)]
    assert sum(same) >= 15, f"{sum(same)}/16 identical; first differing positions {first_diff}"
    assert all(len(o.output_ids) == 64 and o.finish_reason == "length" for o in outputs)
    assert all(o.weight_versions == [0] * 64 for o in outputs)
    assert all(lp <= 0 for o in outputs for lp in o.logprobs)


def test_logprobs_are_under_the_rollout_temperature(setup):
    """A sampled request's log-probs equal our model's log_softmax(logits / T) at the sampled
    tokens (teacher-forced over prompt + output): the behaviour policy the trainer corrects for."""
    runner, engine, ours, _ = setup
    prompt = _prompts(1, 24, seed=3)[0]
    params = SamplingParams(max_new_tokens=24, temperature=0.7, seed=11, stop_token_ids=NO_STOP)
    out = runner.run(_collect(engine, prompt, params, Priority.HIGH))
    ids = torch.tensor([prompt + out.output_ids])
    with torch.no_grad():
        logits = ours(ids).float()[0, len(prompt) - 1:-1]
    expected = torch.log_softmax(logits / 0.7, dim=-1).gather(1, torch.tensor(out.output_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=2e-3), (out.logprobs, expected.tolist())


def test_high_request_preempts_a_low_one_which_resumes_exactly(setup):
    """LOW requests fill the batch and one more waits; a HIGH request arrives: it runs before the
    waiting LOW one, the newest running LOW is preempted (no token while HIGH runs), and it then
    resumes to exactly its uninterrupted greedy output."""
    runner, engine, ours, _ = setup
    low_prompts = _prompts(BATCH + 1, 32, seed=5)
    high_prompt = _prompts(1, 32, seed=6)[0]
    low = SamplingParams(max_new_tokens=64, temperature=0, stop_token_ids=NO_STOP)
    high = SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=NO_STOP)

    async def run():
        before = (await engine.stats()).preemptions
        log: list[tuple[str, int]] = []
        lows = await _fill_batch_and_queue(engine, low_prompts, low, log)
        urgent = await _collect(engine, high_prompt, high, Priority.HIGH, log, "high")
        return log, urgent, await asyncio.gather(*lows), (await engine.stats()).preemptions - before

    log, urgent, lows, preemptions = runner.run(run())
    names = [name for name, _ in log]
    high_first, high_last = names.index("high"), len(names) - 1 - names[::-1].index("high")
    waiting_name, victim = f"low{BATCH}", f"low{BATCH - 1}"
    assert high_first < names.index(waiting_name), "the HIGH request ran before the waiting LOW one"
    during_high = names[high_first:high_last + 1]
    assert victim not in during_high, f"the newest LOW request was not preempted: {during_high}"
    assert all(f"low{i}" in during_high for i in range(BATCH - 1)), "the other LOW requests ran on"
    assert preemptions >= 1
    reference = _ours(ours, low_prompts + [high_prompt], 64)
    assert [o.output_ids for o in lows] == reference[:BATCH + 1]
    assert urgent.output_ids == reference[BATCH + 1][:8]


def test_weight_update_mid_run(setup):
    """Tokens after the update carry the new version and are the new weights' greedy
    continuation of prompt + the tokens before it; restoring the old weights restores the old
    outputs."""
    runner, engine, ours, other = setup
    prompt = _prompts(1, 32, seed=7)[0]
    params = SamplingParams(max_new_tokens=UPDATE_RUN_TOKENS, temperature=0, stop_token_ids=NO_STOP)

    async def run():
        base = (await engine.health()).weight_version  # the engine serves `ours` at it
        last = await _update_mid_run(engine, prompt, params, other.state_dict(), base + 1)
        await engine.update_weights(ours.state_dict(), base + 2)
        restored = await _collect(engine, prompt, params, Priority.HIGH)
        return base, last, restored, await engine.health()

    base, out, restored, health = runner.run(run())
    switch = out.weight_versions.index(base + 1)
    assert switch >= 8 and out.weight_versions == [base] * switch + [base + 1] * (UPDATE_RUN_TOKENS - switch)
    old = _ours(ours, [prompt], UPDATE_RUN_TOKENS)[0]
    assert out.output_ids[:switch] == old[:switch]
    assert out.output_ids[switch:] == _ours(other, [prompt + out.output_ids[:switch]], UPDATE_RUN_TOKENS - switch)[0]
    assert restored.output_ids == old and restored.weight_versions == [base + 2] * UPDATE_RUN_TOKENS
    assert health.alive and health.weight_version == base + 2


def test_resume_after_abort_hits_the_prefix_cache(setup):
    """A request left early keeps its computed KV in vLLM's prefix cache: the continuation
    (prompt + the partial output) finds every full block of it cached, and the resumed output
    equals the uninterrupted greedy one."""
    runner, engine, ours, _ = setup
    prompt = _prompts(1, 40, seed=8)[0]
    params = SamplingParams(max_new_tokens=40, temperature=0, stop_token_ids=NO_STOP)

    async def run():
        partial = None
        async for out in engine.generate(prompt, params, Priority.HIGH):
            partial = out
            if len(out.output_ids) >= 30:
                break  # leaving the stream aborts the request
        before = await engine.stats()
        rest = SamplingParams(max_new_tokens=40 - len(partial.output_ids), temperature=0, stop_token_ids=NO_STOP)
        resumed = await _collect(engine, prompt + partial.output_ids, rest, Priority.HIGH)
        return partial, resumed, before, await engine.stats()

    partial, resumed, before, after = runner.run(run())
    context = len(prompt) + len(partial.output_ids)
    assert after.cached_tokens - before.cached_tokens >= context // 32 * 32  # every full block of it
    assert partial.output_ids + resumed.output_ids == _ours(ours, [prompt], 40)[0]


def test_set_priority_moves_a_waiting_request_ahead(setup):
    """A LOW request waiting at a full batch, raised to HIGH by `set_priority`, is re-issued at
    HIGH (vLLM cannot change a queued request's priority) and preempts a running LOW one; its
    output is its greedy output."""
    runner, engine, ours, _ = setup
    prompts = _prompts(BATCH + 1, 32, seed=9)
    params = SamplingParams(max_new_tokens=48, temperature=0, stop_token_ids=NO_STOP)

    async def run():
        log: list[tuple[str, int]] = []
        tasks = await _fill_batch_and_queue(engine, prompts, params, log)
        engine.set_priority(f"low{BATCH}", Priority.HIGH)
        return log, await asyncio.gather(*tasks)

    log, outputs = runner.run(run())
    names = [name for name, _ in log]
    raised = names.index(f"low{BATCH}")
    finished_before = {n for n, count in log[:raised] if count == 48}
    assert not finished_before, "it ran before any LOW request finished: it preempted one"
    assert [o.output_ids for o in outputs] == _ours(ours, prompts, 48)


def test_keep_kv_after_weight_update_is_refused(setup):
    """`kv_after_weight_update: keep` on vLLM gave, at times, a first token after the switch equal
    to neither the old weights' nor the new ones' (vLLM pausing with mode "keep"): refused before
    vLLM starts, naming the field."""
    config = EngineConfig(page_size=32, kv_after_weight_update="keep")
    with pytest.raises(ValueError, match="engine.kv_after_weight_update: only recompute"):
        VLLMEngine.start(setup[1].llm.model_config.model, config)


def test_every_step_vllm_runs_is_logged_with_its_shape_and_time(setup):
    """The step log comes from vLLM's own timed iterations: each request's prompt is prefill
    (no prefix of these prompts is cached), each token after its first is one decode sequence,
    every step took time, and the KV in use held the prompts and never exceeded the capacity,
    which is the config's."""
    runner, engine, _, _ = setup
    prompts = _prompts(BATCH, 40, seed=12)
    params = SamplingParams(max_new_tokens=16, temperature=0, stop_token_ids=NO_STOP)

    async def run():
        start = (await engine.steps_since(0)).next_index
        await asyncio.gather(*(_collect(engine, p, params, Priority.LOW) for p in prompts))
        return await engine.steps_since(start)

    steps = runner.run(run()).samples
    assert engine.kv_capacity_tokens == 8192
    assert sum(s.prefill_tokens for s in steps) == BATCH * 40
    assert sum(s.decode_seqs for s in steps) == BATCH * 15  # the first token is sampled by the prefill step
    assert all(s.seconds > 0 for s in steps), [s.seconds for s in steps]
    # KV in use after each step: the last step's requests have finished and freed theirs
    kv = [s.kv_tokens for s in steps]
    assert all(0 <= k <= engine.kv_capacity_tokens for k in kv) and max(kv) >= BATCH * 40, kv
    assert [s.ended_s for s in steps] == sorted(s.ended_s for s in steps)


def test_without_a_kv_connector_a_moved_turn_recomputes_and_says_so(setup, caplog):
    """With no KV connector (`engine.vllm_kv_connector: none`, or auto where NIXL is not
    installed) no KV leaves the engine: a move returns 0 tokens (the target recomputes the
    prefix), and the engine says why once, at INFO."""
    runner, engine, _, _ = setup
    context = _prompts(1, 100, seed=11)[0]
    with caplog.at_level("INFO", logger="venusrl.engine.vllm.backend"):
        moved = [runner.run(engine.send_prefix(context, engine, "moved")) for _ in range(2)]
    assert moved == [0, 0]
    said = [r.getMessage() for r in caplog.records if "recompute their prefix" in r.getMessage()]
    assert said == ["moved turns recompute their prefix on the target engine: no KV connector "
                    "(none: engine.vllm_kv_connector is none)"]

