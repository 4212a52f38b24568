"""The coordinator snapshot on disk is JSON: every field of every group survives the round
trip, and a pickle or a malformed file is refused with what is wrong, never executed."""

from __future__ import annotations

import json
import pickle

import pytest
from tests.coordinator.coord_harness import Record, config, prompts

from venusrl.coordinator import DataCoordinator
from venusrl.coordinator.snapshot import CoordinatorSnapshot


def snapshot_mid_run() -> CoordinatorSnapshot:
    c = DataCoordinator(config(group_size=2, batch_groups=1, async_factor=2.0), iter(prompts(4)))
    out = c.start(0.0)
    first, second = out.start[0], out.start[1]
    c.on_turn_start(first.id, 1.5, [1, 2, 3])
    c.on_turn_end(first.id, 2.5, [6], [-1.0], c.weight_version, tool_call=True)
    c.on_turn_start(second.id, 1.0, [1, 2, 3])
    c.on_turn_end(second.id, 2.0, [4, 5], [-0.25, float("-inf")], c.weight_version, tool_call=False)
    c.on_trajectory_done(second.id, 3.0, reward=1.0,
                         record=Record([1, 2, 3, 4, 5], [0, 0, 0, 1, 1], [0.0] * 3 + [-0.25, float("-inf")]))
    return c.snapshot()


def test_every_field_survives_the_round_trip():
    snapshot = snapshot_mid_run()
    data = snapshot.to_bytes()
    again = CoordinatorSnapshot.from_bytes(data)
    assert again.to_bytes() == data
    assert json.loads(data)["format"] == "venusrl.coordinator_snapshot"
    group = again.running[0]
    assert all(t.prompt is group.prompt for t in group.trajectories)  # one prompt object per group
    trajectory = next(t for t in group.trajectories if t.token_ids[-2:] == [4, 5])  # the done one's record
    assert trajectory.logprobs[-1] == float("-inf") and trajectory.turns[0].ended_at == 2.0
    assert trajectory.generated_mask == [False] * 3 + [True] * 2
    again.check()


def test_a_pickle_is_refused_not_run():
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('pickle code ran')",))

    with pytest.raises(ValueError, match="not a coordinator snapshot"):
        CoordinatorSnapshot.from_bytes(pickle.dumps(Boom()))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.pop("ready"), "ready"),
    (lambda d: d.update(version=99), "version 99"),
    (lambda d: d["running"][0].update(status="bogus"), "bogus"),
    (lambda d: d["running"][0]["trajectories"][0].update(extra_field=1), "extra_field"),
])
def test_a_malformed_snapshot_names_what_is_wrong(edit, message):
    data = json.loads(snapshot_mid_run().to_bytes())
    edit(data)
    with pytest.raises(ValueError, match=message):
        CoordinatorSnapshot.from_bytes(json.dumps(data).encode())
    with pytest.raises(ValueError, match="not a coordinator snapshot"):
        CoordinatorSnapshot.from_bytes(snapshot_mid_run().to_bytes()[:40])
