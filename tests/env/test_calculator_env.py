import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from venusrl.env.base import DatasetRowError, Episode
from venusrl.env.calculator import (
    BUSY_ERROR,
    CalculatorEnv,
    calculate,
    final_answer_matches,
    final_number_matches,
    generate_dataset,
)
from venusrl.env.registry import environment_factory, load_object


def test_dataset_steps_vary_from_one_to_eight_and_answers_are_right():
    rows = generate_dataset(400, seed=1)
    assert {r["steps"] for r in rows} == set(range(1, 9))
    for row in rows[:50]:
        expression = row["question"].removeprefix("Compute ").removesuffix(".")
        assert calculate(expression) == str(row["answer"])


def test_operators_choose_the_operations_and_the_default_keeps_every_one():
    rows = generate_dataset(200, seed=1, max_steps=3, operators=["+", "-"])
    assert set("".join(r["operations"] for r in rows)) == {"+", "-"}
    for row in rows:
        assert row["question"].count("(") == len(row["operations"]) == row["steps"]
        assert "*" not in row["question"]
    assert set("".join(r["operations"] for r in generate_dataset(200, seed=1))) == {"+", "-", "*"}
    assert {r["operations"] for r in generate_dataset(50, seed=2, max_steps=1, operators=("-",))} == {"-"}


@pytest.mark.parametrize("operators", [[], ["+", "/"], ["-", "-"], "+-", None])
def test_bad_operators_are_named(operators):
    with pytest.raises(ValueError, match="operators: need a non-empty list of distinct operators"):
        generate_dataset(4, operators=operators)


@pytest.mark.parametrize(("expression", "expected"), [
    ("(3 + 4) * 5", "35"), ("7 / 2", "3.5"), ("-2 - 3", "-5"),
    ("1 / 0", "error: division by zero"), ("__import__('os')", "error: unsupported expression element Call"),
    ("2 **", "error: invalid syntax"), ("True + 1", "error: unsupported expression element Constant"),
])
def test_calculate(expression, expected):
    assert calculate(expression).startswith(expected)


@given(st.text(max_size=250))
def test_calculate_never_raises(text):
    assert isinstance(calculate(text), str)


def test_env_step_and_reward():
    env = CalculatorEnv()
    row = generate_dataset(1, seed=2)[0]
    messages, tools = asyncio.run(env.reset(row))
    assert tools[0]["function"]["name"] == "calculate" and messages[-1]["content"] == row["question"]
    call = {"id": "c0", "type": "function", "function": {"name": "calculate", "arguments": json.dumps({"expression": "6 * 7"})}}
    result = asyncio.run(env.step([call]))
    assert result.observations == [{"role": "tool", "tool_call_id": "c0", "content": "42"}]
    right = Episode(row, messages + [{"role": "assistant", "content": f"Answer: {row['answer']}"}], "done")
    wrong = Episode(row, messages + [{"role": "assistant", "content": "Answer: 123456789"}], "done")
    assert env.reward(right) == 1.0 and env.reward(wrong) == 0.0


def test_row_missing_answer_is_named():
    with pytest.raises(DatasetRowError, match="missing field\\(s\\) answer"):
        asyncio.run(CalculatorEnv().reset({"question": "1+1"}))


def test_registry_by_name_and_dotted_path():
    assert environment_factory("calculator") is CalculatorEnv
    assert environment_factory("venusrl.env.calculator:CalculatorEnv") is CalculatorEnv
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        environment_factory("nope")
    with pytest.raises(ValueError, match="has no attribute 'Missing'"):
        load_object("venusrl.env.calculator:Missing")
    with pytest.raises(ValueError, match="not a venusrl.env.base.Environment subclass"):
        environment_factory("venusrl.env.calculator:calculate")


def _call(call_id: str, expression: str) -> dict:
    return {"id": call_id, "function": {"name": "calculate", "arguments": json.dumps({"expression": expression})}}


@given(st.integers(0, 3), st.integers(1, 5))
def test_a_busy_row_fails_its_first_calls_then_answers(busy, calls):
    env = CalculatorEnv()
    asyncio.run(env.reset({"question": "Compute (2 + 3).", "answer": 5, "busy_calls": busy}))
    results = [asyncio.run(env.step([_call(f"c{i}", "2 + 3")])).observations[0]["content"] for i in range(calls)]
    assert results == [BUSY_ERROR] * min(busy, calls) + ["5"] * max(0, calls - busy)


@pytest.mark.parametrize("busy", [-1, 1.5, True, "1"])
def test_a_bad_busy_calls_is_named(busy):
    with pytest.raises(DatasetRowError, match="busy_calls"):
        asyncio.run(CalculatorEnv().reset({"id": "r7", "question": "Compute (1 + 1).", "answer": 2, "busy_calls": busy}))


def test_busy_fraction_marks_that_share_of_rows_and_leaves_problems_alone():
    plain, busy = generate_dataset(400, seed=5), generate_dataset(400, seed=5, busy_fraction=0.5)
    assert "busy_calls" not in plain[0]
    assert 150 < sum(r["busy_calls"] for r in busy) < 250
    assert [r["question"] for r in busy[:1]] == [r["question"] for r in plain[:1]]
    with pytest.raises(ValueError, match="busy_fraction"):
        generate_dataset(4, busy_fraction=1.5)


def test_any_form_takes_the_right_number_in_any_wording_the_graded_form_only_its_own_ending_the_message():
    row = {"question": "Compute (2 + 3).", "answer": 5}
    for text, graded, any_form in (("Answer: 5", True, True), ("The result is 5.", False, True),
                                   ("Answer: 6", False, False), ("error: busy", False, False),
                                   ("Answer: 5.", True, True), ("I add them.\nAnswer: 5\n", True, True),
                                   ("Answer: 5 3 7", False, False), ("Answer: 5\nAnswer: 9", False, False),
                                   ("Answer: 5, or 6", False, False)):
        episode = Episode(row, [{"role": "assistant", "content": text}], "done")
        assert final_answer_matches(episode) is graded and final_number_matches(episode) is any_form
