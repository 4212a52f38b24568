"""A torch-free stand-in for the runner: it checks the batch contract and samples tokens."""

from __future__ import annotations

import random

from venusrl.engine.config import EngineConfig
from venusrl.engine.scheduler import Scheduler


def make_scheduler(**overrides) -> Scheduler:
    fields = dict(page_size=1, kv_capacity_tokens=64, max_running_requests=8,
                  max_prefill_tokens=64, chunked_prefill_size=64, demotion=False)  # fmt: skip
    fields.update(overrides)
    return Scheduler(EngineConfig(**fields))


class FakeRunner:
    """Keeps a slot -> (position, token) map as the KV pool would, and verifies every context
    it is asked to attend to holds exactly the request's tokens at the right positions."""

    def __init__(self, seed: int = 0, vocab: int = 5) -> None:
        self.kv: dict[int, tuple[int, int]] = {}
        self.host: dict[int, tuple[int, int]] = {}
        self.rng = random.Random(seed)
        self.vocab = vocab
        self.sequences: dict[str, list[int]] = {}

    def apply_copies(self, copies):
        for copy in copies:
            source, target = (self.kv, self.host) if copy.to_host else (self.host, self.kv)
            pairs = zip(copy.device_slots, copy.host_slots, strict=True)
            for src, dst in ((d, h) for d, h in pairs) if copy.to_host else ((h, d) for d, h in pairs):
                target[dst] = source[src]

    def run(self, scheduler: Scheduler, batch, stopped=()):
        sampled = {}
        self.apply_copies(batch.kv_copies)
        for item in batch.items:
            request = scheduler.requests[item.request_id]
            assert item.positions == list(
                range(item.positions[0], item.positions[0] + len(item.token_ids))
            )
            assert (
                item.context_slots[len(item.context_slots) - len(item.new_slots) :]
                == item.new_slots
            )
            assert len(item.context_slots) == item.positions[-1] + 1
            for slot, position, token in zip(
                item.new_slots, item.positions, item.token_ids, strict=True
            ):
                self.kv[slot] = (position, token)
            expected = request.token_range(0, len(item.context_slots))
            assert [self.kv[s] for s in item.context_slots] == list(enumerate(expected))
            if item.sample:
                sampled[item.request_id] = self.rng.randrange(self.vocab)
        return scheduler.on_batch_done(batch, sampled, stopped)


def step(scheduler: Scheduler, runner: FakeRunner, stopped=()):
    batch = scheduler.schedule()
    finished = runner.run(scheduler, batch, stopped)
    scheduler.check_integrity()
    return batch, finished


def run_to_completion(scheduler: Scheduler, runner: FakeRunner, max_steps: int = 1000):
    outputs = {}
    for _ in range(max_steps):
        if not scheduler.has_work:
            return outputs
        batch, finished = step(scheduler, runner)
        for out in batch.finished + finished:
            outputs[out.request_id] = out
    raise AssertionError("scheduler did not drain")
