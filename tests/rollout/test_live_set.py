"""The live set: ThunderAgent's pause and resume rule as its source has it, and venus's rule
over the same mechanism."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.rollout.live_set import LiveSet


def live(capacity: int, programs: dict[str, tuple[int, bool]], rule="thunderagent", urgency=None) -> LiveSet:
    """One engine; `programs`: key -> (tokens, in a tool call), each its own group, started live.
    Venus's live set is engaged from the start (`thrash_fraction=0`)."""
    live_set = LiveSet([capacity], rule, buffer_tokens=0, urgency=urgency, thrash_fraction=0.0)
    for group, (key, (tokens, acting)) in enumerate(programs.items()):
        live_set.start(key, group, 0, engine=0)
        live_set.wants(key, tokens)
        if acting:
            live_set.acted(key, tokens, now=0.0)
    return live_set


def test_thunderagent_pauses_programs_in_a_tool_call_first_smallest_first():
    """Over capacity by 250: the smallest ACTING program (200) pauses, then the next (300);
    the REASONING ones are left alone once the engine fits."""
    s = live(1000, {"act300": (300, True), "act200": (200, True), "gen100": (100, False), "gen650": (650, False)})
    assert s.remaining(0) == -250
    s.check(now=1.0)
    assert [k for k, p in s.programs.items() if p.paused] == ["act300", "act200"]
    assert not any(p.marked for p in s.programs.values())


def test_thunderagent_marks_every_generating_program_once_the_idle_ones_are_paused():
    """The source's loop reads a capacity that a mark does not change, so once no ACTING
    program is left it marks every REASONING one; each pauses at its next tool call."""
    s = live(500, {"act100": (100, True), "gen300": (300, False), "gen400": (400, False)})
    s.check(now=1.0)
    assert s.programs["act100"].paused
    assert s.programs["gen300"].marked and s.programs["gen400"].marked
    s.acted("gen300", 320, now=2.0)
    assert s.programs["gen300"].paused and not s.programs["gen300"].marked


def test_thunderagent_resumes_pending_requests_then_new_programs_then_idle_ones_smallest_first():
    s = LiveSet([1000], buffer_tokens=0)
    for group, key in enumerate(["pending", "idle", "blocker"]):
        s.start(key, group, 0, engine=0)
        s.wants(key, 400 if key != "blocker" else 900)
        s.wants(key, 400 if key != "blocker" else 900)  # a second request: no longer new
    s.acted("idle", 400, now=0.0)
    s.acted("pending", 400, now=0.0)
    s.check(now=1.0)  # 1700 > 1000: the two idle ones pause, smallest first, and that fits
    assert s.programs["pending"].paused and s.programs["idle"].paused
    assert not s.wants("pending", 400)  # its next turn waits for a resume
    s.start("new", 9, 300, engine=0)  # a program is paused: new ones queue behind it
    assert s.programs["new"].paused
    s.finish("blocker")
    # 1000 of room: pending (400), then new (300); idle (400) does not fit after them
    assert s.check(now=2.0) == [("pending", True), ("new", False)]
    assert s.programs["idle"].paused


def test_a_program_larger_than_the_pool_resumes_alone():
    s = LiveSet([500], buffer_tokens=100)
    s.start("small", 0, 100, engine=0)
    s.start("huge", 1, 100, engine=0)
    s.wants("small", 100), s.wants("huge", 100)
    s.acted("huge", 700, now=0.0)
    s.check(now=1.0)
    assert s.programs["huge"].paused and not s.wants("huge", 700)
    assert s.check(now=2.0) == []  # "small" is live: "huge" would not fit beside it
    s.finish("small")
    assert s.check(now=3.0) == [("huge", True)]


def test_venus_pauses_the_least_urgent_first_never_a_promoted_one_and_marks_only_what_it_needs():
    urgency = {"promoted": (0, 0.0), "high_idle": (1, 0.0), "low_gen": (2, 0.0), "low_idle": (2, 0.0),
               "low_gen2": (2, 0.0)}
    s = live(1000, {"promoted": (500, True), "high_idle": (100, True), "low_idle": (150, True),
                    "low_gen": (200, False), "low_gen2": (300, False)}, "venus", urgency.__getitem__)
    assert s.remaining(0) == -250
    s.check(now=1.0)
    # LOW first: the idle one pauses (150), then the smaller generating one is marked (200 covers
    # the remaining 100); the HIGH and PROMOTED programs and the other LOW one run on
    assert [k for k, p in s.programs.items() if p.paused] == ["low_idle"]
    assert [k for k, p in s.programs.items() if p.marked] == ["low_gen"]
    s.check_fits()


