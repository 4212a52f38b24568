"""Checkpoint and resume: a run snapshotted at a weight step, killed later and restored from
the snapshot trains every prompt exactly once."""

from __future__ import annotations

import itertools
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.coordinator.coord_harness import Record, config, prompts

from venusrl.coordinator import DataCoordinator
from venusrl.coordinator.snapshot import CoordinatorSnapshot
from venusrl.types import TrajectoryStatus


class Run:
    """Drives a coordinator like a worker + trainer: finishes random trajectories, steps the
    weights whenever B groups are ready."""

    def __init__(self, coordinator: DataCoordinator, ready: list, rng: random.Random) -> None:
        self.c, self.rng = coordinator, rng
        self.fifo = list(ready)  # what the trainer has received and not yet trained
        self.live: dict[int, object] = {}
        self.trained: list[str] = []
        self.now = 0.0

    def apply(self, out) -> None:
        for t in out.start:
            self.live[t.id] = t
        for tid in out.discarded:
            self.live.pop(tid, None)
        self.fifo.extend(out.ready)

    def event(self) -> bool:
        """One trajectory runs a turn and finishes; False when nothing is left to do."""
        self.now += 1.0
        B = self.c.config.batch_groups
        if len(self.fifo) >= B or (not self.live and self.fifo):
            batch, self.fifo = self.fifo[:B], self.fifo[B:]
            self.trained += [g.prompt.id for g in batch]
            self.apply(self.c.on_weight_version(self.c.weight_version + 1, self.now))
            return True
        if not self.live:
            return False
        tid = self.rng.choice(sorted(self.live))
        t = self.live.pop(tid)
        if t.status is not TrajectoryStatus.WAITING:
            return True
        self.apply(self.c.on_turn_start(tid, self.now, [1, 2]))
        self.apply(self.c.on_turn_end(tid, self.now, [3], [-0.5], self.c.weight_version, tool_call=False))
        self.apply(self.c.on_trajectory_done(tid, self.now, reward=1.0))
        return True


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), crash_after=st.integers(1, 6), lost_events=st.integers(0, 12),
       n=st.integers(1, 14), k=st.integers(1, 3), b=st.integers(1, 3))
def test_resume_trains_every_prompt_exactly_once(seed, crash_after, lost_events, n, k, b):
    dataset = prompts(n)
    cfg = config(group_size=k, batch_groups=b, async_factor=1.5, max_version_span=3)
    run = Run(DataCoordinator(cfg, iter(dataset)), [], random.Random(seed))
    run.apply(run.c.start(0.0))
    snapshot, trained_at_snapshot = None, []
    while run.event():
        if run.c.weight_version == crash_after and snapshot is None:
            snapshot = CoordinatorSnapshot.from_bytes(run.c.snapshot().to_bytes())
            trained_at_snapshot = list(run.trained)
            for _ in range(lost_events):  # progress after the checkpoint, lost in the crash
                if not run.event():
                    break
            break
    if snapshot is not None:
        assert snapshot.ready == [] or all(g.all_done for g in snapshot.ready)
        remaining = itertools.islice(iter(dataset), snapshot.prompts_consumed, None)
        restored = DataCoordinator.restore(cfg, snapshot, remaining)
        assert [g.id for g in restored.untrained_groups()] == [g.id for g in snapshot.ready]
        run = Run(restored, restored.untrained_groups(), random.Random(seed + 1))
        run.trained = trained_at_snapshot
        run.apply(restored.start(1000.0))
        while run.event():
            pass
    assert Counter(run.trained) == Counter(p.id for p in dataset)


def test_restore_keeps_done_trajectories_and_reruns_the_rest():
    c = DataCoordinator(config(group_size=3, batch_groups=1, async_factor=1.0), iter(prompts(2)))
    first = c.start(0.0).start
    done, unfinished = first[0], first[1:]
    c.on_turn_start(done.id, 1.0, [1])
    c.on_turn_end(done.id, 2.0, [2, 3], [-0.1, -0.2], 0, tool_call=False)
    c.on_trajectory_done(done.id, 3.0, reward=0.5, record=Record([1, 2, 3], [0, 1, 1], [0.0, -0.1, -0.2]))
    c.on_turn_start(unfinished[0].id, 3.0, [1])  # mid-turn when the process dies
    snapshot = c.snapshot()
    restored = DataCoordinator.restore(c.config, snapshot, iter(prompts(2)[1:]))
    starts = restored.start(10.0).start
    assert [t.index for t in starts] == [1, 2]
    assert all(t.id >= snapshot.next_trajectory_id for t in starts)
    group = restored.group(done.group_id)
    kept = group.trajectories[0]
    assert kept.status is TrajectoryStatus.DONE and kept.reward == 0.5 and kept.token_ids == [1, 2, 3]
    assert restored.counts.admitted == 1  # the second prompt waits for the window


def test_snapshot_is_independent_of_the_live_coordinator():
    c = DataCoordinator(config(group_size=1, batch_groups=1, async_factor=1.0), iter(prompts(3)))
    (t,) = c.start(0.0).start
    snapshot = c.snapshot()
    c.on_turn_start(t.id, 1.0, [7, 8])
    assert c.trajectory(t.id).pending_context_tokens == 2
    assert snapshot.running[0].trajectories[0].pending_context_tokens == 0
