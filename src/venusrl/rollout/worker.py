"""RolloutWorker: runs the coordinator's trajectories as agent loops on its engines and
schedules them per action.

Each trajectory is an asyncio task running `run_agent_loop`. Every scheduling decision is
the `RolloutCore`'s (the same object the simulator drives): placement on an engine, a
generation slot per turn, preemption of a LOW turn by a PROMOTED/HIGH one (the LOW request
is aborted in the engine, keeps the tokens it produced, waits for a slot again and resumes
from there: its prefix is still in the radix cache), demotion-aware slot priority,
re-prioritisation on a policy change, and moves between engines (idle-slot stealing,
request orchestration). This driver reports events to the core and carries out its actions
with asyncio: grant and preempt events, engine notifications, prefix KV copies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.coordinator.decisions import Decisions
from venusrl.coordinator.predictors import (
    BackgroundPredictor,
    PredictionQuery,
    examples_of_finished,
    query_from_trajectory,
)
from venusrl.engine.client import EngineClient
from venusrl.engine.engine import RequestOutput
from venusrl.env.base import Environment
from venusrl.model.chat import ChatTokenizer
from venusrl.rollout.agent_loop import TurnOutput, run_agent_loop
from venusrl.rollout.config import RolloutConfig
from venusrl.rollout.core import Action, Grant, Preempt, RolloutCore, SetEnginePriority
from venusrl.rollout.generate import release_quietly
from venusrl.rollout.live_set import (
    BUFFER_PER_PROGRAM,
    THRASH_FRACTION,
    THUNDERAGENT_INTERVAL_S,
    LiveSetRuleName,
)
from venusrl.rollout.orchestrator import Move
from venusrl.rollout.slots import SlotMode, SlotScheduler
from venusrl.sandbox.api import AsyncSandbox
from venusrl.sandbox.controller import SandboxController
from venusrl.types import Group, Prompt, SamplingParams, Trajectory

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TurnResult:
    """A turn's output across preemptions: what each engine request produced, joined."""

    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    preemptions: int = 0


@dataclass(slots=True)
class TokenCounts:
    """Generated tokens by what became of them, as the worker saw them: `kept` joined a
    turn (across preemptions), `cancelled` were delivered to a turn that was then cancelled
    (its trajectory discarded, or the run stopped). Tokens an engine sampled beyond these
    were sampled for an aborted request and never delivered."""

    kept: int = 0
    cancelled: int = 0


@dataclass(slots=True)
class _Latest:
    """The newest output of an engine request, readable after the wait for it is cancelled."""

    output: RequestOutput | None = None


