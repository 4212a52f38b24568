"""The rollout worker drives the real coordinator, engine and calculator environment."""

import asyncio

import pytest

from venusrl.coordinator.config import CoordinatorConfig
from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.env.base import StepResult
from venusrl.env.calculator import CalculatorEnv, generate_dataset
from venusrl.rollout.config import RolloutConfig
from venusrl.rollout.worker import RolloutWorker
from venusrl.types import Prompt, TrajectoryStatus


def prompts(count):
    return [Prompt(id=row["id"], messages=({"role": "user", "content": row["question"]},), metadata=row)
            for row in generate_dataset(count, seed=5)]


def one_slot_worker(engine, async_engine, priority_of):
    """A worker with one generation slot whose trajectories 1 and 2, both on the one engine,
    have the priorities `priority_of(trajectory_id)` gives: the tests drive turns directly."""
    coordinator = DataCoordinator(CoordinatorConfig(group_size=1, batch_groups=1), prompts(1))
    worker = RolloutWorker(coordinator, async_engine, engine.tokenizer, CalculatorEnv, RolloutConfig(), slots=1)
    worker.core.declared_priority = lambda trajectory_id, policy=None: priority_of(trajectory_id)
    worker.core.place(1), worker.core.place(2)
    return worker


@pytest.mark.parametrize("mode", ["priority", "action_level", "trajectory_level"])
def test_groups_come_out_complete_in_every_mode(tiny_model_dir, mode, monkeypatch):
    from venusrl.rollout import worker as worker_module

    rollouts = {}  # trajectory id -> the agent loop's record
    real_loop = worker_module.run_agent_loop

    async def recorded(*args, **kwargs):
        rollout = await real_loop(*args, **kwargs)
        rollouts[int(rollout.trajectory_id)] = rollout
        return rollout

    monkeypatch.setattr(worker_module, "run_agent_loop", recorded)
    engine = Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=16384, page_size=1))
    coordinator = DataCoordinator(CoordinatorConfig(group_size=2, batch_groups=2, async_factor=1.5), prompts(6))
    config = RolloutConfig(max_turns=2, max_new_tokens_per_turn=24, temperature=1.0)

    async def main():
        async_engine = AsyncEngine(engine)
        try:
            worker = RolloutWorker(coordinator, async_engine, engine.tokenizer, CalculatorEnv, config,
                                   slots=2, mode=mode)
            return await worker.run(groups=2)
        finally:
            await async_engine.shutdown()

    ready = asyncio.run(main())
    assert len(ready) >= 2
    for group in ready:
        assert len(group.trajectories) == 2
        for t in group.trajectories:
            assert t.status is TrajectoryStatus.DONE and t.reward in (0.0, 1.0)
            assert len(t.token_ids) == len(t.generated_mask) == len(t.logprobs)
            assert sum(t.generated_mask) == t.generated_tokens > 0
            assert all(lp < 0 for lp, m in zip(t.logprobs, t.generated_mask, strict=True) if m)
            assert [turn.weight_version for turn in t.turns] == [0] * len(t.turns)
            # one record from rollout to loss: the trainer reads the agent loop's lists
            assert t.token_ids is rollouts[t.id].token_ids and t.logprobs is rollouts[t.id].logprobs
            assert t.generated_mask == [bool(m) for m in rollouts[t.id].generated_mask]
    assert coordinator.in_flight <= 3  # ceil(1.5 x 2)


def test_high_preempts_low_and_low_resumes_to_the_same_tokens(tiny_model_dir):
    """One slot: a HIGH turn arriving while a LOW turn generates takes the slot; the LOW turn
    keeps its tokens, resumes after, and ends with exactly the uninterrupted greedy output."""
    from venusrl.model.generate import generate
    from venusrl.types import Priority, SamplingParams

    engine = Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=16384, page_size=1))
    low_prompt, high_prompt = list(range(10, 70)), list(range(100, 140))
    long = SamplingParams(max_new_tokens=400, temperature=0, stop_token_ids=(-1,))
    short = SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=(-1,))

    async def main():
        async_engine = AsyncEngine(engine)
        low_generating = asyncio.Event()  # the LOW turn has tokens out of the engine
        generate = async_engine.generate

        async def observed(prompt_ids, sampling, priority=None, trajectory_id=None):
            stream = generate(prompt_ids, sampling, priority, trajectory_id)
            try:
                async for output in stream:
                    if trajectory_id == "1" and len(output.output_ids) >= 8:
                        low_generating.set()
                    yield output
            finally:
                await stream.aclose()

        async_engine.generate = observed
        try:
            worker = one_slot_worker(engine, async_engine, lambda t: Priority.LOW if t == 1 else Priority.HIGH)
            low = asyncio.create_task(worker._generate(low_prompt, long, "1"))
            await low_generating.wait()
            high = await worker._generate(high_prompt, short, "2")
            return await low, high, worker
        finally:
            await async_engine.shutdown()

    low, high, worker = asyncio.run(main())
    assert low.preemptions == 1 and worker.preemptions == 1
    assert low.output_ids == generate(engine.runner.model, low_prompt, long).token_ids
    assert high.output_ids == generate(engine.runner.model, high_prompt, short).token_ids
    assert len(low.logprobs) == len(low.output_ids) == 400
    assert engine.stats()["cached_tokens"] > 0, "the resume reuses the preempted turn's KV"


