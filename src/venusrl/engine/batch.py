"""What the scheduler hands the runner each step (see the contract in scheduler.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from venusrl.engine.request import PartialOutput
from venusrl.types import SamplingParams


@dataclass(slots=True, frozen=True)
class ScheduledRequest:
    """One request's share of a step: compute ``token_ids`` at ``positions``.

    ``new_slots[i]`` is where the KV of ``token_ids[i]`` goes. ``context_slots`` are the KV
    slots of the whole sequence up to and including the new tokens (cached prefix, earlier
    chunks, then ``new_slots``), in position order: the token at position ``q`` attends to
    ``context_slots[: q + 1]``. When ``sample`` is true the runner samples one token from the
    logits of the last new token and reports it; otherwise this is a non-final prefill chunk.
    """

    request_id: str
    token_ids: list[int]
    positions: list[int]
    new_slots: list[int]
    context_slots: list[int]
    sample: bool
    sampling: SamplingParams
    num_generated: int  # output tokens so far (a per-request seed can be offset by it)


@dataclass(slots=True, frozen=True)
class KVCopy:
    """KV moved between the device pool and the host tier, slot i to slot i, done by the
    runner in list order before the step's forward pass (so a page evicted and reused in the
    same step is saved before it is overwritten)."""

    to_host: bool  # True: an evicted page saved; False: a host hit loaded back
    device_slots: list[int]
    host_slots: list[int]


@dataclass(slots=True)
class Batch:
    items: list[ScheduledRequest] = field(default_factory=list)
    # Sent back to the waiting queue this step (retracted for memory or preempted for a HIGH
    # request); their KV stays in the radix cache as long as memory allows.
    retracted: list[str] = field(default_factory=list)
    # Ended while scheduling (a lone request that outgrew the KV pool ends with "length").
    finished: list[PartialOutput] = field(default_factory=list)
    # Aborted through Scheduler.abort since the previous batch.
    aborted: list[str] = field(default_factory=list)
    kv_copies: list[KVCopy] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(item.token_ids) for item in self.items)

    def __bool__(self) -> bool:
        return bool(self.items or self.retracted or self.finished or self.aborted or self.kv_copies)
