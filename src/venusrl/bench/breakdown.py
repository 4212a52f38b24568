"""Where an engine's time goes: every step it runs is timed and shaped (the engine's own step
log, `engine/step_log.py`, read over `EngineClient.steps_since`), and the round's
engine-seconds are split into decode, prefill computed for the first time, recompute,
wasted decode (discarded trajectories, tokens sampled for a request that was aborted before
they were delivered) and idle.

A step's time is split between its prefill and its decode by the linear step cost
(`sim.cost_model.fit` over every step of the bench): prefill gets `token_s` per computed
prompt token, decode the rest (the step's fixed cost, one `token_s` per sampled sequence and
the KV it reads), both scaled so they add up to the step's measured time. Recompute and
wasted decode are then shares of prefill and decode time by their token counts. The steps'
shape (`step_shape`: count, sequences a decode step, seconds a step) tells more, smaller
steps from slower ones.

The idle is split by the engines' own account of their time between steps (`StepLog`): waits
with no request at all (every trajectory placed there is in a tool, finished, or not yet
admitted by the window), waits with requests it could not admit, running its callers' calls
(requests added and aborted, priorities, stats, prefix KV copies), and the rest, between
steps (delivery, and the OS running something else).

An engine that does not count recomputed tokens or tokens sampled for aborted requests (vLLM
counts no aborted-unseen tokens) leaves them out of `tokens`: their time stays inside
prefill_computed and decode, and the breakdown names them under `not_counted`; one that keeps
no account of its waits (vLLM) gets no idle split.
"""

from __future__ import annotations

from typing import Any

from venusrl.engine.step_log import StepSample
from venusrl.sim.cost_model import CostModel


def split_busy(samples: list[StepSample], cost: CostModel) -> tuple[float, float]:
    """(prefill seconds, decode seconds) of the measured steps."""
    prefill_s = decode_s = 0.0
    for s in samples:
        p = cost.token_s * s.prefill_tokens
        d = cost.fixed_s + cost.token_s * s.decode_seqs + cost.kv_token_s * s.kv_tokens
        if p + d <= 0:  # a cost model with nothing to price by: the step counts as decode
            p, d = 0.0, 1.0
        prefill_share = p / (p + d)  # a share first, then the seconds: no denormal product underflows
        prefill_s += s.seconds * prefill_share
        decode_s += s.seconds * (1 - prefill_share)
    return prefill_s, decode_s


def breakdown(samples: list[StepSample], cost: CostModel, engine_s: float, tokens: dict[str, int],
              waits: dict[str, float] | None = None) -> dict[str, Any]:
    """Engine-seconds of a round (`engine_s` = engines x wall time) by what they were spent
    on, with each part's fraction. `tokens`: sampled, prefill_computed, recomputed,
    discarded, aborted_unseen. `waits`: the engines' own idle_no_request_s, idle_stalled_s and
    calls_s (`StepLog`), which split the idle into no request at all, requests the engine
    could not admit, its callers' calls, and between steps (delivery, the OS running something
    else); None: no idle split (the engines keep no account of their waits)."""
    prefill_s, decode_s = split_busy(samples, cost)
    recompute_s = prefill_s * _share(tokens.get("recomputed", 0), tokens["prefill_computed"])
    discarded = min(tokens["discarded"], tokens["sampled"])
    discarded_s = decode_s * _share(discarded, tokens["sampled"])
    unseen_s = decode_s * _share(min(tokens.get("aborted_unseen", 0), tokens["sampled"] - discarded), tokens["sampled"])
    seconds = {
        "decode_s": decode_s - discarded_s - unseen_s,
        "prefill_computed_s": prefill_s - recompute_s,
        "recompute_s": recompute_s,
        "wasted_discarded_s": discarded_s,
        "wasted_aborted_s": unseen_s,
        "idle_s": max(0.0, engine_s - prefill_s - decode_s),
    }
    not_counted = [part for part, count in (("recompute_s", "recomputed"), ("wasted_aborted_s", "aborted_unseen"))
                   if count not in tokens]
    for part in not_counted:
        del seconds[part]
    out: dict[str, Any] = {k: round(v, 3) for k, v in seconds.items()}
    out["engine_s"] = round(engine_s, 3)
    out["fractions"] = _fractions(seconds, engine_s)
    out["steps"] = step_shape(samples)
    if not_counted:
        out["not_counted"] = not_counted
    if waits is None:
        return out
    no_request = min(seconds["idle_s"], waits.get("idle_no_request_s", 0.0))
    stalled = min(seconds["idle_s"] - no_request, waits.get("idle_stalled_s", 0.0))
    calls = min(seconds["idle_s"] - no_request - stalled, waits.get("calls_s", 0.0))
    split = {"no_request_s": no_request, "stalled_s": stalled, "calls_s": calls,
             "between_steps_s": seconds["idle_s"] - no_request - stalled - calls}
    out["idle_split"] = {**{k: round(v, 3) for k, v in split.items()}, "fractions": _fractions(split, engine_s)}
    return out


def step_shape(samples: list[StepSample]) -> dict[str, float]:
    """How many steps the engines ran, how many sequences a step with decode in it decoded,
    and how long a step took: the same tokens decoded in more, smaller steps (slots left
    empty) and in slower steps (the engine's process starved of CPU) both lengthen decode."""
    decoding = [s for s in samples if s.decode_seqs > 0]
    return {"count": len(samples),
            "mean_decode_seqs": round(sum(s.decode_seqs for s in decoding) / len(decoding), 3) if decoding else 0.0,
            "mean_step_s": round(sum(s.seconds for s in samples) / len(samples), 6) if samples else 0.0}


def _fractions(seconds: dict[str, float], engine_s: float) -> dict[str, float]:
    return {k.removesuffix("_s"): round(v / engine_s, 4) if engine_s else 0.0 for k, v in seconds.items()}


def _share(part: int, whole: int) -> float:
    return min(1.0, part / whole) if whole > 0 else 0.0