@pytest.mark.parametrize("work_conservation", [True, False])
def test_a_high_holder_the_engine_demoted_and_a_high_turn_behind_it_both_finish(tiny_model_dir, work_conservation):
    """Both trajectories are HIGH; B's first turn left 158 tokens of KV cached, so A's growing
    context pushes HIGH demand past the 200-token pool and the engine demotes A (shorter
    context first). Neither may wait on the other for good: B's next turn takes the slot if it
    asks while A is demoted (`RolloutCore.wants_demoted`); with work conservation A, alone in
    the engine, grows into B's KV rather than idle (`admission.Step.eviction_tier`), without
    it (venus's engines) A waits for B's turn and B's release. Which comes first is timing;
    either way both finish and A ends with the uninterrupted greedy output."""
    from venusrl.model.generate import generate
    from venusrl.types import Priority, SamplingParams

    engine = Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=200, page_size=1,
                                                                 work_conservation=work_conservation))
    a_prompt, b_prompt = list(range(10, 40)), list(range(100, 250))
    long = SamplingParams(max_new_tokens=160, temperature=0, stop_token_ids=(-1,))
    short = SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=(-1,))

    async def main():
        async_engine = AsyncEngine(engine)
        try:
            worker = one_slot_worker(engine, async_engine, lambda t: Priority.HIGH)
            b_first = await worker._generate(b_prompt, short, "2")
            a = asyncio.create_task(worker._generate(a_prompt, long, "1"))
            # until the engine demotes A (counted in its stats); or A has already finished, on a
            # loaded machine the demotion can come and go between two looks
            while not (a.done() or await async_engine.acall(lambda e: e.scheduler.demoted_trajectories())):
                await asyncio.sleep(0.002)
            b_second = await asyncio.wait_for(
                worker._generate(b_prompt + b_first.output_ids + [1, 2, 3], short, "2"), timeout=120)
            await async_engine.acall(lambda e: e.release_trajectory("2"))  # B ends: A may use its KV
            return await asyncio.wait_for(a, timeout=120), b_second, worker
        finally:
            await async_engine.shutdown()

    a, b_second, worker = asyncio.run(main())
    assert engine.stats()["demotions"] > 0
    assert a.preemptions == worker.preemptions <= 1
    assert len(b_second.output_ids) == 8
    assert a.output_ids == generate(engine.runner.model, a_prompt, long).token_ids


class AskingAgainCalculator(CalculatorEnv):
    """A turn without a tool call gets a user's reply instead of ending the episode (a user
    simulator), so a random model's trajectories reach a second turn whatever they sample."""

    continues_without_tool_call = True

    async def respond(self) -> StepResult:
        return StepResult(observations=[{"role": "user", "content": "Use the calculator, please."}])


