"""Generation slots of one engine, granted per action (paper §4.3). Pure: no asyncio, no
engine; the rollout worker turns its decisions into waits and aborts.

Modes:
- `priority` (venusrl): a trajectory holds a slot only while it generates; waiting ones are
  granted in priority order (PROMOTED, HIGH, LOW; arrival order inside, after the caller's
  `critical_order` for HIGH waiters when given), so LOW work takes a slot only when no more
  urgent work wants it; a PROMOTED/HIGH request that finds every slot taken preempts the most
  recently granted LOW holder.
- `action_level` (ROLL Flash): slots per action, first come first served, no preemption.
- `trajectory_level` (slime): a trajectory keeps its slot through its tool calls until it ends.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Container, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from venusrl.types import Priority

SlotMode = Literal["priority", "action_level", "trajectory_level"]


@dataclass(slots=True)
class SlotScheduler:
    slots: int
    mode: SlotMode = "priority"
    # priority mode: orders HIGH waiters before their arrival (ascending), read at grant time
    critical_order: Callable[[Hashable], float] | None = None
    holders: dict[Hashable, int] = field(default_factory=dict)  # trajectory -> grant order
    priorities: dict[Hashable, Priority] = field(default_factory=dict)
    waiting: dict[Hashable, int] = field(default_factory=dict)  # trajectory -> arrival order
    _order: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")

    def request(self, trajectory: Hashable, priority: Priority) -> tuple[bool, Hashable | None]:
        """(granted now, trajectory preempted to make room or None). Not granted: it waits
        until `release` grants it."""
        self.priorities[trajectory] = priority
        if trajectory in self.holders:
            return True, None
        if len(self.holders) < self.slots:
            self._grant(trajectory)
            return True, None
        victim = self._preempt_for(trajectory)
        if victim is not None:
            return True, victim
        self.waiting.setdefault(trajectory, next(self._order))
        return False, None

    def release(self, trajectory: Hashable, finished: bool) -> list[Hashable]:
        """The trajectory's action ended (`finished`: the trajectory too); returns the
        trajectories granted a slot by it."""
        self.waiting.pop(trajectory, None)
        if finished:
            self.priorities.pop(trajectory, None)
        if self.mode == "trajectory_level" and not finished:
            return []
        self.holders.pop(trajectory, None)
        granted = []
        while self.waiting and len(self.holders) < self.slots:
            best = self.next_waiter()
            del self.waiting[best]
            self._grant(best)
            granted.append(best)
        return granted

    @property
    def idle(self) -> bool:
        """A slot is free and nobody here waits for one."""
        return len(self.holders) < self.slots and not self.waiting

    def next_waiter(self) -> Hashable | None:
        """The waiter the next free slot goes to."""
        return min(self.waiting, key=self._rank) if self.waiting else None

    def last_waiter(self, excluded: Container[Hashable] = ()) -> Hashable | None:
        """The waiter a free slot would go to last (least urgent, latest), not in `excluded`."""
        candidates = [t for t in self.waiting if t not in excluded]
        return max(candidates, key=self._rank) if candidates else None

    def set_priority(self, trajectory: Hashable, priority: Priority) -> None:
        """Takes effect at the next grant or preemption (a holder keeps its slot until
        `serve_urgent` or an urgent request takes it)."""
        if trajectory in self.priorities:
            self.priorities[trajectory] = priority

    def serve_urgent(self) -> list[tuple[Hashable, Hashable]]:
        """(waiter granted, LOW holder preempted for it) pairs, while a PROMOTED/HIGH turn
        waits here and a LOW turn holds a slot (priority mode). A request preempts when it
        asks; this restores the same state after priorities changed under waiting turns
        (a holder demoted or re-ranked LOW after an urgent turn queued behind it), so an
        urgent turn never waits behind LOW work. Each pair frees one slot for one waiter."""
        pairs = []
        while self.waiting:
            waiter = self.next_waiter()
            victim = self._preempt_for(waiter)
            if victim is None:
                break
            pairs.append((waiter, victim))
        return pairs

    def _preempt_for(self, trajectory: Hashable) -> Hashable | None:
        """In priority mode, an urgent `trajectory` takes the slot of the most recently granted
        LOW holder, which queues again; returns that holder, or None (nothing changed)."""
        urgent = self.mode == "priority" and self.priorities[trajectory] < Priority.LOW
        victim = self._preemptible() if urgent else None
        if victim is not None:
            del self.holders[victim]
            self.waiting[victim] = next(self._order)
            self._grant(trajectory)
        return victim

    def _grant(self, trajectory: Hashable) -> None:
        # a waiter asking again at a higher priority may be granted here: it waits no more
        self.waiting.pop(trajectory, None)
        self.holders[trajectory] = next(self._order)

    def _rank(self, trajectory: Hashable) -> tuple[int, float, int]:
        priority = self.priorities[trajectory] if self.mode == "priority" else Priority.LOW
        ordered = priority == Priority.HIGH and self.critical_order is not None
        return priority, self.critical_order(trajectory) if ordered else 0.0, self.waiting[trajectory]

    def _preemptible(self) -> Hashable | None:
        low = [t for t in self.holders if self.priorities.get(t) == Priority.LOW]
        return max(low, key=self.holders.__getitem__) if low else None


def steal_candidate(engines: Sequence[SlotScheduler], target: int, excluded: Container[Hashable] = (),
                    pays: Callable[[SlotScheduler], bool] = lambda _: True) -> tuple[int, Hashable] | None:
    """(source engine, trajectory) to move to `target` when its slots idle: the last waiter of
    the engine with the most waiters where a move `pays` (`excluded`: trajectories already
    moving). Trajectories stay on their engine for their KV; once an engine would idle while
    another has turns queued, moving one (with its prefix KV) keeps both generating
    (priority mode only). The last waiter, not the next: it would wait longest where it is,
    and the move's own time then delays the least urgent turn, not the critical one the
    source is about to serve."""
    if not engines[target].idle:
        return None
    sources = sorted((i for i, e in enumerate(engines) if i != target and e.waiting),
                     key=lambda i: -len(engines[i].waiting))
    for source in sources:
        waiter = engines[source].last_waiter(excluded)
        if waiter is not None and pays(engines[source]):
            return source, waiter
    return None
