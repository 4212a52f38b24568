"""Shared test helpers: prompts, configs, and a ledger that checks every Decisions."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from venusrl.coordinator import CoordinatorConfig, DataCoordinator, Decisions
from venusrl.types import GroupStatus, Prompt, TrajectoryStatus


def prompts(n: int) -> list[Prompt]:
    return [Prompt(id=f"p{i}", messages=({"role": "user", "content": f"question {i}"},)) for i in range(n)]


def config(**overrides) -> CoordinatorConfig:
    base = {"group_size": 2, "batch_groups": 2, "async_factor": 1.5, "max_version_span": 2}
    base.update(overrides)
    return CoordinatorConfig(**base)


@dataclass
class Record:
    """A rollout side's record of one trajectory (what the agent loop hands over at done)."""

    token_ids: list[int] = field(default_factory=list)
    generated_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def context(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.generated_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def generated(self, ids: list[int], logprobs: list[float]) -> None:
        self.token_ids += ids
        self.generated_mask += [1] * len(ids)
        self.logprobs += logprobs


class Ledger:
    """Applies each Decisions to a model of the outside world and checks it on the way."""

    def __init__(self, coordinator: DataCoordinator) -> None:
        self.c = coordinator
        self.live: dict[int, int] = {}  # trajectory id -> group id, as the workers see it
        self.ready = Counter()  # prompt id -> times handed to the trainer
        self.dropped = Counter()  # prompt id -> times dropped
        self.discarded: set[int] = set()
        self.policies: list[int] = []
        self.records: defaultdict[int, Record] = defaultdict(Record)  # what each trajectory's turns produced

    def apply(self, out: Decisions) -> Decisions:
        for t in out.start:
            assert t.id not in self.live and t.id not in self.discarded
            assert t.status is TrajectoryStatus.WAITING
            self.live[t.id] = t.group_id
        for tid in out.discarded:
            assert tid not in self.discarded, f"trajectory {tid} discarded twice"
            self.discarded.add(tid)
            self.live.pop(tid, None)
        for group in out.ready:
            assert group.status is GroupStatus.READY
            assert len(group.trajectories) == self.c.config.group_size
            assert all(t.status is TrajectoryStatus.DONE for t in group.trajectories)
            assert all(t.id not in self.discarded for t in group.trajectories)
            self.ready[group.prompt.id] += 1
            assert self.ready[group.prompt.id] == 1, f"prompt {group.prompt.id} handed out twice"
        for prompt in out.dropped:
            self.dropped[prompt.id] += 1
            assert self.dropped[prompt.id] == 1
            assert self.ready[prompt.id] == 0
        if out.policy is not None:
            assert not self.policies or out.policy.version == self.policies[-1] + 1
            self.policies.append(out.policy.version)
        return out

    def done(self, tid: int, now: float, reward: float = 1.0) -> Decisions:
        out = self.apply(self.c.on_trajectory_done(tid, now, reward, record=self.records.pop(tid, None)))
        self.live.pop(tid, None)
        return out