def test_predictions_reach_the_coordinator_and_finished_trajectories_train_the_predictor(tiny_model_dir):
    from venusrl.coordinator.config import PredictorConfig
    from venusrl.coordinator.predictors import BackgroundPredictor, PredictionQuery, make_predictor

    engine = Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=16384, page_size=1))
    coordinator = DataCoordinator(CoordinatorConfig(group_size=2, batch_groups=2), prompts(4))
    predictor = BackgroundPredictor(make_predictor(PredictorConfig(kind="group_history")))
    queries = []
    submit = predictor.submit
    predictor.submit = lambda query: queries.append(query) or submit(query)

    async def main():
        async_engine = AsyncEngine(engine)
        try:
            worker = RolloutWorker(coordinator, async_engine, engine.tokenizer, AskingAgainCalculator,
                                   RolloutConfig(max_turns=2, max_new_tokens_per_turn=24), slots=2, predictor=predictor)
            await worker.run(groups=2)
            return worker
        finally:
            await async_engine.shutdown()

    try:
        worker = asyncio.run(main())
        assert worker.predictions > 0
        predictor.close()
        assert predictor.errors == 0
        # the finished trajectories were observed: a seen prompt now predicts its own short
        # lengths (at most 48 tokens here), not the 2048-token prior
        seen = PredictionQuery(prompt_id=prompts(1)[0].id, prompt_text="", last_observation="", turns=0,
                               generated_tokens=0, trajectory_id=99)
        assert predictor.predictor.predict(seen) <= 48
        # the live predictor reads the chat: the prompt at the first boundary, then the turns
        # so far and the observation the next turn starts from
        assert all(q.messages and q.messages[0]["role"] in ("system", "user") for q in queries)
        later = [q for q in queries if q.turns > 0]
        assert later, "no trajectory reached a second turn"
        for q in later:
            assert any(m["role"] == "assistant" for m in q.messages)
            assert q.last_observation == q.messages[-1]["content"] and q.messages[-1]["role"] != "assistant"
    finally:
        predictor.close()


def on_two_engines_one_prompt_cached(tiny_model_dir, slots: int, body):
    """A worker of `slots` slots an engine on two engines and two trajectories declared HIGH,
    both placed on engine 0; the first's turn starts from a 100-token prompt, cached on engine 0.
    Runs `await body(worker, first id, second id, prompt)`; returns (worker, engines, first id,
    second id, prompt)."""
    from venusrl.types import Priority, SamplingParams

    engines = [Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=4096, page_size=1)) for _ in range(2)]
    coordinator = DataCoordinator(CoordinatorConfig(group_size=1, batch_groups=2), prompts(2))
    started = coordinator.start(0.0).start
    first, second = started[0].id, started[1].id
    prompt = list(range(30, 130))
    coordinator.on_turn_start(first, 0.0, prompt)
    engines[0].generate([prompt], SamplingParams(max_new_tokens=4, temperature=0, stop_token_ids=(-1,)))

    async def main():
        async_engines = [AsyncEngine(e) for e in engines]
        try:
            worker = RolloutWorker(coordinator, async_engines, engines[0].tokenizer, CalculatorEnv, RolloutConfig(),
                                   slots=slots)
            worker.core.declared_priority = lambda trajectory_id, policy=None: Priority.HIGH
            worker.core.place(second, engine=0), worker.core.place(first, engine=0)
            await body(worker, first, second, prompt)
            return worker
        finally:
            for e in async_engines:
                await e.shutdown()

    return asyncio.run(main()), engines, first, second, prompt


def test_a_waiting_high_turn_moves_to_another_engine_with_its_prefix(tiny_model_dir):
    from venusrl.rollout.core import Grant
    from venusrl.rollout.orchestrator import Move
    from venusrl.types import Priority

    async def body(worker, waiting_id, holder_id, prompt):
        assert worker.core.request_slot(holder_id) == [Grant(holder_id, 0, Priority.HIGH)]
        worker._context[waiting_id] = prompt  # its turn waits to generate from the prompt
        # engine 1 idles while the turn waits on engine 0: the core moves it there
        assert worker.core.request_slot(waiting_id) == [Move(waiting_id, 0, 1)]
        assert waiting_id not in worker.slots[0].waiting
        await worker._move(Move(waiting_id, 0, 1))

    worker, engines, waiting_id, _, prompt = on_two_engines_one_prompt_cached(tiny_model_dir, 1, body)
    assert worker.migrations == 1 and worker.core.engine_of[waiting_id] == 1
    assert waiting_id not in worker.core.moving and worker._grants[waiting_id].is_set()
    cached, _ = engines[1].export_prefix(prompt)
    assert cached == len(prompt), "the target engine holds the moved prefix"


def test_an_urgent_turn_beside_a_longer_one_decodes_on_the_idle_engine_with_its_prefix(tiny_model_dir):
    """Decode balance through the real driver: slots are free on both engines, and a HIGH turn
    asking on engine 0, where a turn of 300 tokens generates, moves to idle engine 1 with its
    cached prefix and holds a slot there (once this turn: it does not move again on landing)."""

    async def body(worker, asking_id, holder_id, prompt):
        worker._context[holder_id] = list(range(300))
        worker.core.request_slot(holder_id)
        worker._context[asking_id] = prompt
        await asyncio.wait_for(worker._acquire(asking_id), timeout=60)

    worker, engines, asking_id, _, prompt = on_two_engines_one_prompt_cached(tiny_model_dir, 2, body)
    assert worker.migrations == 1 and worker.core.engine_of[asking_id] == 1
    assert asking_id in worker.core.slots[1].holders and not worker.core.moving
    assert worker.core.decode_loads == [300, len(prompt)]
    cached, _ = engines[1].export_prefix(prompt)
    assert cached == len(prompt), "the target engine holds the moved prefix"
    worker.core.check_invariants()


