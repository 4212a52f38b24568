"""The live set: which programs may generate on each engine, so that their KV fits the pool.
Pure: no clock, no engine; the rollout core drives it and turns its answers into slots.

A *program* is a trajectory. It is REASONING while it has or wants a request (it holds or
waits for a slot) and ACTING while it is in a tool call. A live program counts its context
tokens against its engine's KV capacity; a *paused* one counts nothing and gets no slot until
it is resumed (its KV, if any, stays in the engine's cache tiers, where live programs may
evict it). Every `interval_s` the driver calls `check`: paused programs resume first, then every
engine over capacity pauses programs.

Two rules, one mechanism (`LiveSetRule`):

- `thunderagent`: ThunderAgent's capacity scheduling as its source runs it
  (ThunderAgent-org/ThunderAgent @a7eef77):
  - capacity: `backend/state.py:remaining_capacity` (L182-191): capacity - (live tokens - shared
    tokens) - live programs x BUFFER_PER_PROGRAM (L23: 100 tokens); ACTING tokens weigh
    `acting_token_weight` (config.py L28: 1.0). Shared tokens are what the engine's prefix cache
    saves; ThunderAgent reads them from vLLM's KV usage (`update_shared_tokens`), here each
    group's prompt counts once per engine.
  - pause (`scheduler/router.py:_pause_until_safe`, L685-717): while an engine is over
    capacity, pause its ACTING programs, smallest first; then *mark* its REASONING ones,
    smallest first, to pause at their next tool call (`_mark_program_for_pause`, L574-586). A
    mark does not change the capacity the loop reads, so once the ACTING ones are gone every
    REASONING program of the engine is marked: the source does this, and so does this rule.
  - resume (`_greedy_resume`, L719-849): programs with a pending request, then new ones, then
    ACTING ones, each smallest first; the longest prefix of that order whose tokens plus
    buffers fit the engines' summed remaining capacity is placed best-fit-decreasing, largest
    on the engine with the most room. Remaining capacity for resuming may decay each ACTING
    program's tokens by 2^-t, t its seconds in the tool (`remaining_capacity_with_decay`,
    L193-211; off by default: `__main__.py` L32 `--use-acting-token-decay` is store_true).
  - a new program (`_select_backend_for_new_program`, L249-281) is queued while any program
    is paused, else goes to the engine with the fewest live tokens that has room for it plus
    a buffer, else it is queued.
  - interval: `config.py` L27, `scheduler_interval = 5.0` s.
  One deviation: a paused program that holds KV resumes on its own engine (where its prefix,
  or HiCache's host copy of it, lives); ThunderAgent may resume it on another backend, where
  it would recompute its whole context. New programs are placed best-fit as in the source.
- `venus`: the same mechanism ranked by the trainer's need (`urgency`, the coordinator's
  priority: PROMOTED < HIGH < LOW, critical order inside HIGH). An engine over capacity pauses
  the least urgent class first (ACTING before REASONING inside a class, smallest first) and
  never a PROMOTED program; it marks REASONING programs only until the marked tokens cover
  the overflow (a mark frees its tokens at the program's next tool call, so counting them
  avoids pausing what need not be). Resume takes the most urgent first. An engine with
  nothing to run does not wait for the next check: the most urgent paused program with a
  turn pending there (or one that never ran) resumes at once (`resume_for_idle`). Pausing
  trades recompute for idle slots; an engine at rest pays the idle and saves nothing (the
  real bench's default and long-tail cells, with 1-3 slots an engine, lost 18-20% to
  action_level without this).
  **Only where KV thrashes.** An engine's live set engages (pauses programs there) once the
  engine has recomputed more than `thrash_fraction` (0.1) of the context tokens its requests
  brought in two windows in a row, each window a pool's worth of them, read from the
  engine's own counters (`observe`; recompute is KV it had computed for the trajectory and
  evicted, not what new weights made stale). Until then every program there is live, as
  without a live set, and new programs start where the core places them; once engaged it
  stays engaged. Pausing pays only where eviction costs: in Fig. 10's quick cells at
  coarsening 1, the live set made venus 2-19% slower where the pool holds the window (4B
  batch 16 and 64, 32B batch 16: hit rates 0.97) and twice as fast where it does not (32B
  batch 64: hit rate 0.57 without it). There, an engine's windows recompute up to 9% (32B
  batch 16) with isolated windows up to 17% (4B batch 64); at 32B batch 64 windows of 11-30%
  follow one another as the contexts outgrow the pool. ThunderAgent's rule has no gate: its
  source pauses whenever the live set outgrows the pool.

Invariants (`check_invariants`, after every event; `check_fits`, venus's rule, after `check`):
- a paused program is never marked, and only a paused one waits for a resume;
- venus: after `check`, every engaged engine's live demand less the tokens of its marked
  programs fits its capacity, or every live program there that is not marked is PROMOTED; an
  engine that is not engaged has no paused and no marked program (engaging is for good, so
  it never paused one).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Literal

LiveSetRuleName = Literal["thunderagent", "venus"]

BUFFER_PER_PROGRAM = 100  # tokens of decode headroom per live program (ThunderAgent backend/state.py L23)
THUNDERAGENT_INTERVAL_S = 5.0  # ThunderAgent config.py L27: scheduler_interval
THRASH_FRACTION = 0.1  # venus: an engine's live set engages once this much of its requests' context is recomputed
THRASH_WINDOWS = 2  # ... in this many windows (of a pool's worth of context each) in a row


@dataclass(slots=True)
class Program:
    engine: int  # where it runs; paused: where it resumes (new programs: re-placed at resume)
    group: int
    prompt_tokens: int  # shared with the group's other programs on the same engine
    tokens: int
    acting: bool = False  # in a tool call
    acting_since: float = 0.0
    requests: int = 0  # requests it asked for (ThunderAgent's step_count)
    paused: bool = False
    marked: bool = False  # pause at its next tool call
    wants: bool = False  # paused with a pending request (the core queued it here)
    ran: bool = False  # it has generated on `engine`: its KV is there, so it resumes there


# The urgency of a program for the venus rule: smaller is more urgent; its first element is
# the priority class (0 PROMOTED, 1 HIGH, 2 LOW), which is never paused when 0.
Urgency = Callable[[Hashable], tuple[int, float]]


class LiveSet:
    def __init__(self, capacities: list[int], rule: LiveSetRuleName = "thunderagent", *,
                 buffer_tokens: int = BUFFER_PER_PROGRAM, acting_weight: float = 1.0,
                 acting_decay: bool = False, urgency: Urgency | None = None,
                 thrash_fraction: float = THRASH_FRACTION) -> None:
        """`thrash_fraction` (venus's rule): the share of its requests' context an engine must
        recompute before its live set engages (0: engaged from the start)."""
        if rule == "venus" and urgency is None:
            raise ValueError("the venus live-set rule needs the programs' urgency")
        if not 0.0 <= thrash_fraction <= 1.0:
            raise ValueError(f"thrash_fraction must be in [0, 1], got {thrash_fraction}")
        self.capacities, self.rule = list(capacities), rule
        self.thrash_fraction = thrash_fraction
        # engines whose live set pauses programs; venus's engage when they thrash (`observe`)
        self.engaged = [rule != "venus" or thrash_fraction == 0.0] * len(self.capacities)
        self._window = [(0, 0)] * len(self.capacities)  # (prompt, recomputed) counters where a window began
        self._thrashed = [0] * len(self.capacities)  # windows in a row over the thrash fraction
        self.buffer, self.acting_weight, self.acting_decay = buffer_tokens, acting_weight, acting_decay
        self.urgency = urgency if urgency is not None else (lambda _: (2, 0.0))
        self.programs: dict[Hashable, Program] = {}
        self.pauses = 0  # programs paused (ACTING ones at once, marked ones at their tool call)
        self.resumes = 0
        self.paused_now: list[Hashable] = []  # paused since the caller last took them (`take_paused`)

    # ---- events ----------------------------------------------------------------------------

    def start(self, key: Hashable, group: int, tokens: int, engine: int) -> bool:
        """A new program, tentatively on `engine`. Returns whether it is live; else it is
        queued paused (new programs wait while any program is paused, or where no engine has
        room) and resumes at a check, maybe on another engine."""
        if key in self.programs:
            raise ValueError(f"program {key!r} is already in the live set")
        if not self.engaged[engine]:  # venus, an engine that does not thrash: live where placed
            self.programs[key] = Program(engine, group, tokens, tokens)
            return True
        best = None if any(p.paused for p in self.programs.values()) else self._new_engine(tokens)
        self.programs[key] = Program(engine if best is None else best, group, tokens, tokens, paused=best is None)
        return best is not None

    def wants(self, key: Hashable, tokens: int) -> bool:
        """The program wants a request with `tokens` of context: whether it may ask for a slot
        now (else it waits paused until a check resumes it)."""
        program = self.programs[key]
        if program.requests == 0:  # its first request's context is the group's prompt
            program.prompt_tokens = tokens
        program.tokens, program.acting = tokens, False
        program.requests += 1
        program.wants = program.paused
        program.ran = program.ran or not program.paused
        return not program.paused

    def acted(self, key: Hashable, tokens: int, now: float) -> None:
        """Its request ended: it is in a tool call (or between turns) with `tokens` of context;
        a program marked for pause pauses now."""
        program = self.programs.get(key)
        if program is None:
            return
        program.tokens, program.acting, program.acting_since = tokens, True, now
        if program.marked:
            program.marked = False
            self._pause(key, program)

    def finish(self, key: Hashable) -> None:
        self.programs.pop(key, None)

    def moved(self, key: Hashable, engine: int) -> None:
        """The core moved the program to `engine` (its KV goes along)."""
        program = self.programs.get(key)
        if program is not None:
            program.engine = engine

    def take_paused(self) -> list[Hashable]:
        """The programs paused since the last call (the core tells their engines)."""
        paused, self.paused_now = self.paused_now, []
        return paused

    def _pause(self, key: Hashable, program: Program) -> None:
        program.paused = True
        self.pauses += 1
        self.paused_now.append(key)

    def paused(self, key: Hashable) -> bool:
        program = self.programs.get(key)
        return program is not None and program.paused

    def observe(self, engine: int, prompt_tokens: int, recomputed_tokens: int) -> bool:
        """The engine's running totals: context tokens its requests brought, and of those the
        tokens it recomputed (KV it had computed for the trajectory and evicted). Each time a
        pool's worth of context has come in since the window began, the window closes; after
        `THRASH_WINDOWS` windows in a row that each recomputed more than `thrash_fraction` of
        it, the engine's live set engages, for good. Returns whether it engaged now."""
        if self.engaged[engine]:
            return False
        start_prompt, start_recomputed = self._window[engine]
        if prompt_tokens < start_prompt:  # the engine's totals restarted (a new engine behind the client)
            self._window[engine] = (prompt_tokens, recomputed_tokens)
            return False
        brought = prompt_tokens - start_prompt
        if brought < self.capacities[engine]:
            return False
        self._window[engine] = (prompt_tokens, recomputed_tokens)
        thrashed = recomputed_tokens - start_recomputed > self.thrash_fraction * brought
        self._thrashed[engine] = self._thrashed[engine] + 1 if thrashed else 0
        self.engaged[engine] = self._thrashed[engine] >= THRASH_WINDOWS
        return self.engaged[engine]

    def watching(self) -> list[int]:
        """The engines whose counters `observe` still needs (venus's rule, not engaged yet)."""
        return [engine for engine, engaged in enumerate(self.engaged) if not engaged]

    # ---- the periodic check ----------------------------------------------------------------

    def check(self, now: float) -> list[tuple[Hashable, bool]]:
        """Resume what fits, then pause where an engine is over capacity. Returns the resumed
        programs, each with whether a turn of it is pending (it asks for its slot now). A
        program that never ran may have been placed on another engine: read its `engine`."""
        resumed = []
        for key in self._resume(now):
            program = self.programs[key]
            resumed.append((key, program.wants))
            program.ran = program.ran or program.wants
            program.wants = False
        for engine in range(len(self.capacities)):
            if self.engaged[engine] and self.remaining(engine) < 0:
                self._pause_until_safe(engine)
        return resumed

    def remaining(self, engine: int, now: float | None = None) -> float:
        """Capacity left on `engine` (negative: over). With `now` and decay on, ACTING tokens
        weigh 2^-t, t their seconds in the tool (the resume's optimistic view)."""
        live = [p for p in self.programs.values() if p.engine == engine and not p.paused]
        used = 0.0
        for p in live:
            if not p.acting:
                used += p.tokens
            elif now is not None and self.acting_decay:
                used += p.tokens * 2.0 ** -(now - p.acting_since)
            else:
                used += self.acting_weight * p.tokens
        return self.capacities[engine] - (used - _shared(live)) - len(live) * self.buffer

    def _new_engine(self, tokens: int) -> int | None:
        """The engine with the fewest live tokens that has room for `tokens` plus a buffer."""
        best, fewest = None, None
        for engine in range(len(self.capacities)):
            if self.remaining(engine) < tokens + self.buffer:
                continue
            live = sum(p.tokens for p in self.programs.values() if p.engine == engine and not p.paused)
            if fewest is None or live < fewest:
                best, fewest = engine, live
        return best

    def _resume(self, now: float) -> list[Hashable]:
        room = {e: self.remaining(e, now) for e in range(len(self.capacities))}
        room = {e: r for e, r in room.items() if r > self.buffer}
        if not room:
            return []
        paused = [(k, p) for k, p in self.programs.items() if p.paused]
        paused.sort(key=lambda kp: (*self._resume_rank(kp[0], kp[1]), kp[1].tokens))
        chosen, total = [], 0.0
        budget = sum(room.values())
        for key, program in paused:
            need = program.tokens + self.buffer
            if total + need <= budget:
                chosen.append((key, program))
                total += need
        resumed = []
        for key, program in sorted(chosen, key=lambda kp: -kp[1].tokens):  # best-fit decreasing
            need = program.tokens + self.buffer
            if not program.ran:  # no KV anywhere yet: the engine with the most room
                target = max(room, key=room.__getitem__, default=None)
            else:
                target = program.engine if program.engine in room else None
            if target is None or room[target] < need:
                continue
            program.engine, program.paused = target, False
            self.resumes += 1
            resumed.append(key)
            room[target] -= need
            if room[target] <= self.buffer:
                del room[target]
        return resumed + self._resume_oversized()

    def resume_for_idle(self, engine: int) -> Hashable | None:
        """`engine` runs nothing and nothing waits for it (venus's rule only; ThunderAgent
        resumes at its checks): the most urgent paused program with a turn pending there, or
        one that never ran (it moves there), resumes now. Returns it, or None."""
        if self.rule != "venus":
            return None
        pending = [(k, p) for k, p in self.programs.items()
                   if p.paused and p.wants and (p.engine == engine or not p.ran)]
        if not pending:
            return None
        key, program = min(pending, key=lambda kp: (*self._resume_rank(kp[0], kp[1]), kp[1].tokens))
        program.engine, program.paused, program.wants, program.ran = engine, False, False, True
        self.resumes += 1
        return key

    def _resume_oversized(self) -> list[Hashable]:
        """A program whose context outgrew a whole pool would never fit: it resumes alone, on
        an engine with no live program (ThunderAgent forces a resume after 30 minutes,
        `_wait_for_resume`; waiting that long for nothing only stalls the run)."""
        resumed = []
        for key, program in self.programs.items():
            if not program.paused or program.tokens + self.buffer <= self.capacities[program.engine]:
                continue
            if not any(p.engine == program.engine and not p.paused for p in self.programs.values()):
                program.paused = False
                self.resumes += 1
                resumed.append(key)
        return resumed

    def _resume_rank(self, key: Hashable, program: Program) -> tuple:
        """ThunderAgent's groups: pending request (0), new (1), ACTING (2); venus ranks by
        urgency first."""
        group = 1 if program.requests <= 1 else (0 if program.wants else 2)  # step_count == 1: new
        return (*self.urgency(key), group) if self.rule == "venus" else (group,)

    def _pause_until_safe(self, engine: int) -> None:
        live = [(k, p) for k, p in self.programs.items() if p.engine == engine and not p.paused and not p.marked]
        if self.rule == "venus":
            live = [(k, p) for k, p in live if self.urgency(k)[0] > 0]  # PROMOTED is never paused
            # least urgent class first, ACTING before REASONING, smallest first
            live.sort(key=lambda kp: (-self.urgency(kp[0])[0], not kp[1].acting, kp[1].tokens))
        else:
            live.sort(key=lambda kp: (not kp[1].acting, kp[1].tokens))
        marked = sum(p.tokens for p in self.programs.values() if p.engine == engine and p.marked)
        for key, program in live:
            over = -self.remaining(engine)
            if self.rule == "venus":
                over -= marked
            if over <= 0:
                return
            if program.acting:
                self._pause(key, program)
            else:
                program.marked = True
                marked += program.tokens

    # ---- invariants ------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """The state invariants, true after every event."""
        for key, p in self.programs.items():
            assert not (p.paused and p.marked), f"program {key!r} is paused and marked"
            assert not p.wants or p.paused, f"program {key!r} waits for a resume while live"

    def check_fits(self) -> None:
        """Venus's live-set rule, true right after `check` (programs grow between checks)."""
        for engine in range(len(self.capacities)):
            if not self.engaged[engine]:
                assert not any(p.engine == engine and (p.marked or p.paused) for p in self.programs.values()), (
                    f"engine {engine}: a program is paused or marked while its live set is not engaged")
                continue
            marked = sum(p.tokens for p in self.programs.values() if p.engine == engine and p.marked)
            if self.remaining(engine) + marked >= 0:
                continue
            unmarked = [k for k, p in self.programs.items() if p.engine == engine and not p.paused and not p.marked]
            assert all(self.urgency(k)[0] == 0 for k in unmarked), (
                f"engine {engine}: live demand over capacity by {-self.remaining(engine) - marked:.0f} tokens "
                f"while pausable programs run")


def _shared(live: list[Program]) -> int:
    """Prompt tokens a group's programs on one engine share: counted once, not per program."""
    seen: dict[int, int] = {}
    shared = 0
    for p in live:
        if p.group in seen:
            shared += min(p.prompt_tokens, seen[p.group])
        else:
            seen[p.group] = p.prompt_tokens
    return shared
