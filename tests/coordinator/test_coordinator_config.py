"""The coordinator and predictor sections: paper defaults, named errors, running estimates."""

import pytest
from tests.coordinator.coord_harness import Ledger, config, prompts

from venusrl.config import ConfigError, load_config
from venusrl.coordinator import DataCoordinator


def test_defaults_follow_the_paper():
    cfg = load_config()
    assert cfg.coordinator.group_size == 8
    assert cfg.coordinator.max_version_span == 2
    assert cfg.coordinator.async_factor == 1.5
    assert cfg.coordinator.policy == "length_prediction"
    assert cfg.predictor.kind == "learned"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("coordinator.async_factor=0.5", "coordinator.async_factor"),
        ("scheduler.priority=lifo", "scheduler.priority"),
        ("coordinator.groupsize=4", "coordinator.groupsize: unknown key"),
        ("predictor.kind=magic", "predictor.kind"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])


def test_running_estimates_learn_decode_and_tool_time():
    c = DataCoordinator(config(stats_smoothing=1.0), prompts(2))
    ledger = Ledger(c)
    t = ledger.apply(c.start(0.0)).start[0]
    ledger.apply(c.on_turn_start(t.id, 10.0))
    ledger.apply(c.on_turn_end(t.id, 12.0, [1] * 100, [0.0] * 100, 0, tool_call=True))
    ledger.apply(c.on_tool_result(t.id, 15.0))
    ledger.done(t.id, 16.0)
    assert c.stats.seconds_per_token == pytest.approx(0.02)
    assert c.stats.tokens_per_turn == 100
    assert c.stats.tool_seconds == pytest.approx(3.0)
    assert c.stats.total_tokens == 100