def with_a_stolen_waiter(tiny_model_dir, then):
    """A one-slot worker on two engines: trajectory 2 holds engine 0's slot, and trajectory
    1's turn, queued behind it, is stolen at once by idle engine 1 (the core's `Move`); then
    `await then(worker, move)`. Returns the worker and the two engines."""
    from venusrl.types import Priority

    engines = [Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=4096, page_size=1)) for _ in range(2)]
    coordinator = DataCoordinator(CoordinatorConfig(group_size=1, batch_groups=2), prompts(2))

    async def main():
        async_engines = [AsyncEngine(e) for e in engines]
        try:
            worker = RolloutWorker(coordinator, async_engines, engines[0].tokenizer, CalculatorEnv, RolloutConfig(),
                                   slots=1)
            worker.core.declared_priority = lambda trajectory_id, policy=None: Priority.HIGH
            worker.core.place(2, engine=0), worker.core.place(1, engine=0)
            worker.core.request_slot(2)
            worker._context[1] = list(range(30, 80))
            [move] = worker.core.request_slot(1)
            await then(worker, move)
            return worker
        finally:
            for e in async_engines:
                await e.shutdown()

    return asyncio.run(main()), engines


def test_a_turn_stolen_before_it_asks_again_waits_for_its_move_and_asks_on_the_target(tiny_model_dir):
    """A preempted turn is queued on its engine at once; an idle engine can steal it before
    its driver is back in `_acquire` (seen in the rollout bench: the trajectory failed with
    "asks for a slot while it is moving"). The driver waits for the move, then holds a slot
    on the target."""

    async def ask_while_it_moves(worker, move):
        assert 1 in worker.core.moving
        await asyncio.gather(worker._acquire(1), worker._move(move))  # the driver asks first

    worker, _ = with_a_stolen_waiter(tiny_model_dir, ask_while_it_moves)
    assert 1 in worker.core.slots[1].holders and worker.core.engine_of[1] == 1 and not worker.core.moving
    worker.core.check_invariants()


def test_a_turn_stolen_while_its_driver_asks_for_the_demoted_set_waits_for_its_move(tiny_model_dir):
    """A preempted turn waits in the core's queue (here: trajectory 1 behind trajectory 2 on
    engine 0, while trajectory 3 holds engine 1's slot). Its driver, back in `_acquire`, asks
    engine 0 for its demoted set first (the slots are full); while it waits for that answer,
    engine 1 frees its slot and steals the turn. Seen in the rollout bench as a failed
    trajectory ("asks for a slot while it is moving"): the driver now waits for the move and
    holds a slot on the target."""
    from venusrl.types import Priority

    engines = [Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=4096, page_size=1)) for _ in range(2)]
    coordinator = DataCoordinator(CoordinatorConfig(group_size=1, batch_groups=3), prompts(3))

    class FreesTheOtherEngineWhileAsked(AsyncEngine):
        """Engine 0: trajectory 3 releases engine 1's slot while engine 0 answers."""

        async def demoted_trajectories(self):
            worker._act(worker.core.release_slot(3))
            return await super().demoted_trajectories()

    async def main():
        nonlocal worker
        async_engines = [FreesTheOtherEngineWhileAsked(engines[0]), AsyncEngine(engines[1])]
        try:
            worker = RolloutWorker(coordinator, async_engines, engines[0].tokenizer, CalculatorEnv, RolloutConfig(),
                                   slots=1)
            worker.core.declared_priority = lambda trajectory_id, policy=None: Priority.HIGH
            worker.core.place(2, engine=0), worker.core.place(1, engine=0), worker.core.place(3, engine=1)
            worker.core.request_slot(2), worker.core.request_slot(3)
            worker._context[1] = list(range(30, 80))
            assert worker.core.request_slot(1) == [] and 1 in worker.core.slots[0].waiting  # queued, as when preempted
            await worker._acquire(1)
        finally:
            for e in async_engines:
                await e.shutdown()

    worker = None
    asyncio.run(main())
    assert worker.migrations == 1 and worker.core.engine_of[1] == 1 and 1 in worker.core.slots[1].holders
    assert not worker.core.moving
    worker.core.check_invariants()


