"""How one micro-batch of trajectories is laid out for a forward pass: right-padded rows, or one
row packed without padding.

Every tensor is per position [B, L]: position t of a row predicts `targets[b, t]`, the token
after it (-100 where the row has none: its last token, padding); `mask` marks the targets that
were generated (the trained tokens), `behaviour` holds the engine's log-prob of each target and
`advantages` its trajectory's advantage. Both layouts give the same values at masked positions.

Packed: the trajectories are concatenated into one row, `position_ids` restarting at 0 for each,
and no attention mask; transformers then masks attention across the boundaries from the
position ids (block-diagonal causal mask under sdpa and eager, varlen under flash attention).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from venusrl.trainer.shared_prefix import right_padded
from venusrl.types import Trajectory

IGNORE = -100
# transformers' attention implementations that split a packed row at its position ids instead of
# masking a [tokens, tokens] score matrix (trainer.pack_rows: auto packs under these)
PACKED_ATTENTION = frozenset({"flash_attention_2", "flash_attention_3", "flex_attention"})


def packs_rows(setting: str, attention: str | None) -> bool:
    """Whether micro-batches are packed: trainer.pack_rows `setting` (on, off, auto) under the
    model's attention implementation."""
    return setting == "on" or (setting == "auto" and attention in PACKED_ATTENTION)


@dataclass(frozen=True, slots=True)
class Rows:
    ids: torch.Tensor  # [B, L] long
    attention: torch.Tensor | None  # [B, L] long, 1 on real tokens; None when packed
    position_ids: torch.Tensor | None  # [B, L] long when packed, else None (the decoder's default)
    targets: torch.Tensor  # [B, L] long, IGNORE where a position predicts nothing
    mask: torch.Tensor  # [B, L] bool, the generated targets
    behaviour: torch.Tensor  # [B, L] float32
    advantages: torch.Tensor  # [B, L] float32
    prefix: int  # leading tokens every row shares and the decoder computes once (padded only)

    def to(self, device: torch.device) -> Rows:
        return Rows(**{f.name: _moved(getattr(self, f.name), device) for f in fields(self)})


def _moved(value: torch.Tensor | int | None, device: torch.device) -> torch.Tensor | int | None:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def padded_rows(trajectories: list[Trajectory], advantages: torch.Tensor, prefix: int = 0) -> Rows:
    """One row per trajectory, right-padded; `advantages` [len(trajectories)]."""
    ids = right_padded([t.token_ids for t in trajectories], torch.long)
    return Rows(
        ids=ids, attention=right_padded([[1] * len(t.token_ids) for t in trajectories], torch.long),
        position_ids=None, targets=right_padded([_targets(t) for t in trajectories], torch.long, IGNORE),
        mask=right_padded([_next(t.generated_mask, False) for t in trajectories], torch.bool),
        behaviour=right_padded([_next(t.logprobs, 0.0) for t in trajectories], torch.float32),
        advantages=advantages.float()[:, None].expand(ids.shape).contiguous(), prefix=prefix)


def packed_rows(trajectories: list[Trajectory], advantages: torch.Tensor) -> Rows:
    """The trajectories one after another in a single row, no padding."""
    def cat(per_row: list[list]) -> list:
        return [value for row in per_row for value in row]

    return Rows(
        ids=torch.tensor([cat([t.token_ids for t in trajectories])]), attention=None,
        position_ids=torch.tensor([cat([list(range(len(t.token_ids))) for t in trajectories])]),
        targets=torch.tensor([cat([_targets(t) for t in trajectories])]),
        mask=torch.tensor([cat([_next(t.generated_mask, False) for t in trajectories])]),
        behaviour=torch.tensor([cat([_next(t.logprobs, 0.0) for t in trajectories])], dtype=torch.float32),
        advantages=torch.tensor([cat([[float(a)] * len(t.token_ids) for t, a in zip(trajectories, advantages.tolist(),
                                                                                      strict=True)])]),
        prefix=0)


def _targets(trajectory: Trajectory) -> list[int]:
    return _next(trajectory.token_ids, IGNORE)


def _next(values: list, last: object) -> list:
    """Position t's entry is the value of token t+1; the last position gets `last`."""
    return [*values[1:], last]
