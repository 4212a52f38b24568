"""The simulator's systems are presets of the training config: what the simulated cluster
runs is read from the same `Config` a training run reads."""

from __future__ import annotations

import pytest
from tests.sim.sim_helpers import small_spec

from venusrl.config import Config, load_config
from venusrl.sim import run
from venusrl.sim.systems import PRESETS, SYSTEMS, system


def test_venus_is_the_training_default():
    assert system("venus").config == Config()
    assert system("+decode_balance").config == Config()
    assert system("+live_set").config == Config(rollout={"decode_balance": False})
    # the paper's venus
    assert system("+migration").config == Config(scheduler={"live_set": False}, rollout={"decode_balance": False})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_attribute_the_simulator_reads_comes_from_the_config(name):
    spec = SYSTEMS[name]
    config = load_config(overrides=[f"{key}={value}" for key, value in PRESETS[name].overrides.items()])
    assert spec.config == config
    assert spec.slot_mode == config.scheduler.slot_mode
    assert spec.policy == config.coordinator.policy == config.scheduler.ranking
    assert (spec.cache_policy, spec.demotion, spec.demotion_order) == (
        config.engine.cache_policy, config.engine.demotion, config.engine.demotion_order)


@pytest.mark.parametrize("name", ["slime", "rollflash", "thunderagent", "venus"])
def test_every_system_flushes_cached_kv_at_a_weight_update_as_its_real_counterpart(name):
    assert SYSTEMS[name].config.engine.kv_after_weight_update == "recompute"


def test_the_baselines_rank_no_group_as_the_training_baselines_do():
    for name in ("slime", "rollflash", "baseline"):
        assert SYSTEMS[name].policy == "action_level" and not SYSTEMS[name].uses_predictions
    assert SYSTEMS["slime"].slot_mode == "trajectory_level" and SYSTEMS["rollflash"].slot_mode == "action_level"
    assert SYSTEMS["+priority"].policy == "length_prediction" and SYSTEMS["+priority"].cache_policy == "lru"


def test_a_cell_setting_and_another_rule_apply_over_the_preset():
    spec = system("venus", "critical_path", {"coordinator.batch_groups": 64, "engine.kv_after_weight_update": "keep"})
    assert spec.name == "venus[critical_path]" and spec.policy == "critical_path"
    assert spec.config.coordinator.batch_groups == 64 and spec.config.engine.kv_after_weight_update == "keep"
    with pytest.raises(ValueError, match=r"system 'rollflash': .*scheduler.priority"):
        system("rollflash", "length_prediction")  # a baseline with a ranking rule is no system
    with pytest.raises(ValueError, match="unknown"):
        system("sglang")


def test_the_simulated_cluster_runs_the_configured_settings(monkeypatch):
    seen = {}
    original = run.DataCoordinator.__init__

    def recording(self, config, *args, **kwargs):
        seen["coordinator"] = config
        original(self, config, *args, **kwargs)

    monkeypatch.setattr(run.DataCoordinator, "__init__", recording)
    spec = small_spec("rollflash", config={"coordinator.max_version_span": 0, "coordinator.async_factor": 2.0})
    result = run.simulate(spec)
    assert result.steps == spec.steps
    coordinator = seen["coordinator"]
    assert (coordinator.max_version_span, coordinator.async_factor, coordinator.batch_groups) == (0, 2.0, 2)
    assert coordinator.policy == "action_level"