def test_a_move_whose_trajectory_ended_before_its_copy_began_does_nothing(tiny_model_dir):
    """The core moves a waiter; its task may end (discarded, the round over) before the move's
    copy task runs. Seen in the rollout bench as a KeyError in `_move`: the copy now finds no
    context and leaves both engines as they were."""

    async def end_before_the_copy(worker, move):
        worker._context.pop(1)  # its task ended first (what `_run_trajectory`'s finally does)
        worker.core.finish(1)
        await worker._move(move)

    worker, engines = with_a_stolen_waiter(tiny_model_dir, end_before_the_copy)
    assert worker.migrations == 0 and not worker.core.moving and 1 not in worker.core.engine_of
    assert worker.moves_unlanded == {"ended_before_copy": 1}
    assert engines[1].scheduler.stats().live_trajectories == 0
    worker.core.check_invariants()


@pytest.mark.parametrize("moved", [False, True])
def test_a_turn_preempted_while_its_finished_output_is_on_its_way_ends_once_with_that_output(tiny_model_dir, moved):
    """A LOW turn's request finishes in the engine, and before its task has handled the output
    (the engine thread's hand-over, the stream, `_until_done_or`'s wait) a HIGH turn takes its
    slot: the preemption aborts nothing, but the core queues the turn as a waiter, and an idle
    engine may steal it (`moved`). That output ends the turn, once: the greedy tokens up to its
    stop, no preemption counted and no second request past the stop (before, the turn resumed
    and generated on), and no slot held or awaited for it; a move lands without asking a slot
    and the next turn asks on the target. The preemption (and the steal) is forced as the
    finished output leaves the engine's stream."""
    from venusrl.model.generate import generate
    from venusrl.rollout.core import Grant, Preempt
    from venusrl.types import Priority, SamplingParams

    engines = [Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=4096, page_size=1)) for _ in range(2)]
    prompt = list(range(100, 140))
    greedy = generate(engines[0].runner.model, prompt,
                      SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=(-1,))).token_ids
    stop = greedy[7]
    expected = greedy[: greedy.index(stop) + 1]
    requests = []  # (engine, trajectory) of every engine request

    async def main():
        async_engines = [AsyncEngine(e) for e in engines]
        # the HIGH turn preempts on its own engine (decode balance would move it to the idle one)
        worker = RolloutWorker(DataCoordinator(CoordinatorConfig(group_size=1, batch_groups=1), prompts(1)),
                               async_engines, engines[0].tokenizer, CalculatorEnv, RolloutConfig(decode_balance=False),
                               slots=1)
        worker.core.declared_priority = lambda trajectory_id, policy=None: Priority.LOW if trajectory_id == 1 else Priority.HIGH
        worker.core.place(1, engine=0), worker.core.place(2, engine=0)

        def preempted_on_its_way():
            actions = worker.core.request_slot(2)
            assert actions == [Preempt(1, 0), Grant(2, 0, Priority.HIGH)] and 1 in worker.slots[0].waiting
            worker._act(actions + (worker.core._steal_for(1) if moved else []))

        for index, async_engine in enumerate(async_engines):
            async def observed(prompt_ids, sampling, priority=None, trajectory_id=None,
                               _generate=async_engine.generate, _index=index):
                requests.append((_index, trajectory_id))
                stream = _generate(prompt_ids, sampling, priority, trajectory_id)
                try:
                    async for output in stream:
                        if output.finished and len(requests) == 1:
                            preempted_on_its_way()
                        yield output
                finally:
                    await stream.aclose()

            async_engine.generate = observed
        try:
            turn = await asyncio.wait_for(worker._generate(prompt, SamplingParams(
                max_new_tokens=12, temperature=0, stop_token_ids=(stop,)), "1"), timeout=120)
            await asyncio.gather(*worker._moving.values())
            landed = worker.migrations
            asking = [index for index, s in enumerate(worker.slots) if 1 in s.holders or 1 in s.waiting]
            worker.core.check_invariants()
            short = SamplingParams(max_new_tokens=4, temperature=0, stop_token_ids=(-1,))
            await asyncio.wait_for(worker._generate(prompt + turn.output_ids + [1, 2], short, "1"), timeout=120)
            return turn, landed, asking, worker
        finally:
            for e in async_engines:
                await e.shutdown()

    turn, landed, asking, worker = asyncio.run(main())
    assert turn.output_ids == expected and turn.finish_reason == "stop"
    assert turn.preemptions == worker.preemptions == 0
    assert landed == moved and not asking, "the landing asked no slot for the ended turn"
    # the next turn asks on engine 1: moved there, or queued behind trajectory 2 and stolen
    assert requests == [(0, "1"), (1, "1")] and worker.core.engine_of[1] == 1


