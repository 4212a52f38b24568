"""A measured round's timeline, for replaying it offline (`bench/measured_runs.py`) and for
finding where its time goes that the simulator does not price: every call the rollout side
made to each engine (when it started and ended, on the driver's clock), every generate
request's first and last output, each engine's own step log and waits, every turn's
boundaries as the coordinator recorded them, and the CPU time of each process.

All times are `time.monotonic()` seconds from the round's start: host-wide on Linux, so the
driver's calls and the engine processes' step ends compare.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from venusrl.engine.step_log import StepSample
from venusrl.types import Group

CLOCK = time.monotonic


@dataclass(slots=True)
class CallLog:
    """What the driver asked of one engine: each call (name, started, ended) and each
    generate request's times, absolute monotonic seconds."""

    calls: list[tuple[str, float, float]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def figures(self, origin: float) -> dict[str, Any]:
        """Relative to `origin`: calls as columns, requests as rows."""
        return {"calls": {"name": [c[0] for c in self.calls], "started_s": _rel([c[1] for c in self.calls], origin),
                          "ended_s": _rel([c[2] for c in self.calls], origin)},
                "requests": [{**r, **{k: None if r[k] is None else round(r[k] - origin, 6)
                                      for k in ("called_s", "first_s", "last_s")}} for r in self.requests]}


class TimedClient:
    """An `EngineClient` that logs every call made to it in `log` (the driver's side of the
    timeline); everything else passes through."""

    def __init__(self, client: Any, log: CallLog) -> None:
        self.client, self.log = client, log

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if not callable(attr) or name.startswith("_"):
            return attr
        if inspect.iscoroutinefunction(attr):
            async def timed(*args: Any, **kwargs: Any) -> Any:
                started = CLOCK()
                try:
                    return await attr(*args, **kwargs)
                finally:
                    self.log.calls.append((name, started, CLOCK()))
            return timed

        def notified(*args: Any, **kwargs: Any) -> Any:
            started = CLOCK()
            try:
                return attr(*args, **kwargs)
            finally:
                self.log.calls.append((name, started, CLOCK()))
        return notified

    async def generate(self, prompt_ids, sampling, priority=None, trajectory_id=None):
        record: dict[str, Any] = {"trajectory": trajectory_id, "priority": None if priority is None else int(priority),
                                  "prompt_tokens": len(prompt_ids), "max_new_tokens": sampling.max_new_tokens,
                                  "called_s": CLOCK(), "first_s": None, "last_s": None, "outputs": 0, "tokens": 0,
                                  "finish_reason": None}
        try:  # closed with this one, so a consumer leaving early aborts the request at once
            async with contextlib.aclosing(self.client.generate(prompt_ids, sampling, priority,
                                                                trajectory_id)) as outputs:
                async for output in outputs:
                    now = CLOCK()
                    record["first_s"] = record["first_s"] or now
                    record["last_s"] = now
                    record["outputs"] += 1
                    record["tokens"] = len(output.output_ids)
                    record["finish_reason"] = output.finish_reason if output.finished else None
                    yield output
        finally:
            self.log.requests.append(record)


def step_columns(samples: Iterable[StepSample], origin: float) -> dict[str, list]:
    """An engine's step log as columns; `ended_s` from `origin`."""
    samples = list(samples)
    return {"prefill_tokens": [s.prefill_tokens for s in samples], "decode_seqs": [s.decode_seqs for s in samples],
            "kv_tokens": [s.kv_tokens for s in samples], "seconds": [round(s.seconds, 7) for s in samples],
            "ended_s": _rel([s.ended_s for s in samples], origin)}


def samples_of(columns: dict[str, list]) -> list[StepSample]:
    """`step_columns` back as samples (`ended_s` as recorded, from the round's start)."""
    return [StepSample(*row) for row in zip(columns["prefill_tokens"], columns["decode_seqs"], columns["kv_tokens"],
                                            columns["seconds"], columns["ended_s"], strict=True)]


def turn_rows(groups: Iterable[Group], origin: float) -> list[dict[str, Any]]:
    """Every trajectory's turns as the coordinator recorded them: when each started (its
    context was ready and it asked for generation), when it ended (its output delivered to
    the agent loop) and how long its tool took, from `origin`."""
    return [{"trajectory": t.id, "group": group.id, "index": t.index, "attempt": t.attempt,
             "turns": [[round(turn.started_at - origin, 6), round(turn.ended_at - origin, 6),
                        None if turn.tool_seconds is None else round(turn.tool_seconds, 6),
                        turn.generated_tokens, turn.context_tokens] for turn in t.turns]}
            for group in groups for t in group.trajectories if t.turns]


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process `pid` so far (Linux /proc), None where unknown."""
    return None if pid is None else _stat_cpu_s(Path(f"/proc/{pid}/stat"))


def thread_cpu_s() -> dict[str, float]:
    """User + system CPU seconds so far of each live thread of this process, by thread name
    (threads of one name summed, those Python did not start under "other"); empty where
    /proc is not there."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    out: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            cpu = _stat_cpu_s(Path(f"/proc/self/task/{tid}/stat"))
            if cpu is not None:  # None: the thread ended meanwhile
                out[names.get(int(tid), "other")] += cpu
    return dict(out)


def _stat_cpu_s(stat: Path) -> float | None:
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rel(values: Iterable[float], origin: float) -> list[float]:
    return [round(v - origin, 6) for v in values]
