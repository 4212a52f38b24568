"""Trajectory-aware radix cache over token ids (paper §4.3, Fig. 7). Pure: slots are ints.

Invariants, checked by ``check_integrity``:
- Node keys and values are whole pages; a node's value holds the KV slot of each key token.
- ``lock_ref`` counts running requests whose matched prefix passes through the node; a lock
  covers the whole path to the root, so a locked node's ancestors are locked too.
- ``high_refs``/``low_refs`` count live trajectories whose cached context (the path from the
  root to their anchor node) passes through the node, by effective priority. A trajectory
  referencing a node references its ancestors, so a parent is never in a lower tier than
  its child and every unlocked node of a tier is evictable once its subtree is gone.
- ``_evictable[tier]`` is the token count of unlocked nodes of that tier, kept incrementally
  by ``_unaccount``/``_account`` around every change of lock, refs, children or key length.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Literal

from venusrl.engine.kv_slots import PageAllocator
from venusrl.types import Priority

TrajectoryKey = Hashable


class Tier(IntEnum):
    """Eviction tier of an unlocked node; evicted in this order."""

    UNUSED = 0
    LOW_REF = 1
    HIGH_REF = 2


def max_evictable_tier(priority: Priority) -> Tier:
    """A LOW request may evict unused and low_ref KV; HIGH and PROMOTED may evict any tier."""
    return Tier.LOW_REF if priority == Priority.LOW else Tier.HIGH_REF


@dataclass(slots=True, eq=False)
class RadixNode:
    key: list[int]
    value: list[int]
    parent: RadixNode | None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    lock_ref: int = 0
    high_refs: int = 0
    low_refs: int = 0
    last_access: int = 0
    tier: Tier | None = None  # tier it is accounted in; None while locked (or the root)
    anchored: set[TrajectoryKey] = field(default_factory=set)  # trajectories ending here


@dataclass(slots=True)
class Trajectory:
    priority: Priority  # as declared by the caller
    demoted: bool = False  # residency-aware demotion: counts as LOW while set
    anchor: RadixNode | None = None  # deepest node of its cached context; None: nothing cached
    context_tokens: int = 0  # tokens from the root to the anchor

    @property
    def effective(self) -> Priority:
        return Priority.LOW if self.demoted else self.priority


@dataclass(slots=True, frozen=True)
class PrefixMatch:
    slots: list[int]  # KV slots of the matched, page-aligned prefix
    node: RadixNode  # deepest matched node (the root when nothing matched)


class RadixCache:
    """Radix tree of cached KV. ``policy="lru"`` is SGLang's behaviour: only locks protect."""

    def __init__(self, allocator: PageAllocator, policy: Literal["tiers", "lru"] = "tiers") -> None:
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.policy = policy
        self.root = RadixNode(key=[], value=[], parent=None, lock_ref=1)
        self._tick = 0  # logical clock for LRU order
        self._evictable = [0, 0, 0]
        self._leaves: list[set[RadixNode]] = [set(), set(), set()]  # evictable leaves per tier
        self.evicted_tokens = [0, 0, 0]
        self.trajectories: dict[TrajectoryKey, Trajectory] = {}
        # bumped each time the set of demoted trajectories changes (one demoted or promoted
        # back, a demoted one released): a reader compares it instead of scanning them all
        self.demoted_changes = 0
        self._pending: list[tuple[str, TrajectoryKey, Priority | Sequence[int] | None]] = []

    # ---- queries -------------------------------------------------------------------------

    def evictable_tokens(self, max_tier: Tier) -> int:
        return sum(self._evictable[: max_tier + 1])

    def tier_tokens(self) -> list[int]:
        """Unlocked (evictable) tokens per tier."""
        return list(self._evictable)

    def match_prefix(self, tokens: Sequence[int]) -> PrefixMatch:
        """Longest cached page-aligned prefix of ``tokens``; splits a node to end exactly there."""
        self._tick += 1
        page = self.page_size
        node, slots, pos = self.root, [], 0
        end = len(tokens) - len(tokens) % page
        while pos < end:
            child = node.children.get(tuple(tokens[pos : pos + page]))
            if child is None:
                break
            common = _common_pages(child.key, tokens, pos, end, page)
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = self._tick
            slots.extend(child.value)
            node, pos = child, pos + common
        return PrefixMatch(slots=slots, node=node)

    def path_of(self, node: RadixNode) -> tuple[list[int], list[int]]:
        """Tokens and slots from the root to the end of ``node``."""
        keys, values = [], []
        while node is not self.root:
            keys.append(node.key)
            values.append(node.value)
            node = node.parent
        return [t for key in reversed(keys) for t in key], [s for value in reversed(values) for s in value]

    # ---- mutation ------------------------------------------------------------------------

    def insert(self, tokens: Sequence[int], slots: Sequence[int]) -> tuple[int, RadixNode]:
        """Insert page-aligned ``tokens`` with their ``slots``.

        Returns how many leading tokens were already cached (the caller still owns its slots
        for those and must free them unless they are the tree's own) and the deepest node.
        """
        page = self.page_size
        if len(tokens) != len(slots) or len(tokens) % page:
            raise ValueError("insert needs equal, page-aligned tokens and slots")
        self._tick += 1
        node, pos, end = self.root, 0, len(tokens)
        while pos < end:
            child = node.children.get(tuple(tokens[pos : pos + page]))
            if child is None:
                leaf = RadixNode(key=list(tokens[pos:]), value=list(slots[pos:]), parent=node)
                leaf.last_access = self._tick
                self._unaccount(node)
                node.children[tuple(leaf.key[:page])] = leaf
                self._account(node)
                self._account(leaf)
                return pos, leaf
            common = _common_pages(child.key, tokens, pos, end, page)
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = self._tick
            node, pos = child, pos + common
        return pos, node

    def lock(self, node: RadixNode) -> None:
        self._walk_update(node, lock=1)

    def unlock(self, node: RadixNode) -> None:
        self._walk_update(node, lock=-1)

    def evict(
        self, num_tokens: int, max_tier: Tier, on_evict: Callable[[RadixNode], None] | None = None
    ) -> int:
        """Free at least ``num_tokens`` tokens from tiers up to ``max_tier``, in tier order and
        LRU inside a tier. Returns the tokens freed (whole nodes, so maybe more).
        ``on_evict`` sees each node while it is still in the tree (to save its KV)."""
        freed = 0
        for tier in range(max_tier + 1):
            heap = [(n.last_access, id(n), n) for n in self._leaves[tier]]
            heapq.heapify(heap)
            while freed < num_tokens and heap:
                _, _, node = heapq.heappop(heap)
                if on_evict is not None:
                    on_evict(node)
                parent = self._remove_leaf(node)
                self.evicted_tokens[tier] += len(node.key)
                freed += len(node.key)
                if parent.tier == tier and not parent.children:
                    heapq.heappush(heap, (parent.last_access, id(parent), parent))
            if freed >= num_tokens:
                break
        return freed

    # ---- trajectories: queued, applied at an iteration boundary ---------------------------

    def queue_start(self, key: TrajectoryKey, priority: Priority | None) -> None:
        """Start a trajectory (LOW when ``priority`` is None); for a live one, set the priority
        unless it is None."""
        self._pending.append(("start", key, None if priority is None else Priority(priority)))

    def declared_priorities(self) -> dict[TrajectoryKey, Priority]:
        """Each live trajectory's declared priority with the queued changes folded in, read
        without applying them (a crashed scheduler's state is read, not trusted to mutate)."""
        live = {key: traj.priority for key, traj in self.trajectories.items()}
        for op, key, arg in self._pending:
            if op == "release":
                live.pop(key, None)
            elif op == "start" and key not in live:
                live[key] = Priority.LOW if arg is None else arg
            elif op in ("start", "priority") and key in live and arg is not None:
                live[key] = arg
        return live

    def is_pending_start(self, key: TrajectoryKey) -> bool:
        return any(op == "start" and k == key for op, k, _ in self._pending)

    def queue_release(self, key: TrajectoryKey) -> None:
        self._pending.append(("release", key, None))

    def queue_set_priority(self, key: TrajectoryKey, priority: Priority) -> None:
        self._pending.append(("priority", key, Priority(priority)))

    def queue_anchor(self, key: TrajectoryKey, tokens: Sequence[int]) -> None:
        """Make the trajectory reference the cached prefix of ``tokens`` (imported KV)."""
        self._pending.append(("anchor", key, list(tokens)))

    def apply_pending(self) -> list[TrajectoryKey]:
        """Apply queued mutations in order; returns the released keys.

        Any mutation but a start of an unknown trajectory is a no-op (it was released)."""
        released = []
        pending, self._pending = self._pending, []
        for op, key, arg in pending:
            traj = self.trajectories.get(key)
            if op == "start" and traj is None:
                self.trajectories[key] = Trajectory(priority=Priority.LOW if arg is None else arg)
            elif traj is None or (op == "start" and arg is None):
                continue
            elif op == "release":
                self.set_anchor(key, None)
                self.demoted_changes += traj.demoted
                del self.trajectories[key]
                released.append(key)
            elif op == "anchor":
                node = self.match_prefix(arg).node
                if node is not self.root:
                    self.set_anchor(key, node)
            else:  # "start" of a live trajectory, or "priority"
                self._set_effective(traj, key, priority=arg, demoted=traj.demoted)
        return released

    def set_demoted(self, key: TrajectoryKey, demoted: bool) -> None:
        """Demote or promote back; the scheduler calls it only at an iteration boundary."""
        traj = self.trajectories[key]
        self._set_effective(traj, key, priority=traj.priority, demoted=demoted)

    def set_anchor(self, key: TrajectoryKey, node: RadixNode | None) -> None:
        """Make the trajectory reference the path from the root to ``node`` (None: nothing)."""
        traj = self.trajectories[key]
        high = traj.effective != Priority.LOW
        if traj.anchor is not None:
            traj.anchor.anchored.discard(key)
            self._walk_update(traj.anchor, high=-high, low=-(not high))
        traj.anchor, traj.context_tokens = node, 0
        if node is not None and node is not self.root:
            node.anchored.add(key)
            traj.context_tokens = self._walk_update(node, high=high, low=not high)
        else:
            traj.anchor = None

    # ---- internals -----------------------------------------------------------------------

    def _set_effective(
        self, traj: Trajectory, key: TrajectoryKey, priority: Priority, demoted: bool
    ) -> None:
        anchor = traj.anchor
        self.set_anchor(key, None)
        self.demoted_changes += traj.demoted != demoted
        traj.priority, traj.demoted = priority, demoted
        self.set_anchor(key, anchor)

    def _tier_of(self, node: RadixNode) -> Tier:
        if self.policy == "lru" or not (node.high_refs or node.low_refs):
            return Tier.UNUSED
        return Tier.HIGH_REF if node.high_refs else Tier.LOW_REF

    def _unaccount(self, node: RadixNode) -> None:
        if node.tier is not None:
            self._evictable[node.tier] -= len(node.key)
            self._leaves[node.tier].discard(node)
            node.tier = None

    def _account(self, node: RadixNode) -> None:
        if node.lock_ref > 0:
            return
        node.tier = self._tier_of(node)
        self._evictable[node.tier] += len(node.key)
        if not node.children:
            self._leaves[node.tier].add(node)

    def _walk_update(self, node: RadixNode, lock: int = 0, high: int = 0, low: int = 0) -> int:
        """Add the deltas to ``node`` and every ancestor below the root; returns the path length."""
        depth = 0
        while node is not self.root:
            self._unaccount(node)
            node.lock_ref += lock
            node.high_refs += high
            node.low_refs += low
            if node.lock_ref < 0 or node.high_refs < 0 or node.low_refs < 0:
                raise AssertionError("radix node reference count went negative")
            self._account(node)
            depth += len(node.key)
            node = node.parent
        return depth

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        """Cut ``child`` after ``at`` tokens; the new upper node inherits its counts."""
        page = self.page_size
        parent = child.parent
        self._unaccount(child)
        upper = RadixNode(
            key=child.key[:at], value=child.value[:at], parent=parent,
            lock_ref=child.lock_ref, high_refs=child.high_refs, low_refs=child.low_refs,
            last_access=child.last_access,
        )  # fmt: skip
        parent.children[tuple(upper.key[:page])] = upper
        child.key, child.value, child.parent = child.key[at:], child.value[at:], upper
        upper.children[tuple(child.key[:page])] = child
        self._account(upper)
        self._account(child)
        return upper

    def _remove_leaf(self, node: RadixNode) -> RadixNode:
        """Evict one unlocked leaf; trajectories anchored on it now end at its parent."""
        parent = node.parent
        self._unaccount(node)
        self.allocator.free(self.allocator.pages_of(node.value))
        self._unaccount(parent)
        del parent.children[tuple(node.key[: self.page_size])]
        self._account(parent)
        for key in node.anchored:
            traj = self.trajectories[key]
            traj.context_tokens -= len(node.key)
            traj.anchor = parent if parent is not self.root else None
            if traj.anchor is not None:
                parent.anchored.add(key)
        return parent

    def check_integrity(self, expected_locks: dict[RadixNode, int]) -> list[int]:
        """Verify every invariant; ``expected_locks`` maps each locked-by-request node to its
        count of holders. Returns the pages the tree holds."""
        page = self.page_size
        locks_from = dict(expected_locks)
        refs: dict[RadixNode, list[int]] = {}
        for key, traj in self.trajectories.items():
            node, depth = traj.anchor, 0
            if node is not None and key not in node.anchored:
                raise AssertionError(f"trajectory {key!r} missing from its anchor")
            while node is not None and node is not self.root:
                refs.setdefault(node, [0, 0])[traj.effective == Priority.LOW] += 1
                depth += len(node.key)
                node = node.parent
            if depth != traj.context_tokens:
                raise AssertionError(f"trajectory {key!r} context {traj.context_tokens} != {depth}")
        evictable, leaves, pages = [0, 0, 0], [set(), set(), set()], []
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for first, child in node.children.items():
                if child.parent is not node or tuple(child.key[:page]) != first:
                    raise AssertionError("child link broken")
            if node is self.root:
                continue
            if len(node.key) != len(node.value) or not node.key or len(node.key) % page:
                raise AssertionError("node key/value not whole pages")
            own_locks = locks_from.pop(node, 0)
            child_locks = sum(c.lock_ref for c in node.children.values())
            if node.lock_ref != own_locks + child_locks:
                raise AssertionError(f"lock_ref {node.lock_ref} != {own_locks} + {child_locks}")
            if [node.high_refs, node.low_refs] != refs.get(node, [0, 0]):
                raise AssertionError("trajectory counts disagree with anchors")
            for key in node.anchored:
                if self.trajectories[key].anchor is not node:
                    raise AssertionError(f"stale anchor of {key!r}")
            pages.extend(self.allocator.pages_of(node.value))
            if node.lock_ref == 0:
                tier = self._tier_of(node)
                if node.tier != tier:
                    raise AssertionError(f"node accounted in {node.tier}, is {tier}")
                evictable[tier] += len(node.key)
                if not node.children:
                    leaves[tier].add(node)
            elif node.tier is not None:
                raise AssertionError("locked node accounted as evictable")
        if locks_from:
            raise AssertionError("locks expected on nodes no longer in the tree")
        if evictable != self._evictable or leaves != self._leaves:
            raise AssertionError(f"evictable {self._evictable} != recount {evictable}")
        return pages


def _common_pages(key: list[int], tokens: Sequence[int], pos: int, end: int, page: int) -> int:
    """Length of the common prefix of ``key`` and ``tokens[pos:end]``, floored to whole pages.
    Slices are compared in C: whole when they agree (the common case: a hit runs the whole
    node), else by bisection over pages for the first page that differs."""
    n = min(len(key), end - pos)
    n -= n % page
    if key[:n] == list(tokens[pos : pos + n]):
        return n
    lo, hi = 0, n // page  # pages [0, lo) agree; one of [lo, hi) differs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if key[lo * page : mid * page] == list(tokens[pos + lo * page : pos + mid * page]):
            lo = mid
        else:
            hi = mid
    return lo * page
