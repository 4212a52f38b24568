"""Prompt JSONL: good rows load, every bad row is named by line and field."""

import pytest

from venusrl.coordinator.dataset import DatasetError, read_prompts


def write(tmp_path, *lines):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_rows_load_with_messages_prompt_and_metadata(tmp_path):
    path = write(
        tmp_path,
        '{"id": "a", "messages": [{"role": "user", "content": "hi"}], "answer": 4}',
        "",
        '{"prompt": "solve"}',
    )
    prompts = read_prompts(path)
    assert [p.id for p in prompts] == ["a", "3"]
    assert prompts[0].metadata == {"answer": 4}
    assert prompts[1].messages == ({"role": "user", "content": "solve"},)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"messages": [}', r"data.jsonl:2: invalid JSON"),
        ("[1, 2]", r"data.jsonl:2: row must be a JSON object, got list"),
        ('{"text": "x"}', r"data.jsonl:2: row needs a 'messages' or a 'prompt' field"),
        ('{"prompt": 3}', r"data.jsonl:2: field 'prompt' must be a string, got int"),
        ('{"messages": []}', r"data.jsonl:2: field 'messages' must be a non-empty list"),
        ('{"messages": [{"content": "x"}]}', r"data.jsonl:2: messages\[0\].role must be a non-empty string"),
        ('{"messages": [{"role": "user", "content": 5}]}', r"data.jsonl:2: messages\[0\].content must be a string"),
        ('{"prompt": "x", "id": [1]}', r"data.jsonl:2: field 'id' must be a string or integer"),
        ('{"prompt": "x", "id": "1"}', r"data.jsonl:2: id '1' repeats line 1"),
    ],
)
def test_bad_rows_are_named(tmp_path, line, message):
    path = write(tmp_path, '{"prompt": "fine"}', line)
    with pytest.raises(DatasetError, match=message):
        read_prompts(path)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DatasetError, match="cannot read dataset"):
        read_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(DatasetError, match="no rows"):
        read_prompts(write(tmp_path, ""))
