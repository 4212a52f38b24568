"""The discrete-event loop: a heap of (time, sequence, callback) and a virtual clock.

Invariants: the clock never goes backwards (an event scheduled in the past is an error) and
events at the same time run in the order they were scheduled. Cancelling is lazy: a
cancelled event stays in the heap and is skipped when popped, so it costs O(1).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Event:
    at: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass(slots=True)
class EventLoop:
    now: float = 0.0
    processed: int = 0
    _heap: list[tuple[float, int, Event]] = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)
    _stopped: bool = False

    def at(self, when: float, callback: Callable[[], None]) -> Event:
        if when < self.now:
            raise ValueError(f"event at {when} is before now ({self.now})")
        event = Event(when, callback)
        heapq.heappush(self._heap, (when, next(self._seq), event))
        return event

    def after(self, delay: float, callback: Callable[[], None]) -> Event:
        return self.at(self.now + max(0.0, delay), callback)

    def stop(self) -> None:
        """Return from `run` after the current event."""
        self._stopped = True

    @property
    def pending(self) -> int:
        return len(self._heap)

    def run(self, until: float = float("inf"), max_events: int | None = None) -> None:
        """Run events in time order until none is left, `stop()` is called, the next one is
        past `until`, or `max_events` ran."""
        self._stopped = False
        heap = self._heap
        budget = max_events if max_events is not None else -1
        while heap and not self._stopped and budget != 0:
            when, _, event = heap[0]
            if when > until:
                break
            heapq.heappop(heap)
            if event.cancelled:
                continue
            self.now = when
            event.callback()
            self.processed += 1
            budget -= 1
