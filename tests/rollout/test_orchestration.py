"""Moves between engines: request orchestration's and decode balance's choices, and a request
moved between two engines with its prefix KV (in process, over TCP, and through Mooncake's
transfer engine)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.model.checkpoint import load_model
from venusrl.model.generate import generate
from venusrl.rollout.orchestrator import Move, choose_moves, lighter_engine, migrate_prefix
from venusrl.rollout.transport_select import TRANSPORTS, open_transport
from venusrl.types import Priority, SamplingParams

GREEDY = SamplingParams(max_new_tokens=16, temperature=0, stop_token_ids=(-1,))


def test_moves_go_from_the_hot_engine_to_the_coolest():
    pressure = {"a": 1.4, "b": 0.2, "c": 0.5}
    capacity = dict.fromkeys(pressure, 1000)
    waiting = {"a": [("r1", 200), ("r2", 200), ("r3", 200)], "b": [], "c": []}
    moves = choose_moves(pressure, capacity, waiting, threshold=0.9)
    assert moves[0] == Move("r1", "a", "b")
    assert [m.source for m in moves] == ["a"] * len(moves) and len(moves) == 3


def test_no_move_below_the_threshold_or_when_it_would_only_swap_the_peak():
    capacity = {"a": 1000, "b": 1000}
    assert choose_moves({"a": 0.8, "b": 0.1}, capacity, {"a": [("r", 100)]}, threshold=0.9) == []
    assert choose_moves({"a": 1.0, "b": 0.95}, capacity, {"a": [("r", 500)]}, threshold=0.9) == []


@given(st.dictionaries(st.sampled_from("abcd"), st.floats(0, 3), min_size=1),
       st.lists(st.integers(1, 500), max_size=6))
def test_moves_never_raise_the_peak(pressure, sizes):
    capacity = dict.fromkeys(pressure, 1000)
    hottest = max(pressure, key=pressure.get)
    waiting = {hottest: [(f"r{i}", s) for i, s in enumerate(sizes)]}
    projected = dict(pressure)
    for move in choose_moves(pressure, capacity, waiting, threshold=0.5):
        tokens = dict(waiting[hottest])[move.request]
        projected[move.source] -= tokens / 1000
        projected[move.target] += tokens / 1000
    assert max(projected.values()) <= max(pressure.values()) + 1e-9


def test_an_urgent_turn_goes_to_the_engine_where_the_least_context_generates():
    loads = [900, 300, 100, 100]
    assert lighter_engine(loads, 0, 200, eligible=[1, 2, 3]) == 2  # ties: the lowest index
    assert lighter_engine(loads, 0, 200, eligible=[1]) == 1
    assert lighter_engine(loads, 0, 200, eligible=[]) is None
    assert lighter_engine(loads, 0, 200, eligible=[0]) is None  # never its own engine


def test_no_balance_move_that_would_make_the_target_the_heavier_engine():
    assert lighter_engine([500, 300], 0, 200, eligible=[1]) is None  # 300 + 200 is not below 500
    assert lighter_engine([501, 300], 0, 200, eligible=[1]) == 1


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=6), st.integers(0, 5), st.integers(0, 5_000),
       st.sets(st.integers(0, 5)))
def test_a_balance_move_lowers_the_turns_load_and_the_peak_of_the_two_engines(loads, source, context, eligible):
    source %= len(loads)
    target = lighter_engine(loads, source, context, {e for e in eligible if e < len(loads)})
    if target is not None:
        assert target != source and target in eligible
        assert loads[target] + context < loads[source]  # the turn decodes beside less context
        assert max(loads[source], loads[target] + context) == loads[source]  # the peak does not rise
        assert all(loads[target] <= loads[e] for e in eligible if e < len(loads) and e != source)


@pytest.mark.parametrize("transport_kind", TRANSPORTS)
def test_moved_request_keeps_its_prefix_and_its_output(tiny_model_dir, transport_kind):
    if transport_kind == "mooncake":  # an optional extra: CI does not install it
        pytest.importorskip("mooncake.engine", reason="needs mooncake-transfer-engine (pip install 'venusrl[mooncake]')",
                            exc_type=ImportError)
    model = load_model(tiny_model_dir)
    source = Engine(model, EngineConfig(kv_capacity_tokens=4096, page_size=4))
    target = Engine(load_model(tiny_model_dir), EngineConfig(kv_capacity_tokens=4096, page_size=4))
    prompt = list(range(20, 120))
    source.start_trajectory("t", Priority.HIGH)
    first = source.generate([prompt], GREEDY)[0]
    context = prompt + first.output_ids + [5, 6, 7]
    with open_transport(transport_kind, lambda ids, kv: target.import_prefix(ids, kv, "t")) as transport:
        moved = migrate_prefix(source, target, context, transport, "t")
    assert moved == (len(prompt) + len(first.output_ids) - 1) // 4 * 4
    before = target.stats()
    again = target.generate([context], GREEDY)[0]
    after = target.stats()
    assert after["cached_tokens"] - before["cached_tokens"] == moved, "the moved prefix is not recomputed"
    assert after["recomputed_tokens"] == 0
    assert again.output_ids == generate(model, context, GREEDY).token_ids
    target.scheduler.check_integrity()
