"""The rollout engine: the pure scheduler deciding, the model runner computing.

Single-threaded and step-driven: `step()` applies what was queued since the last step
(trajectory changes) at the iteration boundary, runs one batch, and returns what each
request produced; a weight update is copied in by its call, itself at a boundary.
`AsyncEngine` drives it from a thread for asyncio callers.

Fault isolation: a request whose sampling fails inside a step is failed alone (finish reason
"error", its KV unlocked) and the step goes on for the rest of the batch. Caller trajectories
live until released, or until idle for `trajectory_idle_ttl_s` (a client that forgot them).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from venusrl.engine.config import EngineConfig
from venusrl.engine.kv_pool import HostKV
from venusrl.engine.request import PartialOutput
from venusrl.engine.runner import ModelRunner
from venusrl.engine.scheduler import Scheduler
from venusrl.engine.stats import EngineStats
from venusrl.engine.step_log import StepLog, StepLogSlice
from venusrl.model.causal_lm import CausalLM
from venusrl.model.chat import ChatTokenizer, load_tokenizer
from venusrl.model.checkpoint import load_model
from venusrl.types import Priority, SamplingParams
from venusrl.weights.digest import engine_weights_digest

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RequestOutput:
    """What one request produced in one step (`new_*`) and in total so far."""

    request_id: str
    trajectory_id: str | None
    prompt_len: int
    new_token_ids: list[int]
    new_logprobs: list[float]
    output_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]  # the weight version each output token was sampled under
    finished: bool = False
    finish_reason: str | None = None  # stop, length, abort, error
    error: str | None = None  # why the request failed (finish reason "error")


@dataclass(slots=True)
class _Tracked:
    trajectory_id: str | None
    prompt_len: int
    stop: tuple[str, ...]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    emitted: int = 0


class Engine:
    def __init__(self, model: CausalLM, config: EngineConfig, tokenizer: ChatTokenizer | None = None, seed: int = 0,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.tokenizer = tokenizer
        self.seed = seed
        self.clock = clock  # for the idle TTL only; the scheduler is handed `now`
        self._next_idle_sweep = float("-inf")
        self.scheduler = Scheduler(config)
        self.runner = ModelRunner(model, config.kv_capacity_tokens, seed, config.attention_backend,
                                  config.host_kv_capacity_tokens, config.max_running_requests, config.cuda_graphs)
        self.weight_version = 0
        # The last step had nothing to do: no request ran, was retracted, finished or moved.
        # The engine's state changes only by steps and calls, so until a call arrives (a
        # request, a release, a priority change) the next step would find the same nothing.
        self.last_step_idle = False
        # the requests of the current (or last) step's batch: after a crash inside a step, the
        # requests the crash may be down to
        self.batch_ids: list[str] = []
        self._tracked: dict[str, _Tracked] = {}
        self._ids = itertools.count()
        self.step_log = StepLog()  # every step that computed something, timed (its whole `step()`)
        self.eos_token_ids = tuple(tokenizer.eos_token_ids if tokenizer else model.args.eos_token_ids)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, config: EngineConfig | None = None, dtype: str = "float32", device: str = "cpu"
    ) -> Engine:
        return cls(load_model(path, dtype, device), config or EngineConfig(), load_tokenizer(path))

    # ---- requests ------------------------------------------------------------------------

    def add_request(
        self,
        prompt: list[int] | list[dict],
        sampling: SamplingParams,
        priority: Priority | None = None,
        trajectory_id: str | None = None,
        request_id: str | None = None,
        tools: list[dict] | None = None,
    ) -> str:
        """Queue one generation from token ids, or from chat messages (and tools) rendered with
        the checkpoint's chat template. Without a priority the trajectory keeps its own (LOW for
        a new one). Stop token ids default to the model's end-of-turn tokens."""
        request_id = request_id or f"req-{next(self._ids)}"
        prompt_ids = self._prompt_ids(prompt, tools)
        vocab = self.runner.model.args.vocab_size
        bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        # a context past the pool's longest (the model's positions, or all the slots) cannot be
        # attended: generation stops there ("length"); a prompt past the model's positions is
        # refused here, one past the slots by the scheduler
        positions = self.runner.model.args.max_position_embeddings
        if positions <= len(prompt_ids) <= self.runner.pool.num_slots:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room to generate: the model's "
                             f"max_position_embeddings is {positions}")
        room = self.runner.pool.max_context - len(prompt_ids)
        if 0 < room < sampling.max_new_tokens:
            sampling = replace(sampling, max_new_tokens=room)
        if not sampling.stop_token_ids and self.eos_token_ids:
            sampling = replace(sampling, stop_token_ids=self.eos_token_ids)
        if sampling.stop and self.tokenizer is None:
            raise ValueError("stop strings need an engine with a tokenizer")
        self.scheduler.add_request(request_id, prompt_ids, sampling, priority, trajectory_id)
        self._tracked[request_id] = _Tracked(trajectory_id, len(prompt_ids), sampling.stop)
        log.debug("request %s added: %d prompt tokens, priority %s", request_id, len(prompt_ids), priority)
        return request_id

    def abort(self, request_id: str) -> RequestOutput:
        """Stop a request now and return what it produced, so the caller can resume it later
        (its computed KV stays in the cache)."""
        output = self._final(request_id, self.scheduler.abort(request_id))
        self._settle_if_drained()
        return output

    def request_ids(self) -> list[str]:
        """Requests added and not yet finished or aborted."""
        return list(self._tracked)

    def start_trajectory(self, trajectory_id: str, priority: Priority) -> None:
        self.scheduler.start_trajectory(trajectory_id, Priority(priority))

    def release_trajectory(self, trajectory_id: str) -> bool:
        """Release a trajectory's references (its KV becomes plain cache); whether it was
        known. With no request in the engine the boundary is now: it applies at once."""
        known = self.scheduler.knows_trajectory(trajectory_id)
        self.scheduler.release_trajectory(trajectory_id)
        self._settle_if_drained()
        return known

    def release_idle_trajectories(self) -> list[str]:
        """Release caller trajectories idle (no request here) for `trajectory_idle_ttl_s`;
        sweeps at most every quarter TTL (and every second at most), so calling it each loop
        iteration is cheap."""
        ttl = self.config.trajectory_idle_ttl_s
        now = self.clock()
        if not ttl or now < self._next_idle_sweep:
            return []
        self._next_idle_sweep = now + min(1.0, ttl / 4)
        expired = self.scheduler.release_idle(now, ttl)
        if expired:
            self.scheduler.apply_trajectory_changes()
            log.info("released %d trajectories idle for %.0f s", len(expired), ttl)
        return expired

    def set_priority(self, trajectory_id: str, priority: Priority) -> None:
        self.scheduler.set_priority(trajectory_id, Priority(priority))

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Copy in new weights now: the engine is single-threaded, so a call is always at an
        iteration boundary (between two steps). In-flight requests carry on under the new
        version, and every token records the version it was sampled under.

        Invariant (one version per push, never mixed weights): every tensor is checked (name,
        shape, floating dtype) before the first is copied and the version changes only after
        the last; a bad update raises ValueError naming the tensor and leaves the weights and
        the version as they were. The caller's tensors are read only during this call (they
        may be the trainer's live parameters or a shared-memory mapping)."""
        if version <= self.weight_version:
            raise ValueError(f"weight version {version} is not newer than {self.weight_version}")
        self.runner.load_weights(state_dict)
        self.weight_version = version
        dropped = self.scheduler.drop_all_kv() if self.config.kv_after_weight_update == "recompute" else 0
        log.info("weights updated to version %d (%d cached KV tokens dropped)", version, dropped)

    def weight_digest(self) -> str:
        """The fingerprint of the weights this engine serves (weights/digest.py)."""
        return engine_weights_digest(self.runner.model)

    def rebuilt(self) -> Engine:
        """A fresh engine over this one's model weights, for when this one crashed inside a
        step: new scheduler, KV pool and runner; the weight version and the
        caller trajectories with their declared priorities carried over. Its requests are
        the caller's to re-issue (`AsyncEngine` does)."""
        trajectories = {k: p for k, p in self.scheduler.cache.declared_priorities().items() if isinstance(k, str)}
        model = self.runner.model
        self.runner = None  # the old KV pool goes before a new one is allocated (a GPU holds one)
        fresh = Engine(model, self.config, self.tokenizer, self.seed + 1, self.clock)
        fresh.weight_version = self.weight_version
        fresh._ids = self._ids  # re-issued requests keep their ids: new ones must not collide
        fresh.step_log = self.step_log
        for trajectory_id, priority in trajectories.items():
            fresh.start_trajectory(trajectory_id, priority)
        log.warning("engine rebuilt at weight version %d with %d live trajectories", fresh.weight_version,
                    len(trajectories))
        return fresh

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # ---- one iteration -------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        started = time.monotonic()
        self.release_idle_trajectories()
        self.batch_ids = []
        batch = self.scheduler.schedule()
        self.batch_ids = [item.request_id for item in batch.items]
        self.last_step_idle = not batch
        sampled = self.runner.run(batch)
        # aborted before on_batch_done, which then skips them: their private pages are freed and
        # their computed prefix left to the cache unlocked (evictable), as for any aborted request
        outputs = [self._fail(request_id, err) for request_id, err in sampled.errors.items()]
        stopped = []
        for request_id, token in sampled.tokens.items():
            tracked = self._tracked[request_id]
            tracked.output_ids.append(token.token)
            tracked.logprobs.append(token.logprob)
            tracked.weight_versions.append(self.weight_version)
            if tracked.stop and self._hits_stop_string(tracked):
                stopped.append(request_id)
        tokens = {r: t.token for r, t in sampled.tokens.items()}
        finished = {p.request_id: p for p in self.scheduler.on_batch_done(batch, tokens, stopped)}
        finished.update((p.request_id, p) for p in batch.finished)
        outputs += [self._final(rid, partial) for rid, partial in finished.items()]
        for request_id in sampled.tokens:
            if request_id not in finished:
                outputs.append(self._delta(request_id, finished=False, reason=None))
        self._settle_if_drained()
        self.step_log.record(batch.items, started, time.monotonic())
        return outputs

    def steps_since(self, index: int) -> StepLogSlice:
        return self.step_log.since(index)

    def run_to_completion(self) -> dict[str, RequestOutput]:
        """Step until no request is left; the final output of each request."""
        done = {}
        while self.has_work:
            done.update((o.request_id, o) for o in self.step() if o.finished)
        return done

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[RequestOutput]:
        ids = [self.add_request(p, sampling) for p in prompts]
        done = self.run_to_completion()
        return [done[i] for i in ids]

    # ---- KV migration --------------------------------------------------------------------

    def export_prefix(self, token_ids: list[int]) -> tuple[int, HostKV]:
        """KV of the longest cached page-aligned prefix of `token_ids`, copied to host memory."""
        slots = self.scheduler.cached_prefix_slots(token_ids)
        return len(slots), self.runner.pool.export(slots)

    def import_prefix(self, token_ids: list[int], kv: HostKV, trajectory_id: str | None = None) -> int:
        """Insert the KV of `token_ids[:kv.num_tokens]` (from another engine) into this cache;
        returns the tokens now cached. Pages this engine already had are kept, not rewritten.
        With `trajectory_id`, that trajectory references the prefix (it is about to resume here)."""
        self.runner.pool.check_compatible(kv)
        tokens = token_ids[: kv.num_tokens]
        new_slots, offset = self.scheduler.reserve_prefix(tokens)
        for copy in self.scheduler.take_kv_copies():  # KV the reservation evicted to the host
            self.runner.pool.copy(copy)
        if new_slots:
            self.runner.pool.load(new_slots, kv.slice(offset, offset + len(new_slots)))
        return self.scheduler.commit_prefix(tokens, new_slots, offset, trajectory_id)

    def typed_stats(self) -> EngineStats:
        return replace(self.scheduler.stats(), weight_version=self.weight_version,
                       idle_no_request_s=self.step_log.idle_no_request_s, idle_stalled_s=self.step_log.idle_stalled_s,
                       calls_s=self.step_log.calls_s)

    def stats(self) -> dict[str, object]:
        return self.typed_stats().to_dict()

    # ---- internals -----------------------------------------------------------------------

    def _prompt_ids(self, prompt: list[int] | list[dict], tools: list[dict] | None) -> list[int]:
        if not prompt or not isinstance(prompt[0], dict):
            return prompt
        if self.tokenizer is None:
            raise ValueError("chat messages need an engine with a tokenizer; pass token ids instead")
        return self.tokenizer.encode_chat(prompt, tools)

    def _settle_if_drained(self) -> None:
        """With no request left there is no next boundary to wait for: apply the queued
        trajectory changes now, so finished requests' and released trajectories' KV is
        unpinned while the engine idles (not at whatever request comes next)."""
        if not self.has_work:
            self.scheduler.apply_trajectory_changes()

    def _hits_stop_string(self, tracked: _Tracked) -> bool:
        """Checked after every token, so a stop string can only end in the newest token: the
        tail that could hold it is enough (a character is at most 4 byte-level tokens)."""
        window = 4 * max(len(s) for s in tracked.stop) + 4
        text = self.tokenizer.decode(tracked.output_ids[-window:])
        return any(s in text for s in tracked.stop)

    def _delta(self, request_id: str, finished: bool, reason: str | None) -> RequestOutput:
        tracked = self._tracked[request_id]
        start, tracked.emitted = tracked.emitted, len(tracked.output_ids)
        return RequestOutput(
            request_id, tracked.trajectory_id, tracked.prompt_len,
            tracked.output_ids[start:], tracked.logprobs[start:],
            list(tracked.output_ids), list(tracked.logprobs), list(tracked.weight_versions), finished, reason,
        )

    def _fail(self, request_id: str, err: Exception) -> RequestOutput:
        """End one request whose step failed; the others in the batch go on."""
        partial = replace(self.scheduler.abort(request_id), finish_reason="error")
        output = self._final(request_id, partial)
        output.error = f"{type(err).__name__}: {err}"
        log.warning("request %s failed alone after %d tokens: %s", request_id, len(output.output_ids), output.error)
        return output

    def _final(self, request_id: str, partial: PartialOutput) -> RequestOutput:
        tracked = self._tracked[request_id]
        if partial.output_ids != tracked.output_ids:
            raise AssertionError(f"{request_id}: scheduler and engine disagree on the output")
        output = self._delta(request_id, finished=True, reason=partial.finish_reason)
        del self._tracked[request_id]
        log.debug("request %s finished (%s): %d tokens", request_id, partial.finish_reason, len(tracked.output_ids))
        return output
