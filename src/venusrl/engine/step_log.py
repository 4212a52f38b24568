"""Every forward step an engine runs, timed and shaped: what the engine-time breakdown
(`bench/breakdown.py`) splits and the cost-model fit (`sim/cost_model.py`) prices. The
engine keeps it itself, so it crosses `EngineClient` like any other figure, engines in other
processes included. Pure: no torch.

The clock is `time.monotonic()`: host-wide on Linux, so step end times of engines in other
processes on the same host compare with the caller's own."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from venusrl.engine.batch import ScheduledRequest

# Steps an engine keeps (about 100 bytes each); older ones are dropped, oldest first.
STEP_LOG_LIMIT = 200_000
# The engine's own account of its time between steps (`StepLog`, reported in `EngineStats`).
WAITS = ("idle_no_request_s", "idle_stalled_s", "calls_s")


@dataclass(slots=True, frozen=True)
class StepSample:
    """One forward step: its shape, its measured seconds and when it ended (monotonic clock;
    0 for a step that was not run, as the simulator's)."""

    prefill_tokens: int
    decode_seqs: int
    kv_tokens: int
    seconds: float
    ended_s: float = 0.0


@dataclass(slots=True, frozen=True)
class StepLogSlice:
    """The steps from index `start` on (`start` > the index asked for when older ones were
    dropped), and the index to ask for next."""

    start: int
    samples: tuple[StepSample, ...]

    @property
    def next_index(self) -> int:
        return self.start + len(self.samples)


def computes_prefill(item: ScheduledRequest) -> bool:
    """A prefill chunk (the last one of a prompt also samples), not a one-token decode step."""
    return len(item.token_ids) > 1 or not item.sample


def batch_shape(items: Iterable[ScheduledRequest]) -> tuple[int, list[int]]:
    """(prefill tokens, context length of every sampled sequence) of one step's batch, as the
    cost model prices it: every token of a prefill chunk is computed; every sampled item is
    one decode sequence that reads its context. The real engine's measured steps and the
    simulated ones are both shaped by this."""
    prefill, contexts = 0, []
    for item in items:
        if item.sample:
            contexts.append(item.positions[-1])
        if computes_prefill(item):
            prefill += len(item.token_ids)
    return prefill, contexts


class StepLog:
    """An engine's steps that computed something, oldest first, at most `limit` kept;
    indexed from the engine's first step, so a reader polls only what is new."""

    def __init__(self, limit: int = STEP_LOG_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"step log limit must be >= 1, got {limit}")
        self.limit = limit
        self.first = 0  # index of samples[0]
        self.samples: list[StepSample] = []
        # seconds the engine loop spent between steps, by why: waiting with no request at all,
        # waiting with requests it could not admit (`Engine.last_step_idle`), and running its
        # callers' calls (adding and aborting requests, priorities, stats, prefix KV copies);
        # the rest of the time between steps is delivery and the OS running something else
        self.idle_no_request_s = 0.0
        self.idle_stalled_s = 0.0
        self.calls_s = 0.0

    def record(self, items: Iterable[ScheduledRequest], started_s: float, ended_s: float) -> None:
        prefill, contexts = batch_shape(items)
        if prefill or contexts:
            self.add(StepSample(prefill, len(contexts), sum(contexts), ended_s - started_s, ended_s))

    def add(self, sample: StepSample) -> None:
        """A step shaped by its engine (vLLM's, `engine/vllm/stats.py`)."""
        self.samples.append(sample)
        if len(self.samples) > self.limit:  # drop the older half at once: amortised O(1) a step
            dropped = len(self.samples) - self.limit // 2
            del self.samples[:dropped]
            self.first += dropped

    def record_wait(self, seconds: float, has_request: bool) -> None:
        if has_request:
            self.idle_stalled_s += seconds
        else:
            self.idle_no_request_s += seconds

    def record_calls(self, seconds: float) -> None:
        self.calls_s += seconds

    def since(self, index: int) -> StepLogSlice:
        if index < 0:
            raise ValueError(f"step log index must be >= 0, got {index}")
        start = max(index, self.first)
        return StepLogSlice(start, tuple(self.samples[start - self.first:]))
