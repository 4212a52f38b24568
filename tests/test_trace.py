"""The trace format: what a run records is what the simulator replays, and a bad row is named
by its file and line."""

from __future__ import annotations

import json

import pytest

from venusrl.trace import read_trace, recorded_trace, write_trace


def _recorded_group(group_id: int, seq: int, prompt: list[int], turns_per_trajectory: list[list[tuple[int, int, float | None]]]):
    """A group as a run leaves it: each trajectory's token ids and its turns (context tokens
    fed before the turn, tokens generated, tool seconds after it)."""
    from venusrl.types import Group, Prompt, Trajectory, Turn

    group_prompt = Prompt(id=f"p{group_id}", messages=())
    trajectories = []
    for index, turns in enumerate(turns_per_trajectory):
        t = Trajectory(id=10 * group_id + index, group_id=group_id, index=index, attempt=0, prompt=group_prompt,
                       start_version=0)
        t.token_ids = list(prompt)
        for context, generated, tool in turns:
            if t.turns:
                t.token_ids += [7] * context
            t.token_ids += [9] * generated
            t.turns.append(Turn(0, context, generated, 0.0, 0.0, tool))
        trajectories.append(t)
    return Group(id=group_id, seq=seq, prompt=group_prompt, trajectories=trajectories, admitted_at=0.0)


def test_a_recorded_run_replays_as_the_turns_it_ran(tmp_path):
    system = [1, 2, 3, 4, 5]
    first = _recorded_group(0, seq=1, prompt=system + [20, 21], turns_per_trajectory=[
        [(7, 30, 0.5), (12, 4, None)],  # a tool call, then a last turn with no tool after it
        [(7, 32, 0.0)],  # a malformed call: an extra turn that no tool answered
    ])
    second = _recorded_group(1, seq=0, prompt=system + [30], turns_per_trajectory=[[(6, 8, 0.25)], []])
    rows = recorded_trace([first, second])
    path = tmp_path / "trace.jsonl"
    write_trace(path, rows)
    replayed = read_trace(path)
    admitted_first = replayed[0]

    assert rows[0]["prompt"] == "p1"  # admission order, not the order given
    assert len(admitted_first) == 1  # a trajectory that ran no turn is not replayed
    assert admitted_first[0].prompt_tokens == 6 and admitted_first[0].shared_prompt_tokens == 5
    a, b = replayed[1]
    assert (a.prompt_tokens, a.shared_prompt_tokens) == (7, 5)
    assert [(t.gen_tokens, t.obs_tokens, t.tool_seconds) for t in a.turns] == [(30, 12, 0.5), (4, 0, 0.0)]
    assert [(t.gen_tokens, t.obs_tokens, t.tool_seconds) for t in b.turns] == [(32, 0, 0.0)]


@pytest.mark.parametrize(("line", "problem"), [
    ('{"prompt": "a", "index": 0, "turn": 0, "gen_tokens": 3}', "missing prompt_tokens"),
    ('{"prompt": "a", "index": 0', "invalid JSON"),
    ('[1, 2]', "row must be a JSON object"),
])
def test_a_bad_row_is_named_by_file_and_line(tmp_path, line, problem):
    good = {"prompt": "a", "index": 0, "turn": 0, "prompt_tokens": 5, "gen_tokens": 3}
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + line + "\n")
    with pytest.raises(ValueError, match=f"trace.jsonl:3: {problem}"):
        read_trace(path)


def test_an_empty_trace_is_an_error(tmp_path):
    path = tmp_path / "trace.jsonl"
    write_trace(path, [])
    with pytest.raises(ValueError, match="no rows"):
        read_trace(path)