class RolloutWorker:
    def __init__(
        self,
        coordinator: DataCoordinator,
        engines: EngineClient | list[EngineClient],

        tokenizer: ChatTokenizer,
        env_factory: Callable[[], Environment],
        config: RolloutConfig,
        slots: int,
        mode: SlotMode = "priority",
        clock: Callable[[], float] = time.monotonic,
        predictor: BackgroundPredictor | None = None,
        sandboxes: SandboxController | None = None,
        on_ready: Callable[[Group], None] | None = None,
        live_set: LiveSetRuleName | None = None,
        live_set_interval_s: float = THUNDERAGENT_INTERVAL_S,
        live_set_buffer_tokens: int = BUFFER_PER_PROGRAM,
        acting_decay: bool = False,
        live_set_thrash_fraction: float = THRASH_FRACTION,
    ):
        """`live_set`: pause programs so the live ones' KV fits each engine's pool, checked every
        `live_set_interval_s`, each live program reserving `live_set_buffer_tokens` of headroom
        (`rollout/live_set.py`: ThunderAgent's rule or venus's, which engages on an engine once
        it recomputes more than `live_set_thrash_fraction` of its requests' context;
        `SchedulerConfig.live_set_rule` names it)."""
        self.coordinator, self.tokenizer = coordinator, tokenizer
        self.engines = engines if isinstance(engines, list) else [engines]
        self.env_factory, self.config, self.clock = env_factory, config, clock
        self.mode = mode
        self.live_set_interval_s = live_set_interval_s
        self._context: dict[int, list[int]] = {}  # the tokens a trajectory's pending turn starts from
        capacity = min(engine.info().kv_capacity_tokens for engine in self.engines) if live_set else 0
        self.core = RolloutCore(coordinator, len(self.engines), slots, mode, orchestration=config.orchestration,
                                decode_balance=config.decode_balance,
                                isolate_step_enders=config.isolate_step_enders,
                                live_set=live_set, kv_capacity_tokens=capacity, acting_decay=acting_decay,
                                buffer_tokens=live_set_buffer_tokens, thrash_fraction=live_set_thrash_fraction,
                                context_tokens=lambda tid: len(self._context.get(tid, ())))
        self.ready: list[Group] = []
        self.dropped: list[Prompt] = []
        self.preemptions = 0
        self.predictions = 0
        self.migrations = 0
        # moves the core decided that did not land, by why: the trajectory ended before the copy
        # began or while its KV was copied, or the run stopped with the copy in flight (decided =
        # landed `migrations` + these, once a run has stopped)
        self.moves_unlanded: Counter[str] = Counter()
        self.moved_tokens = {"context": 0, "kv": 0}  # landed moves: their contexts, and the KV tokens sent along
        self.move_seconds: list[float] = []  # each landed move, from its decision to its arrival
        self.tokens = TokenCounts()
        self.predictor = predictor
        self.sandboxes = sandboxes
        self.on_ready = on_ready
        self._changed = asyncio.Event()  # set by every decision and every finished trajectory
        self._queries: dict[int, list[PredictionQuery]] = {}  # per trajectory, for online learning
        self._tasks: dict[int, asyncio.Task] = {}
        self._grants: dict[int, asyncio.Event] = {}
        self._preempt: dict[int, asyncio.Event] = {}
        self._moving: dict[int, asyncio.Task] = {}  # prefix KV copies of moved trajectories

    async def run(self, groups: int | None = None, stop: asyncio.Event | None = None) -> list[Group]:
        """Run until `groups` groups are ready, `stop` is set, or nothing is left to run: with
        `groups`, when no trajectory is live; without, when the dataset is done too (a trainer
        keeps the worker going by stepping the weights, which refills the window)."""
        self._apply(self.coordinator.start(self.clock()))
        background = [asyncio.create_task(self._poll_predictions())] if self.predictor is not None else []
        if self.core.orchestration:
            background.append(asyncio.create_task(self._orchestrate()))
        background.append(asyncio.create_task(self._refresh_demotions()))
        if self.core.live_set is not None:
            background.append(asyncio.create_task(self._check_live_set()))
        stopped = asyncio.create_task(stop.wait()) if stop is not None else None
        try:
            while not self._done(groups, stop):
                self._changed.clear()
                changed = asyncio.create_task(self._changed.wait())
                await asyncio.wait([changed, *([stopped] if stopped else [])], return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
        finally:
            self.moves_unlanded["stopped_in_flight"] += sum(not task.done() for task in self._moving.values())
            leftover = [*self._tasks.values(), *self._moving.values(), *background, *([stopped] if stopped else [])]
            for task in leftover:  # trajectories past the batch, the pollers
                task.cancel()
            await asyncio.gather(*leftover, return_exceptions=True)
        return self.ready

    def _done(self, groups: int | None, stop: asyncio.Event | None) -> bool:
        if (groups is not None and len(self.ready) >= groups) or (stop is not None and stop.is_set()):
            return True
        return not self._tasks and (groups is not None or self.coordinator.finished)

    def move_figures(self) -> dict[str, dict[str, int]]:
        """The core's (`RolloutCore.move_figures`) and the decided moves that did not land, by why."""
        return {**self.core.move_figures(), "moves_unlanded": dict(self.moves_unlanded)}

    @property
    def slots(self) -> list[SlotScheduler]:
        return self.core.slots

    @property
    def live_trajectories(self) -> int:
        return len(self._tasks)

    def on_weight_version(self, version: int) -> None:
        """The trainer stepped the weights: the coordinator retires the trained groups,
        re-runs or promotes stale trajectories and refills the window."""
        self._apply(self.coordinator.on_weight_version(version, self.clock()))

    # ---- length predictions (off the critical path) ------------------------------------------

    def _predict(self, trajectory_id: int, messages: Sequence[dict[str, Any]]) -> None:
        """Ask for a prediction at a turn boundary, with the chat so far and the observation
        the turn starts from (the last message after an assistant turn: a tool's output, its
        test results or errors, as `query_from_messages` reads it from a training example);
        the answer arrives through the poller."""
        trajectory = self.coordinator.trajectory(trajectory_id)
        group = self.coordinator.group(trajectory.group_id) if trajectory is not None else None
        if self.predictor is None or group is None:
            return
        last = messages[-1] if trajectory.turns and messages else {}
        content = last.get("content") if last.get("role") != "assistant" else ""
        observation = content if isinstance(content, str) else ""
        query = query_from_trajectory(trajectory, group, messages=messages, last_observation=observation)
        self._queries.setdefault(trajectory_id, []).append(query)
        self.predictor.submit(query)

    async def _poll_predictions(self, interval_s: float = 0.02) -> None:
        while True:
            for prediction in self.predictor.poll():
                self.predictions += 1
                self._apply(self.coordinator.on_prediction(
                    prediction.trajectory_id, self.clock(), prediction.remaining_tokens, prediction.at_generated_tokens))
            await asyncio.sleep(interval_s)

    def _learn_from(self, trajectory_id: int, generated_tokens: int) -> None:
        queries = self._queries.pop(trajectory_id, [])
        if self.predictor is not None and queries:
            self.predictor.observe(examples_of_finished(queries, generated_tokens))

    # ---- coordinator decisions -------------------------------------------------------------

    def _apply(self, decisions: Decisions) -> None:
        for trajectory in decisions.start:
            self._tasks[trajectory.id] = asyncio.create_task(self._run_trajectory(trajectory))
        for trajectory_id in decisions.discarded:
            task = self._tasks.get(trajectory_id)
            if task is not None:
                task.cancel()
        self.ready.extend(decisions.ready)
        if self.on_ready is not None:
            for group in decisions.ready:
                self.on_ready(group)
        self.dropped.extend(decisions.dropped)
        if decisions.policy is not None:
            self._act(self.core.policy_changed(decisions.policy))
        self._changed.set()

    def _act(self, actions: list[Action]) -> None:
        """Carry out the core's actions: wake a granted turn, stop a preempted one, notify an
        engine, start the prefix KV copy of a move."""
        for action in actions:
            if isinstance(action, Grant):
                self._grants.setdefault(action.trajectory, asyncio.Event()).set()
            elif isinstance(action, Preempt):
                if action.trajectory in self._preempt:  # else it has not submitted yet: it re-asks on waking
                    self._preempt[action.trajectory].set()
            elif isinstance(action, SetEnginePriority):
                self.engines[action.engine].set_priority(str(action.trajectory), action.priority)
            elif isinstance(action, Move):
                task = asyncio.create_task(self._move(action))
                self._moving[action.request] = task
                task.add_done_callback(lambda _, tid=action.request: self._moving.pop(tid, None))

    # ---- moves between engines: stealing and request orchestration (paper §4.3) ---------------

    async def _orchestrate(self) -> None:
        while True:
            await asyncio.sleep(self.config.orchestration_interval_s)
            loads = [await engine.load() for engine in self.engines]
            self._act(self.core.orchestrate(loads, lambda tid: len(self._context[tid]),
                                            self.config.orchestration_threshold))

    async def _refresh_demotions(self) -> None:
        """Each engine demotes at its own iterations; the core learns of it when a turn asks for
        a slot there, and here, every `demotion_refresh_interval_s`, so an urgent turn that
        queued before its slot's holder was demoted gets that slot (`RolloutCore.demoted`)."""
        while True:
            await asyncio.sleep(self.config.demotion_refresh_interval_s)
            for index in self.core.stale_demotions():
                self._act(self.core.demoted(index, await self.engines[index].demoted_trajectories()))

    async def _check_live_set(self) -> None:
        """Every `live_set_interval_s`: paused programs resume where they fit, engines over
        capacity pause programs (`RolloutCore.check_live_set`)."""
        while True:
            await asyncio.sleep(self.live_set_interval_s)
            live_set = self.core.live_set
            for index in self.core.engines_to_observe():
                stats = await self.engines[index].stats()
                if self.core.observe_engine(index, stats.prompt_tokens, stats.recomputed_tokens):
                    log.info("live set engaged on engine %d: it recomputes more than %.0f%% of its requests' context",
                             index, 100 * live_set.thrash_fraction)
            pauses, resumes = live_set.pauses, live_set.resumes
            self._act(self.core.check_live_set(self.clock()))
            if (live_set.pauses, live_set.resumes) != (pauses, resumes):
                log.info("live set: %d program(s) paused, %d resumed, %d paused now", live_set.pauses - pauses,
                         live_set.resumes - resumes, sum(p.paused for p in live_set.programs.values()))

    async def _move(self, move: Move) -> None:
        """The core moved a waiting trajectory, or one asking for a slot (decode balance); it
        left the source's slots: copy its prefix
        KV to the target, release it on the source, and let it ask for a slot on the target.
        A failed copy costs the target a recompute, never the trajectory."""
        trajectory_id, source, target = move.request, move.source, move.target
        key, token_ids = str(trajectory_id), self._context.get(trajectory_id)
        if token_ids is None:  # it ended (discarded, run over) before this task began: nothing to copy
            self.moves_unlanded["ended_before_copy"] += 1
            return
        copied, started = 0, self.clock()
        try:
            await self.engines[target].start_trajectory(key, self.core.declared_priority(trajectory_id))  # live first
            # engine processes send the KV to each other (host to host), in-process engines copy it
            copied = await self.engines[source].send_prefix(list(token_ids), self.engines[target], key)
            await self.engines[source].release_trajectory(key)
        except Exception as err:
            log.warning("trajectory %d: prefix KV copy from engine %d to %d failed (%s); it recomputes",
                        trajectory_id, source, target, err)
        if not self.core.arrived(trajectory_id):  # it ended while its KV was copied
            self.moves_unlanded["ended_during_copy"] += 1
            await release_quietly(self.engines[target], key)
            return
        self.migrations += 1
        self.moved_tokens["context"] += len(token_ids)
        self.moved_tokens["kv"] += copied
        self.move_seconds.append(self.clock() - started)
        self.core.move_took(self.move_seconds[-1])
        log.info("trajectory %d moved from engine %d to %d with %d prefix tokens", trajectory_id, source, target,
                 copied)
        self._grants.setdefault(trajectory_id, asyncio.Event()).set()  # it asks again, on the target

    # ---- one trajectory --------------------------------------------------------------------

    async def _run_trajectory(self, trajectory: Trajectory) -> None:
        trajectory_id = trajectory.id
        self.core.place(trajectory_id)
        row = trajectory.prompt.row()
        observer = _CoordinatorReport(self, trajectory_id)
        env, sandbox = self.env_factory(), None
        try:
            if env.needs_sandbox:
                sandbox = await create_sandbox(env, self.sandboxes, group_id=f"group-{trajectory.group_id}", row=row)
            rollout = await run_agent_loop(env, row, self._generate, self.tokenizer, self.config,
                                           str(trajectory_id), sandbox=sandbox, observer=observer)
        except asyncio.CancelledError:
            log.info("trajectory %d cancelled (discarded or run over)", trajectory_id)
            raise
        except Exception as err:  # the loop broke (engine, sandbox): the coordinator re-runs it
            log.warning("trajectory %d failed: %s", trajectory_id, err)
            self._apply(self.coordinator.on_trajectory_failed(trajectory_id, self.clock(), str(err)))
        else:
            self._apply(self.coordinator.on_trajectory_done(trajectory_id, self.clock(), rollout.reward, record=rollout))
            self._learn_from(trajectory_id, sum(rollout.generated_mask))
        finally:
            self._queries.pop(trajectory_id, None)
            self._context.pop(trajectory_id, None)
            engine = self.engines[self.core.engine_of[trajectory_id]]
            self._act(self.core.finish(trajectory_id))
            del self._tasks[trajectory_id]
            self._changed.set()
            await release_quietly(engine, str(trajectory_id))
            if sandbox is not None:
                await _kill_quietly(sandbox, trajectory_id)

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams, key: str) -> TurnOutput:
        trajectory_id = int(key)
        turn = TurnResult()
        while turn.finish_reason in (None, "abort"):
            context = self._context[trajectory_id] = prompt_ids + turn.output_ids
            await self._acquire(trajectory_id)
            held_from = self.clock()
            preempt = self._preempt[trajectory_id] = asyncio.Event()
            remaining = replace(sampling, max_new_tokens=sampling.max_new_tokens - len(turn.output_ids))
            engine = self.engines[self.core.engine_of[trajectory_id]]
            stream = engine.generate(context, remaining, self.core.declared_priority(trajectory_id), key)
            latest = _Latest()
            try:
                last = await _until_done_or(stream, preempt, latest)
            except asyncio.CancelledError:
                self.tokens.cancelled += len(latest.output.output_ids) if latest.output else 0
                raise
            del self._preempt[trajectory_id]
            # A preemption can find the request finished in the engine, its output on its way
            # here (the engine thread's hand-over, the stream): it aborted nothing, and that
            # output ends the turn, once; resuming would generate past the turn's stop. The
            # core has queued the turn as a waiter, maybe moved it: `release_slot` takes it out
            # of the queue, and a move's landing only wakes its next turn's `_acquire`.
            preempted = preempt.is_set() and not (last is not None and last.finished)
            if not preempted:  # a preempted turn held its slot for part of a turn only
                self.core.turn_held(self.clock() - held_from)
            self._act(self.core.release_slot(trajectory_id, self.clock()))
            if last is not None:
                self.tokens.kept += len(last.output_ids)
                turn.output_ids += last.output_ids
                turn.logprobs += last.logprobs
                turn.weight_versions += last.weight_versions
            turn.finish_reason = "abort" if preempted else (last.finish_reason if last else "abort")
            if preempted:
                turn.preemptions += 1
                self.preemptions += 1
                log.info("trajectory %d preempted after %d tokens; resumes when a slot frees",
                         trajectory_id, len(turn.output_ids))
                if len(turn.output_ids) >= sampling.max_new_tokens:
                    turn.finish_reason = "length"
        return turn

    async def _acquire(self, trajectory_id: int) -> None:
        """Until the trajectory holds a slot on its engine (re-read each time: a move changes
        it; a preempted waiter woken by a grant may have lost the slot again). A preempted turn
        is queued by the core at once, so an idle engine may steal it before its driver gets
        here: then it waits for the move to land (`_move` wakes it) and asks on the target."""
        while True:
            engine = self.core.engine_of[trajectory_id]
            if trajectory_id in self.core.slots[engine].holders:
                return
            if trajectory_id in self.core.moving:
                await self._grants.setdefault(trajectory_id, asyncio.Event()).wait()
                self._grants.pop(trajectory_id, None)
                continue
            asked = self.core.wants_demoted(trajectory_id)
            if asked is not None:
                self._act(self.core.demoted(asked, await self.engines[asked].demoted_trajectories()))
                # a preempted turn waits in the core's queue while its driver asks the engine:
                # meanwhile it may have been granted a slot, or stolen by an idle engine
                if trajectory_id in self.core.moving or trajectory_id in self.core.slots[engine].holders:
                    continue
            granted = self._grants[trajectory_id] = asyncio.Event()
            self._act(self.core.request_slot(trajectory_id))
            if trajectory_id not in self.core.slots[self.core.engine_of[trajectory_id]].holders:
                await granted.wait()  # a grant, or a move that landed
            self._grants.pop(trajectory_id, None)


