"""Moves between engines, each with the trajectory's prefix KV. Request orchestration (paper
§4.3): when an engine's HIGH KV pressure crosses a threshold, some of its waiting requests go
to the engine with the least HIGH pressure (`choose_moves`). Decode balance (beyond the paper):
an urgent turn decodes on the engine where the fewest contexts generate beside it
(`lighter_engine`). The choices are pure; `migrate_prefix` carries one move out."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the choice of moves stays pure: no torch behind it
    from venusrl.engine.engine import Engine
    from venusrl.rollout.kv_transport import KVTransport


@dataclass(slots=True, frozen=True)
class Move:
    request: Hashable
    source: Hashable
    target: Hashable


def choose_moves(
    pressure: Mapping[Hashable, float],
    capacity: Mapping[Hashable, int],
    waiting: Mapping[Hashable, Sequence[tuple[Hashable, int]]],
    threshold: float,
    max_moves: int = 4,
) -> list[Move]:
    """`pressure`: each engine's HIGH KV demand over its `capacity` (tokens); `waiting`: per
    engine, its waiting HIGH requests as (request, KV tokens), oldest first. An engine past
    `threshold` sends its oldest waiting requests to the least-pressured engine while that
    stays below the source after taking them: a move must lower the peak, not swap it."""
    projected = dict(pressure)
    moves: list[Move] = []
    for source in sorted(pressure, key=pressure.__getitem__, reverse=True):
        for request, tokens in waiting.get(source, ()):
            others = [e for e in projected if e != source]
            if projected[source] <= threshold or len(moves) >= max_moves or not others:
                break
            target = min(others, key=projected.__getitem__)
            target_after = projected[target] + tokens / capacity[target]
            if target_after >= projected[source]:
                break
            moves.append(Move(request, source, target))
            projected[source] -= tokens / capacity[source]
            projected[target] = target_after
    return moves


def lighter_engine(loads: Sequence[int], source: int, context: int, eligible: Iterable[int]) -> int | None:
    """The engine an urgent turn of `context` tokens should decode on instead of `source`, or
    None. `loads`: each engine's decode load, the context of the turns generating there (or on
    their way there); the turn is not counted in `source`'s. A decode step reads the KV of
    every generating turn, so a turn's step time grows with its engine's load: the eligible
    engine with the least load is chosen (ties to the lowest index) if, with this turn, its
    load stays below `source`'s without it. Then the turn's steps get shorter and so do the
    source's; a move that would only make the target the heavier engine is not made."""
    target = min((i for i in eligible if i != source), key=lambda i: (loads[i], i), default=None)
    if target is None or loads[target] + context >= loads[source]:
        return None
    return target


def migrate_prefix(source: Engine, target: Engine, token_ids: list[int], transport: KVTransport,
                   trajectory_id: str | None = None) -> int:
    """Copy the KV of the longest cached prefix of token_ids from source to target; returns
    the tokens now cached on the target. Runs between engine steps on both sides."""
    exported, kv = source.export_prefix(token_ids)
    if not exported:
        return 0
    delivered, kv = transport.send(token_ids[:exported], kv)
    return target.import_prefix(delivered, kv, trajectory_id)
