"""DataCoordinator: the control plane of rollout, as a pure event-driven state machine.

Events come in with an explicit `now` (seconds, any monotonic origin); each returns the
`Decisions` the rest of the system acts on. No threads, no I/O, no clock: the simulator and
the real system drive the same object.

Invariants (tested as properties):
- groups in flight (admitted, not yet consumed by a weight step) <= ceil(async_factor x B);
- a group is handed to the trainer only when all K of its current trajectories are done,
  and exactly once; every admitted prompt ends trained or reported in `Decisions.dropped`;
- a trajectory never spans more than max_version_span weight versions: past that it is
  discarded and its slot in the group re-run; at its last admissible version it is PROMOTED.

One record per trajectory: turn events carry counts (context and generated tokens per turn,
the weight version, tool time) for the policy and the staleness bound; the tokens, mask and
log-probs the trainer reads are the rollout side's record, adopted whole with the done
event (`on_trajectory_done(..., record=)`), never rebuilt here.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from venusrl.coordinator.config import CoordinatorConfig
from venusrl.coordinator.decisions import Decisions, PriorityPolicy
from venusrl.coordinator.policies import LengthPredictionRule, PriorityRule, check_key, make_rule
from venusrl.coordinator.ranking import GroupRanking
from venusrl.coordinator.snapshot import CoordinatorSnapshot, copy_groups
from venusrl.coordinator.stats import RunningStats
from venusrl.types import Group, GroupStatus, Prompt, Trajectory, TrajectoryStatus, Turn

logger = logging.getLogger(__name__)


class TrajectoryRecord(Protocol):
    """What the rollout side recorded of one trajectory (the agent loop's `Rollout`; the
    simulator's trajectory): aligned token ids, generated mask (1 where the policy sampled
    the token) and behaviour log-probs (0 where the mask is 0)."""

    token_ids: list[int]
    generated_mask: Sequence[int]
    logprobs: list[float]


@dataclass(slots=True)
class CoordinatorCounts:
    admitted: int = 0  # groups admitted from the dataset
    ready: int = 0  # groups handed to the trainer
    trained: int = 0  # groups consumed by weight steps
    dropped: int = 0  # groups given up
    discarded: int = 0  # trajectory attempts discarded (stale or failed)
    discarded_tokens: int = 0  # tokens those attempts had generated (in finished turns)


class DataCoordinator:
    """Events in (start, on_turn_start, on_turn_end, on_tool_result, on_prediction,
    on_trajectory_done, on_trajectory_failed, on_weight_version), each with `now`;
    `Decisions` out: trajectories to start, ids to abort, groups for the trainer, prompts
    dropped, and the priority policy when it changed (also readable as `policy`)."""

    def __init__(
        self,
        config: CoordinatorConfig,
        prompts: Iterable[Prompt],
        *,
        rule: PriorityRule | None = None,
        weight_version: int = 0,
    ) -> None:
        self.config = config
        self.rule = rule if rule is not None else make_rule(config.policy)
        self.window = math.ceil(config.async_factor * config.batch_groups)
        self.weight_version = weight_version
        self.stats = RunningStats(
            seconds_per_token=config.prior_seconds_per_token,
            tool_seconds=config.prior_tool_seconds,
            tokens_per_turn=config.prior_tokens_per_turn,
            total_tokens=config.prior_remaining_tokens,
            smoothing=config.stats_smoothing,
        )
        self.counts = CoordinatorCounts()
        self.stale_discard_tokens: list[int] = []  # generated tokens of each attempt discarded as stale
        self._prompts = iter(prompts)
        self._exhausted = False
        self._running: dict[int, Group] = {}
        self._untrained: deque[Group] = deque()  # ready, waiting for a weight step
        self._live: dict[int, Trajectory] = {}  # unfinished trajectories
        self._by_start_version: dict[int, set[int]] = {}  # unfinished ids by start_version
        self._promoted: set[int] = set()
        self._promoted_changed = False
        self._ranking = GroupRanking()
        self._policy = PriorityPolicy(version=0, high_groups=frozenset(), promoted=frozenset())
        self._next_group_id = 0
        self._next_trajectory_id = 0
        self._restored: list[Group] = []  # running groups of a snapshot, re-admitted by start()

    @classmethod
    def restore(
        cls,
        config: CoordinatorConfig,
        snapshot: CoordinatorSnapshot,
        remaining_prompts: Iterable[Prompt],
        *,
        rule: PriorityRule | None = None,
    ) -> DataCoordinator:
        """Continue from a snapshot. `remaining_prompts` is the dataset stream after the first
        `snapshot.prompts_consumed` prompts. Ready groups wait for the trainer again; the first
        `start` re-admits the running groups ahead of new prompts, keeping their DONE
        trajectories and re-running the rest."""
        snapshot.check()
        coordinator = cls(config, remaining_prompts, rule=rule, weight_version=snapshot.weight_version)
        coordinator.counts = CoordinatorCounts(**snapshot.counts)
        coordinator._next_group_id = snapshot.next_group_id
        coordinator._next_trajectory_id = snapshot.next_trajectory_id
        coordinator._untrained.extend(snapshot.ready)
        coordinator._restored = list(snapshot.running)
        return coordinator

    def snapshot(self) -> CoordinatorSnapshot:
        """The state to checkpoint, taken at a weight-step boundary (see coordinator.snapshot)."""
        return CoordinatorSnapshot(
            weight_version=self.weight_version,
            prompts_consumed=self.counts.admitted,
            ready=copy_groups(list(self._untrained)),
            running=copy_groups([*self._restored, *self._running.values()]),
            counts=asdict(self.counts),
            next_group_id=self._next_group_id,
            next_trajectory_id=self._next_trajectory_id,
        )

    # ---- state -----------------------------------------------------------------------------

    @property
    def policy(self) -> PriorityPolicy:
        return self._policy

    @property
    def in_flight(self) -> int:
        """Groups admitted and not yet consumed by a weight step (running + ready)."""
        return len(self._running) + len(self._untrained)

    @property
    def ready_waiting(self) -> int:
        """R: groups handed to the trainer that no weight step has consumed yet."""
        return len(self._untrained)

    @property
    def finished(self) -> bool:
        """The dataset is exhausted and every admitted group is ready, trained or dropped."""
        return self._exhausted and not self._running

    def trajectory(self, trajectory_id: int) -> Trajectory | None:
        """An unfinished trajectory, or None."""
        return self._live.get(trajectory_id)

    def group(self, group_id: int) -> Group | None:
        """A running group, or None."""
        return self._running.get(group_id)

    def untrained_groups(self) -> list[Group]:
        """Ready groups no weight step has consumed, in the order the trainer takes them."""
        return list(self._untrained)

    def running_groups(self) -> list[Group]:
        return list(self._running.values())

    def critical_order(self, trajectory_id: int) -> float:
        """Where a HIGH trajectory's turn goes among the HIGH waiters for a slot (ascending,
        before arrival order): minus its group's key under a rule that serves the critical
        set longest-first, else 0 (arrival order alone)."""
        if not self.rule.longest_critical_first:
            return 0.0
        t = self._live.get(trajectory_id)
        key = None if t is None else self._ranking.key(t.group_id)
        return 0.0 if key is None else -key

    def touched_by(self, new: PriorityPolicy, old: PriorityPolicy) -> set[int]:
        """Trajectories whose priority may differ under `new` from `old`: those of running
        groups that entered or left the HIGH set, and those whose promotion changed. A
        worker re-prioritises these (O(change), not O(live))."""
        touched = set(new.promoted ^ old.promoted)
        for group_id in new.high_groups ^ old.high_groups:
            group = self._running.get(group_id)
            if group is not None:
                touched.update(t.id for t in group.trajectories)
        return touched

    def ranked_group_ids(self) -> list[int]:
        """Unfinished groups, most urgent first."""
        return self._ranking.order()

    def predicted_step_enders(self, share: float) -> frozenset[int]:
        """The trajectories predicted to end the next training step: the unfinished ones of the
        HIGH group ranked last (the critical group predicted to be ready last) whose predicted
        remaining tokens are at least `share` of the largest in that group. Empty under a rule
        that predicts no lengths."""
        if not isinstance(self.rule, LengthPredictionRule):
            return frozenset()
        high = self._policy.high_groups
        last = next((g for g in reversed(self._ranking.order()) if g in high), None)
        group = None if last is None else self._running.get(last)
        if group is None:
            return frozenset()
        remaining = {t.id: self.rule.remaining_tokens(t, self.stats) for t in group.trajectories if not t.finished}
        largest = max(remaining.values(), default=0.0)
        return frozenset(t for t, tokens in remaining.items() if largest > 0 and tokens >= share * largest)

    def summary(self) -> dict[str, int]:
        return {
            "weight_version": self.weight_version,
            "policy_version": self._policy.version,
            "in_flight": self.in_flight,
            "running": len(self._running),
            "ready_waiting": len(self._untrained),
            "live_trajectories": len(self._live),
            "high_groups": len(self._policy.high_groups),
            "promoted": len(self._policy.promoted),
            "admitted": self.counts.admitted,
            "ready": self.counts.ready,
            "trained": self.counts.trained,
            "dropped": self.counts.dropped,
            "discarded": self.counts.discarded,
        }

    # ---- events ----------------------------------------------------------------------------

    def start(self, now: float) -> Decisions:
        """Admit groups up to the window (restored groups first). Every other event also
        refills the window."""
        out = Decisions()
        for group in self._restored:
            group.admitted_at = now
            self._running[group.id] = group
            for t in list(group.trajectories):
                if t.status is not TrajectoryStatus.DONE:  # its process died: run it again
                    group.trajectories[t.index] = self._new_trajectory(group, t.index, t.attempt, out)
            self._rekey(group, now)
        self._restored = []
        return self._finish(now, out)

    def on_turn_start(self, trajectory_id: int, now: float, context_ids: Sequence[int] = ()) -> Decisions:
        """A turn enters generation; context_ids are the non-generated tokens fed before it
        (the prompt on the first turn, the tool observation afterwards), counted, not kept."""
        out = Decisions()
        t = self._live_trajectory(trajectory_id, "turn_start")
        if t is None:
            return out
        if t.status is not TrajectoryStatus.WAITING:
            raise ValueError(f"turn_start: trajectory {trajectory_id} is {t.status.value}, expected waiting")
        t.pending_context_tokens += len(context_ids)
        t.status = TrajectoryStatus.GENERATING
        t.turn_started_at = now
        return self._finish(now, out)

    def on_turn_end(
        self,
        trajectory_id: int,
        now: float,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        weight_version: int,
        tool_call: bool,
    ) -> Decisions:
        """A turn finished generating with `weight_version`; a tool call follows if tool_call.
        The tokens are counted, not kept (the done event brings the record)."""
        out = Decisions()
        t = self._live_trajectory(trajectory_id, "turn_end")
        if t is None:
            return out
        if t.status is TrajectoryStatus.IN_TOOL:
            raise ValueError(f"turn_end: trajectory {trajectory_id} is in_tool, expected generating")
        if len(logprobs) != len(token_ids):
            raise ValueError(
                f"turn_end: trajectory {trajectory_id}: logprobs has {len(logprobs)} entries, "
                f"token_ids has {len(token_ids)}"
            )
        started = t.turn_started_at if t.turn_started_at is not None else now
        t.generated_tokens += len(token_ids)
        t.turns.append(Turn(weight_version, t.pending_context_tokens, len(token_ids), started, now))
        t.pending_context_tokens = 0
        t.turn_started_at = None
        self.stats.observe_turn(len(token_ids), now - started)
        if weight_version - t.start_version > self.config.max_version_span:
            self.stale_discard_tokens.append(t.generated_tokens)
            self._rerun(t, now, out, f"turn generated at weight version {weight_version}")
            return self._finish(now, out)
        if tool_call:
            t.status = TrajectoryStatus.IN_TOOL
            t.tool_started_at = now
        else:
            t.status = TrajectoryStatus.WAITING
        self._rekey(self._running[t.group_id], now)
        return self._finish(now, out)

    def on_tool_result(self, trajectory_id: int, now: float, error: bool = False) -> Decisions:
        """The tool call after the last turn returned; the trajectory waits for its next turn."""
        out = Decisions()
        t = self._live_trajectory(trajectory_id, "tool_result")
        if t is None:
            return out
        if t.status is not TrajectoryStatus.IN_TOOL or t.tool_started_at is None:
            raise ValueError(f"tool_result: trajectory {trajectory_id} is {t.status.value}, expected in_tool")
        seconds = now - t.tool_started_at
        t.turns[-1].tool_seconds = seconds
        t.turns[-1].tool_error = error
        t.tool_errors += int(error)
        t.tool_started_at = None
        t.status = TrajectoryStatus.WAITING
        self.stats.observe_tool(seconds)
        self._rekey(self._running[t.group_id], now)
        return self._finish(now, out)

    def on_prediction(
        self, trajectory_id: int, now: float, remaining_tokens: float, at_generated_tokens: int
    ) -> Decisions:
        """A predictor's estimate of the tokens a trajectory has left to generate, computed when
        it had generated `at_generated_tokens`. Late predictions for finished or discarded
        trajectories, and ones older than the prediction in hand, are ignored."""
        out = Decisions()
        if not math.isfinite(remaining_tokens) or remaining_tokens < 0:
            raise ValueError(f"prediction: trajectory {trajectory_id}: remaining_tokens must be >= 0, got {remaining_tokens!r}")
        t = self._live_trajectory(trajectory_id, "prediction")
        if t is None:
            return out
        if at_generated_tokens > t.generated_tokens:
            raise ValueError(
                f"prediction: trajectory {trajectory_id}: at_generated_tokens {at_generated_tokens} "
                f"> generated so far {t.generated_tokens}"
            )
        if t.predicted_remaining is not None and at_generated_tokens < t.predicted_at_generated:
            return out
        t.predicted_remaining = float(remaining_tokens)
        t.predicted_at_generated = at_generated_tokens
        self._rekey(self._running[t.group_id], now)
        return self._finish(now, out)

    def on_trajectory_done(self, trajectory_id: int, now: float, reward: float,
                           record: TrajectoryRecord | None = None) -> Decisions:
        """The trajectory finished with `reward`. `record` is what the trainer reads of it
        (its token ids, mask and log-probs become the trajectory's, the same lists); it must
        agree with the turns reported. Without one (a scheduling benchmark) only the counts
        are kept."""
        out = Decisions()
        t = self._live_trajectory(trajectory_id, "done")
        if t is None:
            return out
        if t.status is TrajectoryStatus.IN_TOOL:
            raise ValueError(f"done: trajectory {trajectory_id} is still in_tool")
        if record is not None:
            self._adopt(t, record)
        self._forget(t)
        t.status = TrajectoryStatus.DONE
        t.reward = float(reward)
        self.stats.observe_finished(t.generated_tokens)
        group = self._running[t.group_id]
        if group.all_done:
            self._hand_to_trainer(group, now, out)
        else:
            self._rekey(group, now)
        return self._finish(now, out)

    def on_trajectory_failed(self, trajectory_id: int, now: float, reason: str) -> Decisions:
        """The agent loop of a trajectory broke (sandbox lost, engine error): re-run it."""
        out = Decisions()
        t = self._live_trajectory(trajectory_id, "failed")
        if t is None:
            return out
        self._rerun(t, now, out, f"failed: {reason}")
        return self._finish(now, out)

    def on_weight_version(self, version: int, now: float) -> Decisions:
        """The trainer stepped to `version`: each step consumed B ready groups (fewer if fewer
        were waiting). Trajectories past their span are re-run, ones at their last
        admissible version promoted, and the window refilled."""
        out = Decisions()
        if version < self.weight_version:
            raise ValueError(f"weight_version: {version} is older than the current {self.weight_version}")
        if version == self.weight_version:
            return out
        steps = version - self.weight_version
        self.weight_version = version
        consumed = min(steps * self.config.batch_groups, len(self._untrained))
        for _ in range(consumed):
            group = self._untrained.popleft()
            group.status = GroupStatus.TRAINED
        self.counts.trained += consumed
        oldest_admissible = version - self.config.max_version_span
        stale: list[Trajectory] = []
        for start_version in sorted(self._by_start_version):
            ids = self._by_start_version[start_version]
            if start_version < oldest_admissible:
                stale.extend(self._live[i] for i in ids)
            elif start_version == oldest_admissible and self.config.promote_at_boundary:
                self._promoted.update(ids)
                self._promoted_changed = True
        for t in stale:
            if t.id in self._live:  # a group drop may already have discarded it
                self.stale_discard_tokens.append(t.generated_tokens)
                self._rerun(t, now, out, f"spans weight versions {t.start_version}..{version}")
        logger.info(
            "weight version %d: %d groups trained, %d stale trajectories re-run, %d promoted",
            version, consumed, len(stale), len(self._promoted),
        )
        return self._finish(now, out)

    # ---- internals -------------------------------------------------------------------------

    def _live_trajectory(self, trajectory_id: int, event: str) -> Trajectory | None:
        t = self._live.get(trajectory_id)
        if t is not None:
            return t
        if 0 <= trajectory_id < self._next_trajectory_id:
            logger.debug("%s: trajectory %d already finished or discarded; ignored", event, trajectory_id)
            return None
        raise ValueError(f"{event}: trajectory {trajectory_id} was never handed out")

    def _finish(self, now: float, out: Decisions) -> Decisions:
        self._admit(now, out)
        self._publish_policy(out)
        return out

    def _admit(self, now: float, out: Decisions) -> None:
        while not self._exhausted and self.in_flight < self.window:
            try:
                prompt = next(self._prompts)
            except StopIteration:
                self._exhausted = True
                logger.info("dataset exhausted after %d groups", self.counts.admitted)
                return
            if not isinstance(prompt, Prompt):
                raise TypeError(f"dataset yielded {type(prompt).__name__}, expected venusrl.types.Prompt")
            group = Group(self._next_group_id, self.counts.admitted, prompt, [], admitted_at=now)
            self._next_group_id += 1
            self.counts.admitted += 1
            self._running[group.id] = group
            for index in range(self.config.group_size):
                group.trajectories.append(self._new_trajectory(group, index, 0, out))
            self._rekey(group, now)

    def _new_trajectory(self, group: Group, index: int, attempt: int, out: Decisions) -> Trajectory:
        t = Trajectory(self._next_trajectory_id, group.id, index, attempt, group.prompt, self.weight_version)
        self._next_trajectory_id += 1
        self._live[t.id] = t
        self._by_start_version.setdefault(t.start_version, set()).add(t.id)
        if self.config.promote_at_boundary and self.config.max_version_span == 0:
            self._promoted.add(t.id)
            self._promoted_changed = True
        out.start.append(t)
        return t

    @staticmethod
    def _adopt(t: Trajectory, record: TrajectoryRecord) -> None:
        where = f"done: trajectory {t.id}: record"
        lengths = {name: len(getattr(record, name)) for name in ("token_ids", "generated_mask", "logprobs")}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"{where} fields differ in length ({lengths})")
        generated = sum(1 for m in record.generated_mask if m)
        if generated != t.generated_tokens:
            raise ValueError(f"{where}.generated_mask marks {generated} tokens, its turns generated {t.generated_tokens}")
        t.token_ids, t.logprobs = record.token_ids, record.logprobs
        t.generated_mask = [bool(m) for m in record.generated_mask]

    def _forget(self, t: Trajectory) -> None:
        """Remove an unfinished trajectory from every index of live ones."""
        del self._live[t.id]
        bucket = self._by_start_version[t.start_version]
        bucket.discard(t.id)
        if not bucket:
            del self._by_start_version[t.start_version]
        if t.id in self._promoted:
            self._promoted.discard(t.id)
            self._promoted_changed = True

    def _rerun(self, t: Trajectory, now: float, out: Decisions, reason: str) -> None:
        self._forget(t)
        t.status = TrajectoryStatus.DISCARDED
        out.discarded.append(t.id)
        self.counts.discarded += 1
        self.counts.discarded_tokens += t.generated_tokens
        group = self._running[t.group_id]
        if t.attempt >= self.config.max_reruns:
            self._drop(group, out, f"trajectory {t.id} (slot {t.index}) {reason}, attempt {t.attempt + 1}")
            return
        logger.info("trajectory %d of group %d discarded (%s); re-running", t.id, group.id, reason)
        group.trajectories[t.index] = self._new_trajectory(group, t.index, t.attempt + 1, out)
        self._rekey(group, now)

    def _drop(self, group: Group, out: Decisions, reason: str) -> None:
        for t in group.trajectories:
            if t.id in self._live:
                self._forget(t)
                t.status = TrajectoryStatus.DISCARDED
                self.counts.discarded += 1
                self.counts.discarded_tokens += t.generated_tokens
                if t in out.start:  # handed out by this same event: take the order back
                    out.start.remove(t)
                else:
                    out.discarded.append(t.id)
        del self._running[group.id]
        self._ranking.remove(group.id)
        group.status = GroupStatus.DROPPED
        self.counts.dropped += 1
        out.dropped.append(group.prompt)
        logger.warning("group %d (prompt %s) dropped: %s", group.id, group.prompt.id, reason)

    def _hand_to_trainer(self, group: Group, now: float, out: Decisions) -> None:
        del self._running[group.id]
        self._ranking.remove(group.id)
        group.status = GroupStatus.READY
        group.ready_at = now
        self._untrained.append(group)
        self.counts.ready += 1
        out.ready.append(group)
        logger.info("group %d (prompt %s) ready after %.3fs", group.id, group.prompt.id, now - group.admitted_at)

    def _rekey(self, group: Group, now: float) -> None:
        key = check_key(self.rule.group_key(group, now, self.stats), group.id)
        self._ranking.upsert(group.id, key, group.seq)

    def _publish_policy(self, out: Decisions) -> None:
        """Republish only when the HIGH set or the promoted set changed."""
        self._ranking.set_critical_count(self.rule.critical_count(self.config.batch_groups, len(self._untrained)))
        if not (self._ranking.changed or self._promoted_changed):
            return
        high = self._ranking.critical() if self._ranking.changed else self._policy.high_groups
        promoted = frozenset(self._promoted) if self._promoted_changed else self._policy.promoted
        self._promoted_changed = False
        if high != self._policy.high_groups or promoted != self._policy.promoted:
            self._policy = PriorityPolicy(self._policy.version + 1, high, promoted)
            out.policy = self._policy
            logger.debug("policy %d: %d high groups, %d promoted", self._policy.version, len(high), len(promoted))