async def next_ready(ready: asyncio.Queue[Group], running: asyncio.Task) -> Group | None:
    """The next group a worker running as `running` hands to `ready` (its `on_ready`); None
    once the worker has stopped with nothing left there. A crashed worker raises here."""
    if ready.empty():
        getter = asyncio.create_task(ready.get())
        await asyncio.wait([getter, running], return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        running.result()
    return None if ready.empty() else ready.get_nowait()


async def create_sandbox(env: Environment, controller: SandboxController | None, group_id: str | None = None,
                         row: dict[str, Any] | None = None) -> AsyncSandbox:
    """One sandbox for one trajectory, from the environment's template for its row; a
    group's sandboxes (same `group_id`) share a node and so its template pages."""
    if controller is None:
        raise RuntimeError(f"environment {type(env).__name__} needs a sandbox and there is no sandbox controller")
    return await AsyncSandbox.create(controller, env.sandbox_template(row or {}), group_id=group_id)


async def _kill_quietly(sandbox: AsyncSandbox, trajectory_id: int) -> None:
    """A sandbox that already died (the fault being handled) has nothing left to kill."""
    try:
        await asyncio.shield(sandbox.kill())
    except Exception as err:
        log.info("sandbox %s of trajectory %d: kill failed (%s)", sandbox.sandbox_id, trajectory_id, err)


async def _until_done_or(stream: AsyncIterator[RequestOutput], preempt: asyncio.Event,
                         latest: _Latest) -> RequestOutput | None:
    """The last output of the stream, or, once `preempt` is set, the last one seen so far
    (leaving the stream aborts the engine request; its KV stays cached for the resume).
    `latest` holds the newest output seen, for a caller cancelled meanwhile."""
    last = None
    iterator = aiter(stream)
    while True:
        next_output = asyncio.ensure_future(anext(iterator))
        preempted = asyncio.ensure_future(preempt.wait())
        try:
            done, _ = await asyncio.wait({next_output, preempted}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # cancelled from outside (a discarded trajectory): leave no orphan behind
            preempted.cancel()
            if not next_output.done():
                next_output.cancel()
                await asyncio.gather(next_output, return_exceptions=True)
        if next_output in done:
            try:
                last = latest.output = next_output.result()
            except StopAsyncIteration:
                return last
            if last.finished:
                return last
            continue
        await stream.aclose()
        return last


@dataclass(slots=True)
class _CoordinatorReport:
    """Reports one trajectory's turn boundaries to the coordinator."""

    worker: RolloutWorker
    trajectory_id: int

    def turn_started(self, context_ids: list[int], messages: Sequence[dict[str, Any]]) -> None:
        coordinator = self.worker.coordinator
        self.worker._apply(coordinator.on_turn_start(self.trajectory_id, self.worker.clock(), context_ids))
        self.worker._predict(self.trajectory_id, messages)

    def turn_ended(self, output: TurnOutput, tool_call: bool) -> None:
        version = max(output.weight_versions, default=self.worker.coordinator.weight_version)
        self.worker._apply(self.worker.coordinator.on_turn_end(
            self.trajectory_id, self.worker.clock(), output.output_ids, output.logprobs, version, tool_call))

    def tool_returned(self, error: bool) -> None:
        self.worker._apply(self.worker.coordinator.on_tool_result(self.trajectory_id, self.worker.clock(), error))
