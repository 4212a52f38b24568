"""Trajectory holds: the three-tier residency of our radix cache (paper §4.3) as vLLM's block
pool allows it. Pure: blocks are ints; `vllm/tiers.py` applies what this book decides to vLLM.

vLLM frees a finished request's KV blocks at once: hashed blocks go to the tail of its free
queue (LRU) and stay matchable until another request takes them. A *hold* keeps one reference
on each hashed block of a live trajectory's last request, so nothing can take them; the
trajectory's next turn hits them. Tiers, evicted in this order:
- unused: blocks no hold and no request references: vLLM's own free queue (LRU);
- LOW-held: held by a LOW trajectory, or a HIGH one while demoted;
- HIGH-held: held by a HIGH or PROMOTED trajectory.
A LOW request may release LOW holds only; HIGH and PROMOTED requests any (`max_hold_tier`).
Inside a tier the least recently used hold goes first.

Invariants, checked by `check`:
- a trajectory has at most one hold; `refs[b]` is the number of holds naming block `b`, so
  a block is handed back (`release`, `take`, `evict`, replaced by `keep`) exactly as often as
  it was held, and never below zero;
- only live trajectories hold; releasing a trajectory hands its hold back;
- `held_tokens[tier]` is the sum of the tokens of the holds in that tier.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from venusrl.engine.demotion import choose_demoted
from venusrl.types import Priority

Key = Hashable
Blocks = tuple[int, ...]


class HoldTier(IntEnum):
    """Eviction tier of a hold; released in this order (vLLM's free queue goes before both)."""

    LOW = 0
    HIGH = 1


def max_hold_tier(priority: Priority, alone: bool = False) -> HoldTier:
    """The holds a request may release for its blocks: LOW ones for a LOW request, all for a
    HIGH or PROMOTED one, and all for a request that is the iteration's only work (work
    conservation, as `admission.Step.eviction_tier`: an engine that idles to keep KV for
    trajectories that are not running can deadlock on the very place their next turns need)."""
    return HoldTier.HIGH if alone or priority != Priority.LOW else HoldTier.LOW


@dataclass(slots=True)
class _Trajectory:
    priority: Priority  # as declared by the caller
    demoted: bool = False  # residency-aware demotion: holds and runs as LOW while set
    hold: Blocks = ()  # blocks it keeps one reference on, in sequence order
    hold_tokens: int = 0  # tokens those blocks hold
    last_use: int = 0  # logical time the hold was taken (LRU inside a tier)
    computed: int = 0  # most tokens of its sequence computed since the last cache reset

    @property
    def tier(self) -> HoldTier:
        return HoldTier.LOW if self.demoted or self.priority == Priority.LOW else HoldTier.HIGH


@dataclass(slots=True)
class HoldBook:
    """Live trajectories, their holds, and the counts the engine reports."""

    trajectories: dict[Key, _Trajectory] = field(default_factory=dict)
    refs: Counter[int] = field(default_factory=Counter)  # block -> holds naming it
    held_tokens: list[int] = field(default_factory=lambda: [0, 0])  # per HoldTier
    evicted_tokens: list[int] = field(default_factory=lambda: [0, 0])  # holds released for room, per tier
    recomputed_tokens: int = 0
    demotions: int = 0
    promotions: int = 0
    _tick: int = 0

    # ---- trajectories ---------------------------------------------------------------------

    def __contains__(self, key: Key) -> bool:
        return key in self.trajectories

    def start(self, key: Key, priority: Priority) -> None:
        """A trajectory is live at `priority` (a live one changes priority: its hold, if any,
        moves tier)."""
        trajectory = self.trajectories.get(key)
        if trajectory is None:
            self.trajectories[key] = _Trajectory(priority)
            return
        self._set(trajectory, priority=priority, demoted=trajectory.demoted)

    def release(self, key: Key) -> Blocks:
        """The trajectory is over: its hold's blocks, to hand back (nothing if it was not live)."""
        trajectory = self.trajectories.pop(key, None)
        return () if trajectory is None else self._drop(trajectory)

    def effective(self, key: Key) -> Priority | None:
        """The priority its requests run at: LOW while demoted; None if not live."""
        trajectory = self.trajectories.get(key)
        if trajectory is None:
            return None
        return Priority.LOW if trajectory.demoted else trajectory.priority

    def demoted(self) -> set[Key]:
        return {key for key, t in self.trajectories.items() if t.demoted}

    # ---- holds ----------------------------------------------------------------------------

    def keep(self, key: Key, blocks: Blocks, tokens: int) -> Blocks:
        """A request of live trajectory `key` ended with `blocks` (hashed, in sequence order,
        covering `tokens`): the trajectory now holds them (the caller has taken one reference
        on each). Returns its previous hold's blocks, to hand back."""
        trajectory = self.trajectories[key]
        old = self._drop(trajectory)
        self._tick += 1
        trajectory.hold, trajectory.hold_tokens, trajectory.last_use = tuple(blocks), tokens, self._tick
        self.refs.update(trajectory.hold)
        self.held_tokens[trajectory.tier] += tokens
        return old

    def take(self, key: Key) -> Blocks:
        """The trajectory's next request holds its own references now: the hold ends."""
        trajectory = self.trajectories.get(key)
        return () if trajectory is None else self._drop(trajectory)

    def victims(self, max_tier: HoldTier, exclude: Key | None = None) -> Iterator[Key]:
        """Trajectories whose holds may be released for room, in eviction order: LOW-held
        before HIGH-held, least recently used first inside a tier; never `exclude` (the
        requester's own, which its request is about to take). The order is fixed when asked
        (each hold's `last_use` is distinct, so there are no ties)."""
        held = {key: t for key, t in self.trajectories.items() if t.hold and t.tier <= max_tier and key != exclude}
        return iter(sorted(held, key=lambda key: (held[key].tier, held[key].last_use)))

    def evict(self, key: Key) -> Blocks:
        """Release `key`'s hold for room: its blocks, to hand back (counted as evicted)."""
        trajectory = self.trajectories[key]
        self.evicted_tokens[trajectory.tier] += trajectory.hold_tokens
        return self._drop(trajectory)

    def clear(self) -> Blocks:
        """Every hold ends and nothing counts as computed (vLLM's prefix cache is being
        reset: weights changed, so no held KV is valid)."""
        blocks: list[int] = []
        for trajectory in self.trajectories.values():
            blocks.extend(self._drop(trajectory))
            trajectory.computed = 0
        return tuple(blocks)

    def held(self, key: Key) -> tuple[Blocks, int]:
        trajectory = self.trajectories[key]
        return trajectory.hold, trajectory.hold_tokens

    def context_tokens(self, key: Key) -> int:
        """What its next turn needs back: the most of its sequence computed since the last
        cache reset, or its hold if longer. Not just what is still held, so a demoted
        trajectory whose hold went for room stays demoted until HIGH ones finish (rather
        than counting for nothing the moment its KV is gone and being promoted at once)."""
        trajectory = self.trajectories[key]
        return max(trajectory.hold_tokens, trajectory.computed)

    # ---- recomputation --------------------------------------------------------------------

    def computed(self, key: Key, tokens: int) -> None:
        """`tokens` of the trajectory's sequence have KV now (its request ends or is preempted)."""
        trajectory = self.trajectories.get(key)
        if trajectory is not None:
            trajectory.computed = max(trajectory.computed, tokens)

    def admitted(self, key: Key, prompt_tokens: int, hits: int) -> int:
        """A request of `key` with `prompt_tokens` starts with `hits` of them cached: what it
        computes again (computed before for the trajectory, beyond the hits), counted."""
        trajectory = self.trajectories.get(key)
        before = 0 if trajectory is None else trajectory.computed
        again = max(0, min(before, prompt_tokens) - hits)
        self.recomputed_tokens += again
        return again

    # ---- demotion -------------------------------------------------------------------------

    def rebalance(self, contexts: Mapping[Key, int], exclusive: Mapping[Key, int], demand: int,
                  capacity_tokens: int, active: Collection[Key] | None = None) -> set[Key]:
        """Residency-aware demotion: of the HIGH/PROMOTED trajectories in `contexts` (their
        context tokens), demote HIGH ones shortest context first until the rest fit
        (`demotion.choose_demoted`, with shared blocks counted once: `high_demand`; with
        `active`, the idle ones first); every other trajectory is promoted back. Returns the
        trajectories whose state changed."""
        demotable = {key: self.trajectories[key].priority == Priority.HIGH for key in contexts}
        chosen = choose_demoted(contexts, demotable, capacity_tokens, exclusive, demand, active)
        changed = set()
        for key, trajectory in self.trajectories.items():
            if trajectory.demoted != (key in chosen):
                self._set(trajectory, priority=trajectory.priority, demoted=key in chosen)
                changed.add(key)
                if key in chosen:
                    self.demotions += 1
                else:
                    self.promotions += 1
        return changed

    # ---- internals ------------------------------------------------------------------------

    def _set(self, trajectory: _Trajectory, priority: Priority, demoted: bool) -> None:
        self.held_tokens[trajectory.tier] -= trajectory.hold_tokens
        trajectory.priority, trajectory.demoted = priority, demoted
        self.held_tokens[trajectory.tier] += trajectory.hold_tokens

    def _drop(self, trajectory: _Trajectory) -> Blocks:
        blocks = trajectory.hold
        self.refs.subtract(blocks)
        for block in blocks:
            if self.refs[block] == 0:
                del self.refs[block]
        self.held_tokens[trajectory.tier] -= trajectory.hold_tokens
        trajectory.hold, trajectory.hold_tokens = (), 0
        return blocks

    def check(self) -> None:
        """The invariants above; AssertionError naming the first one broken."""
        counted: Counter[int] = Counter()
        tokens = [0, 0]
        for key, trajectory in self.trajectories.items():
            counted.update(trajectory.hold)
            tokens[trajectory.tier] += trajectory.hold_tokens
            assert trajectory.hold or not trajectory.hold_tokens, f"{key!r} holds tokens but no block"
        assert counted == self.refs, f"hold references {dict(self.refs)} != the holds' blocks {dict(counted)}"
        assert all(n > 0 for n in self.refs.values()), f"a block held a non-positive number of times: {self.refs}"
        assert tokens == self.held_tokens, f"held tokens per tier {self.held_tokens} != {tokens}"


def high_demand(paths: Mapping[Key, set[int]], uncached: Mapping[Key, int], block_size: int) -> tuple[int, dict[Key, int]]:
    """KV the HIGH trajectories need with shared blocks counted once (a group's prompt blocks
    are one demand, not K), and what demoting each would free: the blocks no other of them
    references, plus its tokens not in any block yet. `paths`: each trajectory's blocks (held
    or its requests'); `uncached`: its context tokens beyond them. As `demotion.distinct_high_demand`
    over the radix tree, with vLLM's blocks for its nodes."""
    sharing: Counter[int] = Counter()
    for blocks in paths.values():
        sharing.update(blocks)
    demand = len(sharing) * block_size + sum(uncached.values())
    exclusive = {key: uncached[key] + block_size * sum(1 for b in blocks if sharing[b] == 1)
                 for key, blocks in paths.items()}
    return demand, exclusive
