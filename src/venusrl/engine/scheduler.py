"""Priority-aware continuous-batching scheduler (pure: KV slots are integers).

Contract for a runner (or the simulator's cost model), strictly alternating:

1. ``batch = scheduler.schedule()`` applies queued trajectory changes (start, release,
   priority) and demotion at this iteration boundary, then forms one mixed batch. For each
   ``batch.items`` entry (``ScheduledRequest``) the runner writes the KV of ``token_ids`` (at
   ``positions``) into ``new_slots`` and attends over ``context_slots`` causally. Items with
   ``sample`` set need one sampled token (use ``sampling``). ``batch.retracted`` requests went
   back to waiting; ``batch.finished`` ended while scheduling; ``batch.aborted`` were aborted
   since the last batch: the runner drops any per-request state it keeps for all three.
2. ``finished = scheduler.on_batch_done(batch, sampled, stopped)`` with ``sampled`` mapping
   request id to the token drawn for each item with ``sample`` set, and ``stopped`` the ids
   whose text hit a stop string (the runner checks strings, the scheduler checks stop token
   ids and ``max_new_tokens``). Returns the requests that finished, with their output.

Slots given out in a batch stay valid until ``on_batch_done``: nothing is reallocated in
between, even when a request of the batch is aborted meanwhile.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Mapping, Sequence

from venusrl.engine.batch import Batch, KVCopy, ScheduledRequest
from venusrl.engine.config import EngineConfig
from venusrl.engine.demotion import choose_demoted
from venusrl.engine.host_tier import HostTier
from venusrl.engine.kv_slots import PageAllocator
from venusrl.engine.radix_cache import RadixCache, RadixNode, Tier, max_evictable_tier
from venusrl.engine.request import MAX_TRAJECTORY_ID_CHARS, PartialOutput, Request, RequestStatus
from venusrl.engine.stats import Counters, EngineStats
from venusrl.types import Priority, SamplingParams


def check_trajectory_id(trajectory_id: str) -> None:
    if not isinstance(trajectory_id, str) or not 0 < len(trajectory_id) <= MAX_TRAJECTORY_ID_CHARS:
        shown = trajectory_id[:40] + "..." if isinstance(trajectory_id, str) else repr(trajectory_id)
        raise ValueError(f"trajectory_id must be a string of 1 to {MAX_TRAJECTORY_ID_CHARS} characters, got {shown!r}")


def by_priority(requests: Sequence[Request]) -> list[Request]:
    """PROMOTED, then HIGH, then LOW; queue order inside each (a linear partition, not a sort)."""
    buckets: tuple[list[Request], ...] = ([], [], [])
    for request in requests:
        buckets[request.priority].append(request)
    return buckets[0] + buckets[1] + buckets[2]


class Scheduler:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.allocator = PageAllocator(config.kv_capacity_tokens, config.page_size)
        self.cache = RadixCache(self.allocator, config.cache_policy)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.counters = Counters()
        self._arrivals = 0
        self._in_flight = False
        self._aborted: list[str] = []
        self._computed_by_trajectory: dict[Hashable, int] = {}  # longest sequence computed
        self._reservation: RadixNode | None = None  # locked prefix of an open reserve_prefix
        self.host: HostTier | None = None
        if config.host_kv_capacity_tokens >= config.page_size:
            self.host = HostTier(config.host_kv_capacity_tokens, config.page_size)
        self._kv_copies: list[KVCopy] = []  # device <-> host copies owed before the next forward
        self._idle_since: dict[str, float] = {}  # caller trajectories seen with no request, since when

    # ---- caller API ----------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        priority: Priority | None = None,
        trajectory_id: str | None = None,
    ) -> Request:
        """Queue a request. Its trajectory (an implicit one per request when ``trajectory_id``
        is None) is started with ``priority`` (LOW when None), or set to it if already live
        (kept when None). The request runs at its trajectory's effective priority."""
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) > self.allocator.capacity_tokens - self.allocator.page_size:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens exceeds the KV pool")
        if trajectory_id is not None:
            check_trajectory_id(trajectory_id)
        key = trajectory_id if trajectory_id is not None else ("request", request_id)
        self.cache.queue_start(key, priority)
        self._arrivals += 1
        request = Request(
            request_id=request_id, prompt_ids=list(prompt_ids), sampling=sampling,
            trajectory_key=key, trajectory_id=trajectory_id, priority=Priority.LOW if priority is None else Priority(priority),
            arrival=self._arrivals,
        )  # fmt: skip
        self.requests[request_id] = request
        self.waiting.append(request)
        return request

    def start_trajectory(self, trajectory_id: str, priority: Priority) -> None:
        check_trajectory_id(trajectory_id)
        self.cache.queue_start(trajectory_id, priority)

    def knows_trajectory(self, trajectory_id: str) -> bool:
        """Live, or started since the last boundary."""
        return trajectory_id in self.cache.trajectories or self.cache.is_pending_start(trajectory_id)

    def release_idle(self, now: float, ttl: float) -> list[str]:
        """Queue the release of caller trajectories that have had no request here for ``ttl``
        (a client that never released them: their records and low_ref pins would stay
        forever). A trajectory's idle time starts at the first call that sees it idle, so
        the precision is the caller's calling interval. Returns the released ids."""
        busy = {request.trajectory_key for request in self.requests.values()}
        expired = []
        for key in self.cache.trajectories:
            if not isinstance(key, str):
                continue  # an implicit per-request trajectory ends with its request
            if key in busy:
                self._idle_since.pop(key, None)
            elif now - self._idle_since.setdefault(key, now) >= ttl:
                expired.append(key)
        for key in expired:
            self.cache.queue_release(key)
        return expired

    def apply_trajectory_changes(self) -> None:
        """Apply queued trajectory starts, releases and priority changes now (``schedule``
        does it at every boundary; between steps it is a boundary too)."""
        if self._in_flight:
            raise RuntimeError("trajectory changes applied while a batch is in flight")
        for key in self.cache.apply_pending():
            self._computed_by_trajectory.pop(key, None)
            self._idle_since.pop(key, None)

    def release_trajectory(self, trajectory_id: str) -> None:
        check_trajectory_id(trajectory_id)
        self.cache.queue_release(trajectory_id)

    def set_priority(self, trajectory_id: str, priority: Priority) -> None:
        self.cache.queue_set_priority(trajectory_id, priority)

    def abort(self, request_id: str) -> PartialOutput:
        """Remove a request; its computed KV stays cached so a resumed request hits it."""
        request = self.requests[request_id]
        if request.status is RequestStatus.RUNNING:
            self._release_kv(request)
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._aborted.append(request_id)
        return self._end(request, RequestStatus.ABORTED, "abort")

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def demoted_trajectories(self) -> set[Hashable]:
        """Trajectories residency-aware demotion has made LOW (they get no KV from HIGH work)."""
        return {key for key, trajectory in self.cache.trajectories.items() if trajectory.demoted}

    # ---- prefix KV transfer (migration between engines) ---------------------------------

    def cached_prefix_slots(self, token_ids: Sequence[int]) -> list[int]:
        """Slots of the longest cached page-aligned prefix of ``token_ids``, for export."""
        return self.cache.match_prefix(token_ids).slots

    def reserve_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], int]:
        """Reserve slots to import the KV of ``token_ids`` (whole pages only). Returns the new
        slots, for ``token_ids[offset : offset + len(slots)]``, and ``offset``, the tokens
        already cached here. Evicts only unused and low_ref KV and reserves as many pages as
        that allows. The caller loads the KV into the slots, then calls ``commit_prefix``."""
        if self._in_flight or self._reservation is not None:
            raise RuntimeError("reserve_prefix needs an idle scheduler and no open reservation")
        page = self.allocator.page_size
        match = self.cache.match_prefix(token_ids)
        self.cache.lock(match.node)  # the matched prefix must survive our own eviction
        offset = len(match.slots)
        wanted = (len(token_ids) - offset) // page
        pages = self._take_pages(min(wanted, self._available_pages(Tier.LOW_REF)), Tier.LOW_REF)
        self._reservation = match.node
        return [s for p in pages for s in self.allocator.page_slots(p)], offset

    def commit_prefix(
        self,
        token_ids: Sequence[int],
        new_slots: list[int],
        offset: int,
        trajectory_id: str | None = None,
    ) -> int:
        """Insert the reserved, now loaded, slots into the cache; returns the tokens cached.
        With ``trajectory_id``, the trajectory references the prefix from the next boundary."""
        node, self._reservation = self._reservation, None
        if node is None:
            raise RuntimeError("commit_prefix without reserve_prefix")
        end = offset + len(new_slots)
        tokens = list(token_ids[:end])
        slots = self.cache.match_prefix(tokens[:offset]).slots + new_slots
        existing, _ = self.cache.insert(tokens, slots)
        # Nothing ran since the reservation, so nothing else inserted: all new slots are kept.
        if existing != offset:
            raise AssertionError(
                f"prefix changed between reserve and commit ({existing} != {offset})"
            )
        self.cache.unlock(node)
        if trajectory_id is not None:
            self.cache.queue_anchor(trajectory_id, tokens)
        return end

    def drop_all_kv(self) -> int:
        """Forget every computed token, as new weights make them stale: running requests go
        back to waiting (their outputs so far kept) and will prefill again, and the whole
        tree is evicted. Returns the tokens dropped. Only between batches."""
        if self._in_flight:
            raise RuntimeError("drop_all_kv() called while a batch is in flight")
        for request in reversed(self.running):
            self._release_kv(request)
            self.waiting.insert(0, request)
            request.status = RequestStatus.WAITING
        self.running.clear()
        if self.host is not None:
            self.host.drop_all()
        self._kv_copies.clear()  # owed saves of stale KV are void
        return self.cache.evict(self.allocator.capacity_tokens, Tier.HIGH_REF)

    # ---- one iteration -------------------------------------------------------------------

    def schedule(self) -> Batch:
        if self._in_flight or self._reservation is not None:
            raise RuntimeError(
                "schedule() called with a batch in flight or a prefix reservation open"
            )
        self.apply_trajectory_changes()
        self._rebalance_demotion()
        for request in self.requests.values():
            trajectory = self.cache.trajectories.get(request.trajectory_key)
            if trajectory is not None:  # a released trajectory's requests keep their last priority
                request.priority = trajectory.effective
        batch = Batch(aborted=self._aborted)
        self._aborted = []
        items: dict[str, ScheduledRequest] = {}
        budget = self._schedule_running(batch, items, self.config.max_prefill_tokens)
        self._admit_waiting(batch, items, budget)
        batch.items = list(items.values())
        batch.kv_copies = self.take_kv_copies()
        self._in_flight = bool(batch.items)
        return batch

    def take_kv_copies(self) -> list[KVCopy]:
        """The device <-> host copies owed so far, in order; the caller makes them before any
        other write to the pool (``schedule`` hands them out with the batch)."""
        copies, self._kv_copies = self._kv_copies, []
        if self.host is not None:
            self.host.unpin_all()
        return copies

    def on_batch_done(
        self, batch: Batch, sampled: Mapping[str, int], stopped: Collection[str] = ()
    ) -> list[PartialOutput]:
        self._in_flight = False
        finished = []
        for item in batch.items:
            request = self.requests.get(item.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted while the batch ran
            request.num_computed += len(item.token_ids)
            if not item.sample:
                self._cache_computed_prefix(request)
                continue
            token = sampled[item.request_id]
            request.output_ids.append(token)
            reason = self._finish_reason(request, token, item.request_id in stopped)
            if reason is not None:
                self._release_kv(request)
                self.running.remove(request)
                finished.append(self._end(request, RequestStatus.FINISHED, reason))
            elif len(item.token_ids) > 1:
                self._cache_computed_prefix(request)
        return finished

    # ---- running requests: decode and continued prefill chunks ---------------------------

    def _schedule_running(
        self, batch: Batch, items: dict[str, ScheduledRequest], budget: int
    ) -> int:
        """Give every running request its next tokens, HIGH first. When memory runs short:
        evict the tiers it may evict, then retract requests after it in the order (LOW
        before HIGH, latest first). Returns the prefill token budget left."""
        order = by_priority(self.running)
        end = len(order)  # order[end:] were retracted as victims
        for index, request in enumerate(order):
            if index >= end:
                break
            pending = request.pending_tokens
            count = 1 if pending == 1 else min(pending, self.config.chunked_prefill_size, budget)
            if count == 0:
                continue
            while not self._grow(request, count):
                if end > index + 1:
                    end -= 1
                    self._retract(order[end], batch, items)
                elif len(self.running) == 1 and self._outgrew_pool(request, count):
                    self._release_kv(request)
                    self.running.remove(request)
                    batch.finished.append(self._end(request, RequestStatus.FINISHED, "length"))
                    break
                else:
                    self._retract(request, batch, items)
                    break
            else:
                if pending > 1:
                    budget -= count
                items[request.request_id] = self._item(request, count)
        return budget

    # ---- admission -----------------------------------------------------------------------

    def _admit_waiting(self, batch: Batch, items: dict[str, ScheduledRequest], budget: int) -> None:
        """Admit waiting requests, PROMOTED and HIGH before LOW, while the token budget, the
        running bound and memory allow. A HIGH request that finds no slot or memory preempts
        running LOW requests; the first request that still does not fit stops admission."""
        for request in by_priority(self.waiting):
            if budget <= 0:
                return
            urgent = request.priority != Priority.LOW
            while len(self.running) >= self.config.max_running_requests:
                if not (urgent and self._preempt_low(batch, items)):
                    return
            admitted = self._admit(request, budget)
            while admitted is None and urgent and self._preempt_low(batch, items):
                admitted = self._admit(request, budget)
            if admitted is None:
                return
            budget -= admitted
            items[request.request_id] = self._item(request, admitted)

    def _admit(self, request: Request, budget: int) -> int | None:
        """Match the cached prefix, lock it, and allocate the first chunk; returns its size,
        or None (with nothing changed but LRU clocks) when memory does not allow it."""
        tokens = request.all_ids
        # Keep at least the last token to compute: its logits give the next sample.
        match = self.cache.match_prefix(tokens[:-1])
        self.cache.lock(match.node)
        cached = len(match.slots)
        host_slots = self.host.continuation(tokens[:-1], cached) if self.host is not None else []
        loaded = len(host_slots)  # loaded back from the host tier, not computed
        count = min(len(tokens) - cached - loaded, self.config.chunked_prefill_size, budget)
        request.kv_slots, request.cached_len = list(match.slots), cached
        request.num_computed, request.prefix_node = cached, match.node
        if not self._grow(request, loaded + count):
            self.cache.unlock(match.node)
            request.kv_slots, request.cached_len, request.num_computed = [], 0, 0
            request.prefix_node = None
            return None
        if loaded:
            self._kv_copies.append(KVCopy(False, request.kv_slots[cached : cached + loaded], host_slots))
            request.num_computed += loaded
            self.counters.host_loaded_tokens += loaded
        prior = max(
            request.prior_computed, self._computed_by_trajectory.get(request.trajectory_key, 0)
        )
        self.counters.prompt_tokens += len(tokens)
        hits = cached + loaded
        self.counters.cached_tokens += hits
        trajectory = self.cache.trajectories.get(request.trajectory_key)
        declared = trajectory.priority if trajectory is not None else request.priority
        self.counters.prompt_tokens_by_priority[declared] += len(tokens)
        self.counters.cached_tokens_by_priority[declared] += hits
        self.counters.recomputed_tokens += max(0, min(prior, len(tokens)) - hits)
        self.waiting.remove(request)
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        return count

    def _preempt_low(self, batch: Batch, items: dict[str, ScheduledRequest]) -> bool:
        """Retract the most recently admitted running LOW request, if any."""
        for request in reversed(self.running):
            if request.priority == Priority.LOW:
                self._retract(request, batch, items)
                self.counters.preemptions += 1
                return True
        return False

    # ---- KV bookkeeping ------------------------------------------------------------------

    def _room_and_pages(self, request: Request, count: int) -> tuple[int, int]:
        """Free slots left in the request's last private page, and new pages ``count`` more
        tokens need beyond them."""
        room = -(len(request.kv_slots) - request.cached_len) % self.allocator.page_size
        return room, self.allocator.pages_for(max(0, count - room))

    def _grow(self, request: Request, count: int) -> bool:
        """Allocate slots for ``count`` more tokens, evicting only tiers the request may evict."""
        room, need = self._room_and_pages(request, count)
        if self._available_pages(max_evictable_tier(request.priority)) < need:
            return False
        slots = request.kv_slots
        target = len(slots) + count
        if room:
            slots.extend(range(slots[-1] + 1, slots[-1] + 1 + min(room, count)))
        for new_page in self._take_pages(need, max_evictable_tier(request.priority)):
            slots.extend(self.allocator.page_slots(new_page))
        del slots[target:]
        return True

    def _outgrew_pool(self, request: Request, count: int) -> bool:
        """Even evicting every unlocked page would not make room: the sequence ends ("length").
        A request short only of pages it may not evict (a LOW one behind HIGH trajectories'
        KV) is retracted instead, to resume when that KV is released."""
        return self._available_pages(Tier.HIGH_REF) < self._room_and_pages(request, count)[1]

    def _available_pages(self, max_tier: Tier) -> int:
        """Pages a request allowed to evict up to ``max_tier`` can get: the admission budget."""
        return (
            self.allocator.free_pages
            + self.cache.evictable_tokens(max_tier) // self.allocator.page_size
        )

    def _take_pages(self, need: int, max_tier: Tier) -> list[int]:
        """Allocate ``need`` pages, evicting up to ``max_tier`` first. Callers check
        ``_available_pages``; eviction reads the same counters, so the check is honoured."""
        free = self.allocator.free_pages
        if free < need:
            save = self._save_to_host if self.host is not None else None
            self.cache.evict((need - free) * self.allocator.page_size, max_tier, save)
            if self.allocator.free_pages < need:
                raise AssertionError("eviction freed less than the admission budget counted")
        return self.allocator.alloc(need)

    def _save_to_host(self, node: RadixNode) -> None:
        copy = self.host.save(*self.cache.path_of(node))
        if copy is not None:
            self._kv_copies.append(copy)

    def _cache_computed_prefix(self, request: Request) -> None:
        """Put the computed whole pages into the tree (so requests sharing the prefix hit it)
        and lock them for this request in place of its private copies."""
        page = self.allocator.page_size
        aligned = request.num_computed - request.num_computed % page
        if aligned <= request.cached_len:
            return
        tokens = request.token_range(0, aligned)
        existing, _ = self.cache.insert(tokens, request.kv_slots[:aligned])
        self.allocator.free(
            self.allocator.pages_of(request.kv_slots[request.cached_len : existing])
        )
        match = self.cache.match_prefix(tokens)
        self.cache.lock(match.node)
        self.cache.unlock(request.prefix_node)
        request.kv_slots[:aligned] = match.slots
        request.cached_len, request.prefix_node = aligned, match.node

    def _release_kv(self, request: Request) -> None:
        """Cache the computed whole pages under the request's trajectory, unlock, free the rest."""
        page = self.allocator.page_size
        aligned = request.num_computed - request.num_computed % page
        existing, node = self.cache.insert(
            request.token_range(0, aligned), request.kv_slots[:aligned]
        )
        slots = request.kv_slots
        self.allocator.free(self.allocator.pages_of(slots[request.cached_len : existing]))
        self.allocator.free(self.allocator.pages_of(slots[aligned:]))
        if request.trajectory_key in self.cache.trajectories and node is not self.cache.root:
            self.cache.set_anchor(request.trajectory_key, node)
        self.cache.unlock(request.prefix_node)
        key = request.trajectory_key
        self._computed_by_trajectory[key] = max(
            self._computed_by_trajectory.get(key, 0), request.num_computed
        )
        request.prior_computed = max(request.prior_computed, request.num_computed)
        request.kv_slots, request.cached_len, request.num_computed = [], 0, 0
        request.prefix_node = None

    def _retract(self, request: Request, batch: Batch, items: dict[str, ScheduledRequest]) -> None:
        """Send a running request back to waiting; its computed KV goes back to the tree under
        its trajectory (low_ref for LOW), so resuming is a cache hit while memory lasts."""
        self._release_kv(request)
        items.pop(request.request_id, None)
        self.running.remove(request)
        self.waiting.insert(0, request)
        request.status = RequestStatus.WAITING
        request.num_retractions += 1
        self.counters.retractions += 1
        batch.retracted.append(request.request_id)

    def _end(self, request: Request, status: RequestStatus, reason: str) -> PartialOutput:
        request.status, request.finish_reason = status, reason
        del self.requests[request.request_id]
        if request.trajectory_id is None:
            self.cache.queue_release(request.trajectory_key)
        return PartialOutput(
            request_id=request.request_id, trajectory_id=request.trajectory_id,
            prompt_ids=request.prompt_ids, output_ids=list(request.output_ids), finish_reason=reason,
        )  # fmt: skip

    def _item(self, request: Request, count: int) -> ScheduledRequest:
        start = request.num_computed
        end = start + count
        return ScheduledRequest(
            request_id=request.request_id, token_ids=request.token_range(start, end),
            positions=list(range(start, end)), new_slots=request.kv_slots[start:end],
            context_slots=request.kv_slots[:end], sample=end == request.seq_len,
            sampling=request.sampling, num_generated=len(request.output_ids),
        )  # fmt: skip

    @staticmethod
    def _finish_reason(request: Request, token: int, hit_stop_string: bool) -> str | None:
        if token in request.sampling.stop_token_ids or hit_stop_string:
            return "stop"
        if len(request.output_ids) >= request.sampling.max_new_tokens:
            return "length"
        return None

    # ---- demotion ------------------------------------------------------------------------

    def _rebalance_demotion(self) -> None:
        trajectories = self.cache.trajectories
        contexts, uncached = self._high_contexts()
        capacity = self.allocator.capacity_tokens
        demoted: set[Hashable] = set()
        # The sum of contexts bounds the distinct demand from above: only past it can anything
        # need demoting, and only then is the walk over the cached paths worth its cost.
        if self.config.demotion and self.config.cache_policy == "tiers" and sum(contexts.values()) > capacity:
            demand, exclusive = self._distinct_high_demand(uncached)
            demotable = {k: trajectories[k].priority == Priority.HIGH for k in contexts}
            active = None
            if self.config.demotion_order == "idle_first":
                active = {request.trajectory_key for request in self.requests.values()}
            demoted = choose_demoted(contexts, demotable, capacity, exclusive, demand, active)
        for key, trajectory in trajectories.items():
            if trajectory.demoted != (key in demoted):
                self.cache.set_demoted(key, key in demoted)
                if key in demoted:
                    self.counters.demotions += 1
                else:
                    self.counters.promotions += 1

    def _high_contexts(self) -> tuple[dict[Hashable, int], dict[Hashable, int]]:
        """Context tokens of every HIGH/PROMOTED trajectory (cached path or running sequence,
        the longer) and the part of its running sequence not yet in the tree."""
        trajectories = self.cache.trajectories
        contexts = {k: t.context_tokens for k, t in trajectories.items() if t.priority != Priority.LOW}
        uncached = dict.fromkeys(contexts, 0)
        for request in self.requests.values():
            key = request.trajectory_key
            if key in contexts:
                uncached[key] = max(uncached[key], request.seq_len - contexts[key])
                contexts[key] = max(contexts[key], request.seq_len)
        return contexts, uncached

    def _distinct_high_demand(self, uncached: dict[Hashable, int]) -> tuple[int, dict[Hashable, int]]:
        """KV the HIGH trajectories need with shared pages counted once (a group's prompt is
        one demand, not K), and what demoting each would free: the pages no other HIGH
        trajectory shares, plus its uncached tail."""
        trajectories, root = self.cache.trajectories, self.cache.root
        sharing: dict[RadixNode, int] = {}
        paths: dict[Hashable, list[RadixNode]] = {}
        for key in uncached:
            path, node = [], trajectories[key].anchor
            while node is not None and node is not root:
                path.append(node)
                sharing[node] = sharing.get(node, 0) + 1
                node = node.parent
            paths[key] = path
        demand = sum(len(node.key) for node in sharing) + sum(uncached.values())
        exclusive = {
            k: uncached[k] + sum(len(n.key) for n in path if sharing[n] == 1) for k, path in paths.items()
        }
        return demand, exclusive

    # ---- observability -------------------------------------------------------------------

    def stats(self) -> EngineStats:
        c, page = self.counters, self.allocator.page_size
        tiers = self.cache.tier_tokens()
        free = self.allocator.free_pages * page
        capacity = self.allocator.capacity_tokens
        return EngineStats(
            prompt_tokens=c.prompt_tokens, cached_tokens=c.cached_tokens,
            hit_rate=c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
            hit_rate_by_priority={
                p.name.lower(): cached / prompt if prompt else 0.0
                for p, cached, prompt in zip(Priority, c.cached_tokens_by_priority, c.prompt_tokens_by_priority, strict=True)
            },
            recomputed_tokens=c.recomputed_tokens, retractions=c.retractions,
            preemptions=c.preemptions, demotions=c.demotions, promotions=c.promotions,
            evicted_tokens={tier.name.lower(): self.cache.evicted_tokens[tier] for tier in Tier},
            kv_tokens={"free": free, "in_use": capacity - free - sum(tiers),
                       **{tier.name.lower(): tiers[tier] for tier in Tier}},
            kv_capacity_tokens=capacity, host_loaded_tokens=c.host_loaded_tokens,
            host_saved_tokens=self.host.saved_tokens if self.host else 0,
            host_kv_tokens=self.host.used_tokens if self.host else 0,
            high_pressure=self._distinct_high_demand(self._high_contexts()[1])[0] / capacity,
            demoted_trajectories=sum(t.demoted for t in self.cache.trajectories.values()),
            live_trajectories=sum(isinstance(key, str) for key in self.cache.trajectories),
            running=len(self.running), waiting=len(self.waiting),
        )  # fmt: skip

    def check_integrity(self) -> None:
        """Every page is free, in the tree or private to exactly one running request; locks
        match the running requests; each running request's prefix slots are the tree's."""
        locks: Counter = Counter()
        private: list[int] = []
        for request in self.running:
            node = request.prefix_node
            if node is None or request.status is not RequestStatus.RUNNING:
                raise AssertionError(f"running request {request.request_id} holds no prefix")
            if node is not self.cache.root:
                locks[node] += 1
            path: list[int] = []
            while node is not self.cache.root:
                path[:0] = node.value
                node = node.parent
            if path != request.kv_slots[: request.cached_len]:
                raise AssertionError(
                    f"request {request.request_id} prefix slots differ from the tree"
                )
            if not request.cached_len <= request.num_computed <= len(request.kv_slots):
                raise AssertionError(f"request {request.request_id} slot counts inconsistent")
            private.extend(self.allocator.pages_of(request.kv_slots[request.cached_len :]))
        for request in self.waiting:
            if request.kv_slots or request.prefix_node is not None:
                raise AssertionError(f"waiting request {request.request_id} holds KV")
        if len(self.running) + len(self.waiting) != len(self.requests):
            raise AssertionError("request table disagrees with the queues")
        if not self._idle_since.keys() <= self.cache.trajectories.keys():
            raise AssertionError("an idle clock runs for a trajectory that is not live")
        tree_pages = self.cache.check_integrity(locks)
        self.allocator.check_integrity(tree_pages + private)
        if self.host is not None:
            self.host.check_integrity()
