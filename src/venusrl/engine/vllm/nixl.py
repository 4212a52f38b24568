"""A moved turn's prefix KV between two vLLM engines through vLLM's NixlConnector
(`engine.vllm_kv_connector`), as far as vLLM 0.32's NIXL pull protocol allows.

NIXL's pull moves the KV of exactly the prompt the source prefilled: the target claims its whole
prompt as remote (`nixl/pull_scheduler.py:59-65`), so a longer prompt carrying the source's
`kv_transfer_params` kills the target's engine core (`nixl/base_worker.py:3453`) or reads slots
the source never filled (results/vllm/nixl-connector). A move is therefore two requests of the
same short prompt and no change to the turn:
1. export: the source serves `token_ids[:n + 1]` (n: the whole blocks of the context but its last
   token) with `max_tokens=1` and `do_remote_decode`; its prefix-cache lookup, which stops one
   token short of the prompt, finds all n tokens, so it computes one token, and it keeps the
   request's blocks for the target (until the target has read them, or the lease ends);
2. pull: the target serves the same prompt with the source's `kv_transfer_params` and
   `max_tokens=1`: it reads the blocks over NIXL, computes the last token, and caches the n
   tokens' full blocks (held for the trajectory by our scheduler class, vllm/tiers.py);
3. the moved turn then runs on the target as a plain request, and its prefix-cache lookup finds
   the n tokens.

Which engines get the connector, and how they are started, is vllm/connector.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from vllm import SamplingParams as VLLMSamplingParams
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind

from venusrl.engine.vllm.connector import LEASE_S, moved_tokens
from venusrl.engine.vllm.tiers import TRAJECTORY_ARG
from venusrl.types import Priority

log = logging.getLogger(__name__)

_ids = itertools.count()  # the export and pull requests' ids


@dataclass(slots=True)
class MoveGuard:
    """Moves and weight updates of one engine never overlap: a weight update clears vLLM's
    prefix cache, which fails while exported blocks wait for their reader, and KV must not cross
    weight versions. An update stops new moves and waits for those in flight."""

    in_flight: int = 0
    updating: bool = False
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()

    @contextlib.contextmanager
    def moving(self) -> Iterator[None]:
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()

    async def quiesce(self) -> None:
        self.updating = True
        await self._idle.wait()

    def resume(self) -> None:
        self.updating = False


@dataclass(slots=True)
class NixlPeer:
    """One vLLM engine's side of NIXL moves: its `AsyncLLM`, engine id, block size, current
    weight version and trajectory priorities (read through its engine)."""

    llm: Any
    engine_id: str  # its NixlConnector's
    block_size: int
    version: Callable[[], int]
    priority_of: Callable[[str | None], Priority]
    guard: MoveGuard = field(default_factory=MoveGuard)

    async def send(self, token_ids: list[int], target: NixlPeer, trajectory_id: str | None) -> int:
        """Move the prefix KV of `token_ids` (a trajectory's context) to `target`; the tokens
        now in the target's prefix cache for it, or 0 with the reason logged."""
        tokens = moved_tokens(len(token_ids), self.block_size)
        why = self._refusal(target, tokens)
        if why:
            log.info("trajectory %s: no prefix KV moved to %s (%s); it recomputes there", trajectory_id,
                     target.engine_id, why)
            return 0
        prompt = list(token_ids[: tokens + 1])
        started = time.perf_counter()
        with self.guard.moving(), target.guard.moving():
            params = await self._serve(prompt, {"do_remote_decode": True}, self.priority_of(trajectory_id), None)
            if not (params or {}).get("do_remote_prefill"):
                log.info("trajectory %s: the export of %d tokens did not finish (%s); it recomputes", trajectory_id,
                         tokens, params)
                return 0
            if not await target.pull(prompt, params, trajectory_id):
                log.warning("trajectory %s: %s could not read %d exported tokens; it recomputes", trajectory_id,
                            target.engine_id, tokens)
                return 0
        log.info("trajectory %s: %d prefix tokens moved %s -> %s over NIXL in %.1f ms", trajectory_id, tokens,
                 self.engine_id, target.engine_id, (time.perf_counter() - started) * 1e3)
        return tokens

    def _refusal(self, target: NixlPeer, tokens: int) -> str:
        if not tokens:
            return f"the context fills no whole KV block of {self.block_size} tokens before its last token"
        if target.block_size != self.block_size:
            return f"KV blocks differ ({self.block_size} vs {target.block_size} tokens)"
        if self.guard.updating or target.guard.updating:
            return "a weight update is under way"
        if self.version() != target.version():
            return f"weight versions differ ({self.version()} vs {target.version()})"
        return ""

    async def pull(self, prompt: list[int], params: dict[str, Any], trajectory_id: str | None) -> bool:
        """Read the exported KV of exactly `prompt` (the source's `kv_transfer_params`); its
        full blocks enter this engine's prefix cache, held for the trajectory."""
        return await self._serve(prompt, dict(params), self.priority_of(trajectory_id), trajectory_id) is not None

    async def _serve(self, prompt: list[int], transfer: dict[str, Any], priority: Priority,
                     trajectory_id: str | None) -> dict[str, Any] | None:
        """One greedy 1-token request of `prompt` carrying `transfer` as its kv_transfer_params;
        the kv_transfer_params it returns (`{}` if none), or None when it did not run to its
        length (aborted, or a failed KV load: vLLM's kv_load_failure_policy `fail`)."""
        extra = {"kv_transfer_params": transfer}
        if trajectory_id is not None:
            extra[TRAJECTORY_ARG] = trajectory_id
        params = VLLMSamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False,
                                    output_kind=RequestOutputKind.FINAL_ONLY, extra_args=extra)
        last = None
        request_id = f"venusrl-nixl-{next(_ids)}"
        async for out in self.llm.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id,
                                           priority=int(priority)):
            last = out
        if last is None or last.outputs[0].finish_reason != "length":
            return None
        return last.kv_transfer_params or {}

    async def clear_prefix_cache(self) -> None:
        """vLLM's prefix-cache reset, once no exported block waits for its reader: a paused
        engine core keeps stepping while it holds such blocks (`Scheduler.has_finished_requests`,
        v1/core/sched/scheduler.py:2813-2821) and frees them when the reader's notice comes, or
        when the lease ends."""
        deadline = time.monotonic() + LEASE_S + 5
        while not await self.llm.reset_prefix_cache():
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM engine {self.engine_id}: the prefix cache could not be cleared "
                                   f"for a weight update: blocks stayed in use past the {LEASE_S} s KV lease")
            await asyncio.sleep(0.01)
