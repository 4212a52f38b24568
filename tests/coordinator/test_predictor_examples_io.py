"""(messages, remaining_tokens) JSONL: round trip, derived fields, and named errors."""

import json

import pytest

from venusrl.coordinator.predictors.examples_io import ExampleError, read_examples, write_examples
from venusrl.coordinator.predictors.query import query_from_messages
from venusrl.coordinator.predictors.synthetic import synthesize


def test_round_trip_keeps_every_query_field(tmp_path):
    examples = [e for t in synthesize(3, group_size=2, seed=4) for e in t.examples()]
    path = tmp_path / "ex.jsonl"
    assert write_examples(path, examples) == len(examples)
    again = read_examples(path)
    assert [e.remaining_tokens for e in again] == [e.remaining_tokens for e in examples]
    assert [e.query for e in again] == [e.query for e in examples]


def test_fields_derived_from_messages_alone():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "a" * 10},
        {"role": "tool", "content": "Error: boom"},
        {"role": "assistant", "content": "b" * 6},
        {"role": "tool", "content": "ok"},
    ]
    q = query_from_messages(messages)
    assert q.prompt_text == "be brief\nfix it"
    assert q.turns == 2 and q.last_observation == "ok"
    assert q.generated_tokens == 4  # 16 characters at about 4 per token
    assert q.tool_errors == 1
    assert q.prompt_id == query_from_messages(messages[:2]).prompt_id
    assert query_from_messages(messages[:2]).last_observation == ""


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{oops", r"ex.jsonl:2: invalid JSON"),
        ('"text"', r"ex.jsonl:2: row must be a JSON object, got str"),
        ('{"remaining_tokens": 3}', r"ex.jsonl:2: missing field 'messages'"),
        ('{"messages": [{"role": "user", "content": "x"}]}', r"ex.jsonl:2: missing field 'remaining_tokens'"),
        ('{"messages": [{"role": "user", "content": "x"}], "remaining_tokens": -1}',
         r"ex.jsonl:2: field 'remaining_tokens' must be an integer >= 0, got -1"),
        ('{"messages": [{"role": "user", "content": "x"}], "remaining_tokens": 2.5}',
         r"ex.jsonl:2: field 'remaining_tokens' must be an integer >= 0, got 2.5"),
        ('{"messages": [{"content": "x"}], "remaining_tokens": 2}', r"ex.jsonl:2: messages\[0\].role"),
        ('{"messages": [{"role": "user"}], "remaining_tokens": 2, "generated_tokens": true}',
         r"ex.jsonl:2: field 'generated_tokens' must be an integer"),
        ('{"messages": [{"role": "user"}], "remaining_tokens": 2, "mates": {"speed": 1}}',
         r"ex.jsonl:2: mates.speed: unknown"),
        ('{"messages": [{"role": "user"}], "remaining_tokens": 2, "mates": {"done": -1}}',
         r"ex.jsonl:2: mates.done must be a number >= 0"),
        ('{"messages": [{"role": "user"}], "remaining_tokens": 2, "prompt_id": 4}',
         r"ex.jsonl:2: field 'prompt_id' must be a string"),
    ],
)
def test_bad_rows_are_named(tmp_path, row, message):
    path = tmp_path / "ex.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "x"}], "remaining_tokens": 1})
    path.write_text(good + "\n" + row + "\n")
    with pytest.raises(ExampleError, match=message):
        read_examples(path)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ExampleError, match="cannot read examples"):
        read_examples(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ExampleError, match="no rows"):
        read_examples(tmp_path / "empty.jsonl")