@pytest.mark.parametrize(("live_set", "thrash_fraction"),
                         [(None, 0.1), ("thunderagent", 0.1), ("venus", 0.0), ("venus", 0.1)])
def test_the_worker_schedules_through_the_rollout_core_and_keeps_its_invariants(tiny_model_dir, monkeypatch,
                                                                                live_set, thrash_fraction):
    """Two engines: every turn's slot, every start and end, every live-set check goes through
    the same `RolloutCore` the simulator drives, and its invariants hold after each event.
    ThunderAgent's mode (action-level slots, its live set) sends no priority; with a pool too
    small for every program at once, the live set holds some back and the run still finishes.
    Venus's live set engaged from the start does the same; with its thrash gate, the engines'
    counters reach it at every check until it engages, and nothing pauses before."""
    from collections import Counter

    from venusrl.rollout.core import RolloutCore
    from venusrl.types import Priority

    calls: Counter = Counter()
    for name in ("place", "request_slot", "release_slot", "finish", "policy_changed", "declared_priority",
                 "check_live_set", "observe_engine"):
        original = getattr(RolloutCore, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            result = _original(self, *args, **kwargs)
            self.check_invariants()
            return result

        monkeypatch.setattr(RolloutCore, name, counted)
    capacity = 4096 if live_set is None else 1200  # one group's contexts (its prompt shared): the rest wait
    engines = [Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=capacity, page_size=1))
               for _ in range(2)]
    mode = "action_level" if live_set == "thunderagent" else "priority"
    ranking = {"policy": "action_level"} if mode == "action_level" else {}  # ThunderAgent ranks no group
    coordinator = DataCoordinator(CoordinatorConfig(group_size=2, batch_groups=2, async_factor=1.5, **ranking),
                                  prompts(4))

    submitted = []  # the priority of every engine request

    async def main():
        async_engines = [AsyncEngine(e) for e in engines]
        for async_engine in async_engines:
            generate = async_engine.generate

            def recorded(prompt_ids, sampling, priority=None, trajectory_id=None, _generate=generate):
                submitted.append(priority)
                return _generate(prompt_ids, sampling, priority, trajectory_id)

            async_engine.generate = recorded
        try:
            worker = RolloutWorker(coordinator, async_engines, engines[0].tokenizer, CalculatorEnv,
                                   RolloutConfig(max_turns=2, max_new_tokens_per_turn=16), slots=1, mode=mode,
                                   live_set=live_set, live_set_interval_s=0.01,
                                   live_set_thrash_fraction=thrash_fraction)
            ready = await worker.run(groups=2)
            return worker, ready
        finally:
            for e in async_engines:
                await e.shutdown()

    worker, ready = asyncio.run(main())
    assert len(ready) >= 2
    ranked = ("policy_changed",) if mode == "priority" else ()  # ThunderAgent's coordinator ranks no group
    assert all(calls[name] > 0 for name in ("place", "request_slot", "release_slot", "finish", *ranked)), calls
    # the run cancelled the trajectories past the batch: every one placed has left its engine
    assert calls["place"] == calls["finish"] and worker.core.placement.loads == [0, 0] and not worker.core.engine_of
    assert submitted and set(submitted) <= {Priority.HIGH, Priority.LOW}
    if mode == "action_level":
        assert set(submitted) == {Priority.LOW}
    elif live_set is None:
        # all three groups run at once (async factor 1.5): the one past the batch asks LOW. Under a
        # live set the pool may hold that group back until the batch is done, so no LOW need be sent.
        assert Priority.LOW in set(submitted)
    if live_set == "venus" and thrash_fraction > 0:
        gate = worker.core.live_set
        assert calls["observe_engine"] > 0  # the engines' counters reached the gate
        assert gate.pauses == 0 or any(gate.engaged), "an engine paused a program before it thrashed"
    elif live_set is not None:
        # some program waited outside the pool (queued at its start or paused) and was resumed
        assert calls["check_live_set"] > 0 and worker.core.live_set.resumes > 0
