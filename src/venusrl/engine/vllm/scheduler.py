"""vLLM's V1 scheduler with venus's preemption rule added: a waiting request more urgent than a
running one takes its place when the batch is full (paper §4.3: a HIGH request arriving at a
full engine retracts a LOW one).

vLLM 0.32's own priority policy orders the waiting queue by `(priority, arrival)` and, when KV
runs out while it schedules the running batch, preempts the running request with the largest
`(priority, arrival)`. But when the batch is full by count (`max_num_seqs`) a waiting HIGH
request only waits: nothing preempts for it. This class adds that step before each schedule.
The victim goes back to vLLM's waiting queue as vLLM's own preemption sends it (its output kept,
its blocks freed into the prefix cache), so it resumes as a continuation whose full blocks hit
the cache; its stream carries on uninterrupted.

Runs inside vLLM's engine-core process (named by qualname in `scheduler_cls`).
"""

from __future__ import annotations

import logging
import time

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler

log = logging.getLogger(__name__)


class PriorityPreemptingScheduler(Scheduler):
    def schedule(self, *args, **kwargs) -> SchedulerOutput:
        self._preempt_for_urgent_waiting()
        return super().schedule(*args, **kwargs)

    def _preempt_for_urgent_waiting(self) -> None:
        """While the batch is full and the most urgent waiting request is more urgent than the
        least urgent running one, preempt the latter (largest `(priority, arrival)`, vLLM's own
        victim order). Each preemption frees exactly one batch place for one waiting request,
        so it never preempts more requests than urgent ones wait."""
        if not self.waiting:
            return
        for priority in sorted(r.priority for r in self.waiting):
            if len(self.running) < self.max_num_active_reqs:
                break  # a place is free: the waiting request gets it without preempting
            victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
            if victim.priority <= priority or not self._request_blocks_can_be_freed(victim):
                break
            self.running.remove(victim)
            self._preempt_request(victim, time.monotonic())
            log.info("preempted %s (priority %d) for a waiting request of priority %d",
                     victim.request_id, victim.priority, priority)
