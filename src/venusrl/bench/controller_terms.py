"""What a measured run spends between the engines' steps and the rollout side's turns that the
cost model's step fit cannot see, fitted on a calibration run's timeline (`bench/timeline.py`)
for the simulator to use unchanged on other runs:

- `output_s`: an engine's time between two steps per output it hands over (one a sampled
  sequence): the engine time that is neither a step, nor a wait with no request or with
  requests it could not admit, nor its callers' calls (the engines' own account, `StepLog`),
  over the outputs of the steps. Per output, not per step: the between-steps time of the
  three scheduling modes differs by 2x per step and by 10% per output, as each step of a
  mode that holds slots through tools samples fewer sequences.
- `call_s`: an engine's time running its callers' calls (its own account) over the calls the
  worker made to it: every call it logged, each request added and each one it left early
  (an abort).
- `delivery_latency_s`: from the end of the step that sampled a request's first token to the
  worker holding it (the engine handing it over, its process sending it, the rollout process
  reading it): the mean over the run's requests. A finished request's output travels the same
  way, and its turn ends only then.
- `demoted_query_s`: the mean time of the worker's `demoted_trajectories` calls (venus reads
  its engine's demoted set before a turn that may hold a slot asks for one: the set the engine
  last pushed, or the wait for a new connection's first push).
- `prediction_latency_s`: the mean time from a length query to the worker polling its answer.

Fitted on the modes validated only; all four from one run, none from the runs validated.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from venusrl.engine.step_log import WAITS


@dataclass(slots=True, frozen=True)
class ControllerTerms:
    output_s: float
    call_s: float
    delivery_latency_s: float
    demoted_query_s: float
    prediction_latency_s: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def fit(measured: dict[str, Any], modes: Iterable[str], venus: str = "venus") -> ControllerTerms:
    """The terms of `measured` (a bench JSON recorded with timelines) over the rounds of
    `modes`; the demoted-set query and prediction latencies from `venus`'s rounds."""
    rounds = [(mode, r) for mode in modes for r in measured[mode]["rounds"]]
    for mode, r in rounds:
        if not r.get("timeline"):
            raise ValueError(f"{mode}: a measured round has no timeline: rerun the bench with record=True "
                             "(`venusrl simulate --scenario validate` measures it so)")
    between = outputs = calls_s = calls = 0.0
    deliveries: list[float] = []
    for _, r in rounds:
        end = r["time_to_last_step_s"]
        for engine in r["timeline"]["engines"]:
            steps = {k: np.asarray(v, dtype=float) for k, v in engine["steps"].items()}
            kept = (steps["ended_s"] >= 0) & (steps["ended_s"] <= end)
            between += end - steps["seconds"][kept].sum() - sum(engine["waits_s"][k] for k in WAITS)
            outputs += steps["decode_seqs"][kept].sum()
            deliveries += first_output_delays(steps, engine["calls"]["requests"], end)
            calls_s += engine["waits_s"]["calls_s"]
            calls += sum(0 <= t <= end for t in engine["calls"]["calls"]["started_s"])
            calls += sum(1 + (q["finish_reason"] is None) for q in engine["calls"]["requests"] if 0 <= q["called_s"] <= end)
    queries = [b - a for r in measured[venus]["rounds"] for engine in r["timeline"]["engines"]
               for name, a, b in zip(*(engine["calls"]["calls"][k] for k in ("name", "started_s", "ended_s")),
                                     strict=True)
               if name == "demoted_trajectories" and 0 <= a <= r["time_to_last_step_s"]]
    predictions = [s for r in measured[venus]["rounds"] for s in r["timeline"].get("prediction_latencies_s", [])]
    return ControllerTerms(output_s=max(0.0, between) / outputs if outputs else 0.0,
                           call_s=calls_s / calls if calls else 0.0,
                           delivery_latency_s=statistics.fmean(deliveries) if deliveries else 0.0,
                           demoted_query_s=statistics.fmean(queries) if queries else 0.0,
                           prediction_latency_s=statistics.fmean(predictions) if predictions else 0.0)


def first_output_delays(steps: dict[str, np.ndarray], requests: list[dict[str, Any]], end: float) -> list[float]:
    """Per request sent in [0, `end`] that got an output: its first output's time at the worker
    minus the end of the step that sampled it, the last prefill step of its engine between
    the request's call and that output."""
    prefill = np.nonzero(steps["prefill_tokens"] > 0)[0]
    ends = steps["ended_s"][prefill]
    delays = []
    for request in requests:
        called, first = request["called_s"], request["first_s"]
        if first is None or not 0 <= called <= end:
            continue
        between = np.nonzero((ends >= called) & (ends <= first))[0]
        if len(between):
            delays.append(first - ends[between[-1]])
    return delays
