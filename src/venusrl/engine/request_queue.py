"""The scheduler's live requests and their two queues (pure).

Invariant: every live request is in ``requests`` and in exactly one of ``waiting`` (status
WAITING, holding no KV) or ``running`` (status RUNNING). Requests move only through these
methods; ``waiting`` keeps arrival order except that retracted requests go back to its front
(they resume before newer work of their priority).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from venusrl.engine.radix_cache import RadixCache
from venusrl.engine.request import PartialOutput, Request, RequestStatus
from venusrl.types import Priority, SamplingParams


class RequestQueue:
    def __init__(self, cache: RadixCache) -> None:
        self._cache = cache  # an implicit per-request trajectory is released with its request
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._arrivals = 0

    def add(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        trajectory_key: Hashable,
        trajectory_id: str | None,
        priority: Priority,
    ) -> Request:
        self._arrivals += 1
        request = Request(
            request_id=request_id, prompt_ids=list(prompt_ids), sampling=sampling,
            trajectory_key=trajectory_key, trajectory_id=trajectory_id, priority=priority,
            arrival=self._arrivals,
        )  # fmt: skip
        self.requests[request_id] = request
        self.waiting.append(request)
        return request

    def start_running(self, request: Request) -> None:
        self.waiting.remove(request)
        self.running.append(request)
        request.status = RequestStatus.RUNNING

    def requeue(self, request: Request) -> None:
        """A running request (its KV released) goes back to the front of ``waiting``."""
        self.running.remove(request)
        self.waiting.insert(0, request)
        request.status = RequestStatus.WAITING

    def requeue_all_running(self) -> None:
        """Every running request back to the front of ``waiting``, in their running order."""
        self.waiting[:0] = self.running
        for request in self.running:
            request.status = RequestStatus.WAITING
        self.running.clear()

    def end(self, request: Request, status: RequestStatus, reason: str) -> PartialOutput:
        """Remove a request (its KV already released) and return what it produced."""
        (self.running if request.status is RequestStatus.RUNNING else self.waiting).remove(request)
        request.status, request.finish_reason = status, reason
        del self.requests[request.request_id]
        if request.trajectory_id is None:
            self._cache.queue_release(request.trajectory_key)
        return PartialOutput(
            request_id=request.request_id, trajectory_id=request.trajectory_id,
            prompt_ids=request.prompt_ids, output_ids=list(request.output_ids), finish_reason=reason,
        )  # fmt: skip

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
