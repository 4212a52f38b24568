"""`VLLMEngine`: the `EngineClient` port over vLLM's `AsyncLLM` (`engine.backend: vllm`).

What each venus mechanism becomes here (vLLM 0.32, its V1 engine):
- priority: PROMOTED/HIGH/LOW are vLLM priorities 0/1/2 (lower is more urgent) under
  `scheduling_policy="priority"`; `PriorityPreemptingScheduler` adds venus's preemption of a
  running LOW request for a waiting HIGH one when the batch is full (vllm/scheduler.py).
- set_priority: vLLM cannot change a request's priority once added. The trajectory's live
  requests are re-issued at the new priority as continuations (prompt + the output so far),
  whose full KV blocks hit vLLM's prefix cache; the caller's stream carries on.
- weight updates: vLLM pauses (in-flight requests aborted, the prefix cache cleared, so no token
  is computed by older weights: `kv_after_weight_update: recompute`, the only mode accepted
  here, see vllm/args.py); the state dict is loaded in place in each worker (vllm/worker.py) and
  the version set; aborted requests are re-issued as continuations. Each token's version is the
  one vLLM's engine core stamped on the step that sampled it.
- log-probs: vLLM's `processed_logprobs` of the sampled token, i.e. under the rollout
  temperature (equal to ours, softmax(logits / T), when top-p/top-k cut nothing; with a cut
  vLLM renormalises over the kept tokens, ours does not).
- step log: vLLM's own per-iteration details (its elapsed_ms and token counts; vllm/stats.py);
  the wait split (no request / stalled) of our engine's step log is not kept (vLLM does not
  account for its idle).
- residency tiers, demotion: our scheduler class (vllm/tiers.py) holds a live trajectory's
  blocks between its turns by tier and demotes HIGH trajectories under KV pressure
  (`engine.cache_policy: tiers`; `lru` is vLLM's own LRU prefix cache). Each request names its
  trajectory in its `extra_args`; trajectory start, priority change and release reach the
  scheduler as control ids on vLLM's abort channel (`control_id`); the demoted set and the
  counts come back with vLLM's per-step stats (vllm/stats.py).
- KV of a moved turn: vLLM moves KV between engines only through a KV connector configured at
  start (`kv_transfer_config`), per request, not by a call. With `engine.vllm_kv_connector: nixl`
  (or auto, where NIXL is installed, off vLLM's CPU build: vllm/connector.py) every engine starts with NixlConnector and `send_prefix` to
  another such engine moves the whole blocks of the context as two 1-token requests of the same
  prefix, an export on the source and a pull on the target (vllm/nixl.py); the turn then hits
  the target's prefix cache. Without it the target recomputes the prefix. `export_prefix` and
  `import_prefix` (KV through the caller, as host tensors) move nothing on vLLM.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import aclosing, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from vllm.inputs import TokensPrompt
from vllm.platforms import current_platform
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM

from venusrl.engine.client import (
    EngineClient,
    EngineHealth,
    EngineInfo,
    KVAddress,
    PrefixKV,
)
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import RequestOutput
from venusrl.engine.kv_pool import HostKV
from venusrl.engine.stats import EngineLoad, EngineStats
from venusrl.engine.step_log import StepLogSlice
from venusrl.engine.vllm.args import engine_args, vllm_params
from venusrl.engine.vllm.connector import (
    new_endpoint,
    resolve_connector,
    scoped_environ,
    spawn_environ,
    transfer_config,
)
from venusrl.engine.vllm.nixl import NixlPeer
from venusrl.engine.vllm.stats import StatsCollector, usable_kv_tokens
from venusrl.engine.vllm.tiers import control_id
from venusrl.types import Priority, SamplingParams

log = logging.getLogger(__name__)

_SHM = "/dev/shm"



@dataclass(slots=True, eq=False)
class _Stream:
    """One caller request: what vLLM produced for it so far, over every vLLM request it was
    issued as (a re-issue continues from `prompt_ids + output_ids`)."""

    request_id: str
    trajectory_id: str | None
    prompt_ids: list[int]
    sampling: SamplingParams
    priority: Priority
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    issues: int = 0
    vllm_id: str | None = None  # the vLLM request now carrying it
    reissue: bool = False  # its vLLM request is being aborted to be issued again
    caller_aborted: bool = False
    resumed: asyncio.Event = field(default_factory=asyncio.Event)

    def output(self, new: int, finished: bool = False, reason: str | None = None) -> RequestOutput:
        start = len(self.output_ids) - new
        return RequestOutput(self.request_id, self.trajectory_id, len(self.prompt_ids), self.output_ids[start:],
                             self.logprobs[start:], list(self.output_ids), list(self.logprobs),
                             list(self.weight_versions), finished, reason)


class VLLMEngine:
    """The vLLM `EngineClient`. Create it inside the event loop that will call it."""

    def __init__(self, llm: AsyncLLM, stats: StatsCollector, config: EngineConfig, weight_version: int = 0,
                 connector: str = "none"):
        self.llm = llm
        self.config = config
        self._stats = stats
        self._version = weight_version
        self._ids = itertools.count()
        self._streams: dict[str, _Stream] = {}
        self._trajectories: dict[str, Priority] = {}
        self._update_lock = asyncio.Lock()
        self._serving = asyncio.Event()  # cleared while weights are being replaced (or at start, see below)
        self._serving.set()
        self.kv_capacity_tokens = usable_kv_tokens(llm.vllm_config.cache_config)
        self.connector = connector  # why moves carry KV or recompute, as resolved at start
        self.nixl: NixlPeer | None = None
        self._unpinning: asyncio.Task | None = None
        transfer = llm.vllm_config.kv_transfer_config
        if transfer is not None and transfer.kv_connector == "NixlConnector":
            self.nixl = NixlPeer(llm, transfer.engine_id, llm.vllm_config.cache_config.block_size,
                                 lambda: self._version, self._priority_of)
            self._serving.clear()  # the first request waits for the forward pass's cores
            self._unpinning = asyncio.get_running_loop().create_task(self._unpin_compute())
        self._said_recompute = False

    @classmethod
    def start(cls, model_dir: str | Path, config: EngineConfig, weight_version: int = 0, **kwargs) -> VLLMEngine:
        connector, why = resolve_connector(config.vllm_kv_connector, current_platform.is_cpu())
        args = engine_args(model_dir, config, **kwargs)
        endpoint = new_endpoint() if connector == "nixl" else None
        env = nullcontext() if endpoint is None else scoped_environ(spawn_environ(endpoint))
        if endpoint is not None:
            args.kv_transfer_config = transfer_config(endpoint)
        vllm_config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        stats = StatsCollector()
        with env:  # its engine core and worker processes read the side channel when spawned
            llm = AsyncLLM.from_vllm_config(vllm_config, stat_loggers=[stats.factory], disable_log_stats=True)
        log.info("vLLM engine started: %s, %d KV tokens, batch %d, KV connector %s (%s)", model_dir,
                 usable_kv_tokens(vllm_config.cache_config), config.max_running_requests, connector,
                 why if endpoint is None else f"{endpoint.engine_id}, side channel {endpoint.host}:{endpoint.port}")
        return cls(llm, stats, config, weight_version, f"{connector}: {why}")

    async def _unpin_compute(self) -> None:
        """NIXL moved the worker's forward pass onto its transfer core; back to the engine's own
        (vllm/worker.VenusWorkerExtension.venusrl_unpin_compute)."""
        try:
            cores = await self.llm.collective_rpc("venusrl_unpin_compute")
            log.info("vLLM engine %s: forward pass back on cores %s (per worker) after NIXL's pinning", self.nixl.engine_id,
                     cores)
        finally:
            self._serving.set()

    # ---- generation -------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, priority: Priority | None = None,
                       trajectory_id: str | None = None) -> AsyncIterator[RequestOutput]:
        if priority is None:
            priority = self._priority_of(trajectory_id)
        if trajectory_id is not None:
            self._trajectories[trajectory_id] = priority
        stream = _Stream(f"vllm-{next(self._ids)}", trajectory_id, list(prompt_ids), sampling, priority)
        self._streams[stream.request_id] = stream
        finished = False
        try:
            while not finished:
                new, reason = 0, None
                async with aclosing(self._issue(stream)) as issued:  # leaving early aborts the vLLM request
                    async for new, reason in issued:
                        if new and reason is None:
                            yield stream.output(new)
                if reason == "abort" and len(stream.output_ids) >= sampling.max_new_tokens:
                    reason = "length"  # aborted for a re-issue just as its last token came
                elif reason == "abort" and stream.reissue and not stream.caller_aborted:
                    if new:
                        yield stream.output(new)
                    await stream.resumed.wait()
                    continue
                finished = True
                yield stream.output(new, True, reason)
        finally:
            self._streams.pop(stream.request_id, None)

    async def _issue(self, stream: _Stream) -> AsyncIterator[tuple[int, str | None]]:
        """Issue the stream once more as a vLLM request continuing its output; yields (tokens
        added to the stream, finish reason or None) per vLLM output."""
        await self._serving.wait()
        stream.reissue = False
        stream.resumed.clear()
        stream.issues += 1
        stream.vllm_id = vllm_id = f"{stream.request_id}.{stream.issues}"
        produced = 0  # output tokens of this vLLM request
        prompt = TokensPrompt(prompt_token_ids=stream.prompt_ids + stream.output_ids)
        params = vllm_params(stream.sampling, len(stream.output_ids), stream.trajectory_id)
        async with aclosing(self.llm.generate(prompt, params, vllm_id, priority=int(stream.priority))) as outputs:
            async for out in outputs:
                completion = out.outputs[0]
                tokens = list(completion.token_ids)
                versions = self._versions(vllm_id, completion.weight_versions, produced, len(tokens))
                for i, token in enumerate(tokens):
                    stream.output_ids.append(token)
                    stream.logprobs.append(completion.logprobs[i][token].logprob)
                    stream.weight_versions.append(versions[i])
                produced += len(tokens)
                yield len(tokens), completion.finish_reason if out.finished else None

    def _versions(self, vllm_id: str, spans, start: int, count: int) -> list[int]:
        """The weight version of output tokens [start, start + count) of a vLLM request: from the
        spans vLLM's engine core stamped per step (on the final output, or in the request's
        state before it; a span's start never changes once recorded, so reading them after the
        tokens were produced is exact)."""
        if spans is not None:
            bounds = [(s.start, s.end, s.version) for s in spans]
        else:
            state = self.llm.output_processor.request_states.get(vllm_id)
            starts = state.weight_version_starts if state is not None else []
            ends = [s for _, s in starts[1:]] + [start + count]
            bounds = [(s, e, v) for (v, s), e in zip(starts, ends, strict=False)]
        versions = []
        for position in range(start, start + count):
            label = next((v for s, e, v in bounds if s <= position < e), None)
            versions.append(self._version if label in (None, "default") else int(label))
        return versions

    async def abort(self, request_id: str) -> RequestOutput | None:
        stream = self._streams.get(request_id)
        if stream is None:
            return None
        stream.caller_aborted = True
        stream.resumed.set()
        if stream.vllm_id is not None:
            await self.llm.abort(stream.vllm_id)
        log.info("request %s aborted from outside its stream", request_id)
        return stream.output(0, True, "abort")

    # ---- trajectories -------------------------------------------------------------------------

    def set_priority(self, trajectory_id: str, priority: Priority) -> None:
        """vLLM fixes a request's priority when it is added: the trajectory's live requests are
        aborted and issued again at the new priority as continuations (their full KV blocks
        stay in the prefix cache, so only the last partial block is recomputed); our scheduler
        is told first, so the trajectory's hold (vllm/tiers.py) moves tier."""
        self._trajectories[trajectory_id] = priority
        loop = asyncio.get_running_loop()
        loop.create_task(self._control(control_id("priority", trajectory_id, priority)))  # its hold moves tier
        issued = []
        for stream in self._streams.values():
            if stream.trajectory_id != trajectory_id or stream.priority == priority:
                continue
            stream.priority = priority  # a stream not yet issued is issued at it
            if stream.vllm_id is not None:
                stream.reissue = True
                stream.resumed.set()
                issued.append(stream.vllm_id)
        if issued:
            loop.create_task(self.llm.abort(issued))

    async def start_trajectory(self, trajectory_id: str, priority: Priority) -> None:
        self._trajectories[trajectory_id] = priority
        await self._control(control_id("start", trajectory_id, priority))

    async def release_trajectory(self, trajectory_id: str) -> bool:
        """Its hold in the scheduler ends: its KV becomes plain LRU cache."""
        if self._trajectories.pop(trajectory_id, None) is None:
            return False
        await self._control(control_id("release", trajectory_id))
        return True

    async def _control(self, control: str) -> None:
        """A control id to our scheduler (vllm/tiers.py), on vLLM's abort channel straight to
        the engine core: ordered with this client's requests, and unknown to the output
        processor, which `llm.abort` would consult."""
        await self.llm.engine_core.abort_requests_async([control])

    async def demoted_trajectories(self) -> frozenset[str]:
        """As the scheduler reported at its latest step, less trajectories released since."""
        return self._stats.demoted.intersection(self._trajectories)

    # ---- load and stats -----------------------------------------------------------------------

    def _high_pressure(self) -> float:
        """HIGH/PROMOTED KV demand (their contexts so far) over the KV capacity."""
        demand = sum(len(s.prompt_ids) + len(s.output_ids) for s in self._streams.values()
                     if s.priority <= Priority.HIGH)
        return demand / max(self.kv_capacity_tokens, 1)

    async def load(self) -> EngineLoad:
        return EngineLoad.from_stats(await self.stats(), await self.demoted_trajectories())

    async def stats(self) -> EngineStats:
        return self._stats.engine_stats(self.kv_capacity_tokens, self._high_pressure(), len(self._trajectories),
                                        self._version)

    async def steps_since(self, index: int) -> StepLogSlice:
        """The steps vLLM timed and shaped (its iteration details; vllm/stats.py says how they
        map onto our `StepSample`)."""
        return self._stats.steps.since(index)

    async def export_prefix(self, token_ids: list[int]) -> PrefixKV:
        """No KV leaves a vLLM engine as host tensors: vLLM exposes its KV only through KV
        connectors, which act inside its scheduler per request, not on a call like this one.
        Between vLLM engines, `send_prefix` moves it over NIXL."""
        return PrefixKV(0, self._empty_kv())

    async def import_prefix(self, token_ids: list[int], kv: HostKV, trajectory_id: str | None = None) -> int:
        return 0  # see export_prefix

    async def send_prefix(self, token_ids: list[int], target: EngineClient, trajectory_id: str | None = None) -> int:
        """Over NIXL when both engines started with it (vllm/nixl.py): the whole blocks of the
        context but its last token, now in the target's prefix cache (held for the trajectory);
        otherwise 0 and the target recomputes the prefix."""
        peer = getattr(target, "nixl", None)
        if self.nixl is None:
            if not self._said_recompute:
                self._said_recompute = True
                log.info("moved turns recompute their prefix on the target engine: no KV connector (%s)",
                         self.connector)
            return 0
        if not isinstance(peer, NixlPeer):
            log.info("trajectory %s: no prefix KV moved: the target is not a vLLM engine with NIXL; it recomputes",
                     trajectory_id)
            return 0
        return await self.nixl.send(token_ids, peer, trajectory_id)

    def _priority_of(self, trajectory_id: str | None) -> Priority:
        return self._trajectories.get(trajectory_id, Priority.LOW) if trajectory_id else Priority.LOW

    @property
    def kv_address(self) -> KVAddress | None:
        return None  # no receiver of host-tensor KV: see export_prefix

    def info(self) -> EngineInfo:
        hf, cache = self.llm.model_config.hf_config, self.llm.vllm_config.cache_config
        eos = getattr(hf, "eos_token_id", None)
        return EngineInfo(hf.vocab_size, self.llm.model_config.max_model_len, self.kv_capacity_tokens,
                          cache.block_size, tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]))

    def _empty_kv(self) -> HostKV:
        hf = self.llm.model_config.hf_config
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        shape = (hf.num_hidden_layers, 0, hf.num_key_value_heads, head_dim)
        return HostKV(torch.empty(shape), torch.empty(shape))

    # ---- weights, health, shutdown ------------------------------------------------------------

    async def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Applied now: generation pauses with in-flight requests aborted and the prefix cache
        cleared, the weights load in place in each worker, generation resumes, and each aborted
        request is issued again as a continuation under the new weights."""
        if version <= self._version:
            raise ValueError(f"weight version {version} is not newer than {self._version}")
        tied = getattr(self.llm.model_config.hf_config, "tie_word_embeddings", False)
        tensors = {n: t.detach().cpu().contiguous() for n, t in state_dict.items() if not (tied and n == "lm_head.weight")}
        async with self._update_lock:
            if self.nixl is not None:  # no move in flight across the switch (vllm/nixl.MoveGuard)
                await self.nixl.guard.quiesce()
            try:
                live = await self._load_paused(tensors, version)
            finally:
                if self.nixl is not None:
                    self.nixl.guard.resume()
        log.info("weights updated to version %d (%d tensors, %d requests re-issued)", version, len(tensors), len(live))

    async def _load_paused(self, tensors: dict[str, torch.Tensor], version: int) -> list[_Stream]:
        """Pause (in-flight requests aborted, the prefix cache cleared), load, resume; the
        streams to issue again."""
        with tempfile.TemporaryDirectory(dir=_SHM if os.path.isdir(_SHM) else None) as tmp:
            path = os.path.join(tmp, "weights.safetensors")
            await asyncio.to_thread(save_file, tensors, path)
            self._serving.clear()  # no vLLM request is added until the new weights serve
            live = [s for s in self._streams.values() if s.vllm_id is not None]
            for stream in live:
                stream.reissue = True
            await self.llm.pause_generation(mode="abort", clear_cache=self.nixl is None)
            if self.nixl is not None:  # exported blocks may still wait for their reader's notice
                await self.nixl.clear_prefix_cache()
            await self.llm.collective_rpc("venusrl_load_weights", args=(path,))
        await self.llm.update_weight_version(str(version))
        self._version = version
        await self.llm.resume_generation()
        self._serving.set()
        for stream in live:
            stream.resumed.set()
        return live

    async def health(self) -> EngineHealth:
        try:
            await self.llm.check_health()
        except Exception as err:  # vLLM raises EngineDeadError once its core process is gone
            return EngineHealth(False, self._version, 0, str(err))
        return EngineHealth(True, self._version, 0)

    async def shutdown(self) -> None:
        self.llm.shutdown()