def test_an_idle_engine_resumes_its_most_urgent_pending_program_at_once_under_venus_only():
    """Venus: an engine with nothing to run takes the most urgent paused program with a turn
    pending there (or one that never ran, from any engine); ThunderAgent waits for its check."""
    urgency = {"low": (2, 0.0), "high": (1, 0.5), "high_first": (1, 0.1), "idle": (1, 0.0), "new": (1, 0.0),
               "blocker": (2, 0.0)}
    for rule, expected in (("venus", "high_first"), ("thunderagent", None)):
        s = LiveSet([1000, 1000], rule, buffer_tokens=0, urgency=urgency.__getitem__, thrash_fraction=0.0)
        keys = ["low", "high", "high_first", "idle"]
        for group, key in enumerate(keys):
            s.start(key, group, 100, engine=0)
            s.programs[key].engine = 0  # all on engine 0 (start spreads them)
            s.wants(key, 100)  # it runs there
            s.acted(key, 100, now=0.0)
        for key in keys:
            s._pause(key, s.programs[key])
        for key in ("low", "high", "high_first"):
            assert not s.wants(key, 100)  # a turn pending, paused
        assert s.resume_for_idle(1) is None  # none of them has run there, none is new
        assert s.resume_for_idle(0) == expected
        if expected:
            assert not s.programs[expected].paused and s.resumes == 1
            assert s.programs["idle"].paused  # no turn pending: nothing to run
    s = LiveSet([1000, 1000], "venus", buffer_tokens=0, urgency=urgency.__getitem__, thrash_fraction=0.0)
    s.start("blocker", 0, 900, engine=0), s.wants("blocker", 900), s.acted("blocker", 1100, now=0.0)
    s.check(now=1.0)  # "blocker" pauses: new programs queue behind it
    s.start("new", 1, 100, engine=0)
    assert s.programs["new"].paused and not s.wants("new", 100)
    assert s.resume_for_idle(1) == "new" and s.programs["new"].engine == 1


def test_venus_pauses_nothing_on_an_engine_until_it_thrashes_and_then_for_good():
    """An engine's venus live set engages once it recomputes more than `thrash_fraction` of the
    context its requests bring in two windows of a pool's worth in a row; before that an
    over-full engine pauses nothing and new programs start live where they are placed."""
    urgency = {"a": (2, 0.0), "b": (2, 0.0), "c": (2, 0.0), "new": (1, 0.0)}
    s = LiveSet([1000, 1000], "venus", buffer_tokens=0, urgency=urgency.__getitem__, thrash_fraction=0.1)
    assert s.watching() == [0, 1]
    for group, key in enumerate(["a", "b", "c"]):
        s.start(key, group, 500, engine=0)
        s.wants(key, 500), s.acted(key, 500, now=0.0)
    assert s.remaining(0) == -500
    s.check(now=1.0)
    assert not any(p.paused or p.marked for p in s.programs.values())
    s.check_fits()
    assert not s.observe(0, prompt_tokens=900, recomputed_tokens=300)  # less than a pool's worth: no verdict yet
    assert not s.observe(0, prompt_tokens=1200, recomputed_tokens=400)  # 33% of 1,200: one window over
    assert not s.observe(0, prompt_tokens=2400, recomputed_tokens=450)  # 4%: the streak ends
    assert not s.observe(0, prompt_tokens=3400, recomputed_tokens=650) and s.watching() == [0, 1]  # 20%, once
    assert s.observe(0, prompt_tokens=4600, recomputed_tokens=900)  # 21%: a second window in a row
    assert s.engaged == [True, False] and s.watching() == [1]
    s.check(now=2.0)
    assert [k for k, p in s.programs.items() if p.paused] == ["a"]  # over by 500: the smallest LOW one in a tool
    assert not s.observe(0, prompt_tokens=9000, recomputed_tokens=900) and s.engaged[0]  # engaged for good
    s.start("new", 3, 100, engine=1)  # a program is paused on engine 0; engine 1 does not thrash
    assert not s.programs["new"].paused and s.programs["new"].engine == 1
    s.check_fits()
    assert LiveSet([1000], "thunderagent").watching() == []  # ThunderAgent's rule has no gate


programs = st.lists(st.tuples(st.integers(1, 400), st.booleans(), st.integers(0, 2)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), programs, st.lists(st.tuples(st.integers(0, 11), st.integers(0, 300)), max_size=30),
       st.sampled_from([0.0, 0.1]), st.lists(st.integers(0, 400), max_size=30))
def test_venus_live_demand_fits_each_pool_after_every_check(engines, starts, growth, thrash_fraction, recomputed):
    """Venus's rule as an invariant: after each check, every engaged engine's live demand less
    what is marked to pause fits its pool, or only PROMOTED programs are left to pause there;
    an engine not engaged pauses and marks nothing. Engines report 300 tokens of context a step,
    of them `recomputed` (so some engage, some never)."""
    urgency = {i: (cls, 0.0) for i, (_, _, cls) in enumerate(starts)}
    s = LiveSet([600] * engines, "venus", buffer_tokens=20, urgency=urgency.__getitem__,
                thrash_fraction=thrash_fraction)
    totals = [[0, 0] for _ in range(engines)]
    for i, (tokens, acting, _) in enumerate(starts):
        s.start(i, i % 3, tokens, engine=i % engines)
        s.wants(i, tokens)
        if acting:
            s.acted(i, tokens, now=0.0)
    for step, (index, grown) in enumerate(growth):
        key = index % len(starts)
        program = s.programs[key]
        if program.acting and not program.paused:
            s.wants(key, program.tokens + grown)
        elif not program.paused:
            s.acted(key, program.tokens + grown, now=float(step))
        engine = step % engines
        totals[engine][0] += 300
        totals[engine][1] += min(300, recomputed[step % len(recomputed)]) if recomputed else 0
        s.observe(engine, *totals[engine])
        s.check(now=float(step))
        s.check_invariants()
        s.check_fits()
