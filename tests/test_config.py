"""Config: YAML plus dotted overrides; every bad input names its key path or line."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from venusrl.config import ConfigError, load_config, parse_override, validate_config


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_defaults_without_a_file():
    config = load_config()
    assert config.run.runtime == "local"
    assert config.engine.page_size >= 1


def test_file_then_overrides(tmp_path):
    path = write(tmp_path, "model:\n  path: /models/qwen3\nengine:\n  page_size: 32\n")
    config = load_config(path, ["engine.page_size=64", "run.name=exp1", "model.dtype=bfloat16"])
    assert config.model.path == "/models/qwen3"
    assert config.engine.page_size == 64
    assert config.run.name == "exp1"
    assert config.model.dtype == "bfloat16"


def test_unknown_key_names_path_and_known_keys(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "engine:\n  pge_size: 3\n"))
    assert "engine.pge_size: unknown key" in str(err.value)
    assert "page_size" in str(err.value)


def test_unknown_section():
    with pytest.raises(ConfigError, match="trainr: unknown key"):
        load_config(overrides=["trainr.lr=1"])


def test_bad_value_names_path_and_expected_type():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["engine.page_size=big"])
    message = str(err.value)
    assert "engine.page_size" in message and "expected int" in message and "'big'" in message


def test_bad_literal_lists_choices():
    with pytest.raises(ConfigError, match=r"run.runtime: .*expected one of 'local', 'ray'"):
        load_config(overrides=["run.runtime=k8s"])


def test_value_out_of_range():
    with pytest.raises(ConfigError, match="engine.page_size: Input should be greater than or equal to 1"):
        load_config(overrides=["engine.page_size=0"])


def test_yaml_syntax_error_names_the_line(tmp_path):
    with pytest.raises(ConfigError, match=r"c.yaml:3:\d+: invalid YAML"):
        load_config(write(tmp_path, "engine:\n  page_size: 3\n   bad: x\n"))
    with pytest.raises(ConfigError, match=r"c.yaml:4:1: invalid YAML .*flow sequence at line 3"):
        load_config(write(tmp_path, "engine:\n  page_size: 3\n  bad: [1, 2\n"))


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "absent.yaml")


@pytest.mark.parametrize("text", ["noequals", "=3", "a..b=1", "engine.page_size"])
def test_malformed_override(text):
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        parse_override(text)


def test_override_into_a_value_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="engine.page_size is a value, not a section"):
        load_config(write(tmp_path, "engine:\n  page_size: 3\n"), ["engine.page_size.x=1"])


@given(st.integers(min_value=1, max_value=10**6))
def test_integer_override_round_trips(value):
    assert load_config(overrides=[f"engine.page_size={value}"]).engine.page_size == value


def test_chat_template_kwargs_and_tool_call_format():
    from venusrl.config import validate_config

    config = validate_config({"model": {"chat_template_kwargs": {"enable_thinking": False},
                                        "tool_call_format": "qwen3_coder"}})
    assert config.model.chat_template_kwargs == {"enable_thinking": False}
    assert config.model.tool_call_format == "qwen3_coder"
    assert validate_config({}).model.tool_call_format == "auto"
    with pytest.raises(ConfigError, match="model.tool_call_format"):
        validate_config({"model": {"tool_call_format": "xml"}})
    with pytest.raises(ConfigError, match="model.chat_template_kwargs"):
        validate_config({"model": {"chat_template_kwargs": ["enable_thinking"]}})


def test_the_scheduler_section_says_the_slot_mode_and_the_coordinators_rule():
    venus = load_config(overrides=["scheduler.priority=critical_path"])
    assert (venus.scheduler.slot_mode, venus.coordinator.policy) == ("priority", "critical_path")
    baseline = load_config(overrides=["scheduler.policy=trajectory_level"])
    assert (baseline.scheduler.slot_mode, baseline.coordinator.policy) == ("trajectory_level", "action_level")
    assert baseline.scheduler.priority == "action_level"  # the rule it runs, not venus's default
    assert "policy" not in venus.model_dump()["coordinator"]  # derived, so a dumped config loads again
    for config in (venus, baseline):
        assert validate_config(config.model_dump(mode="json")) == config


def test_engine_work_conservation_is_derived_from_the_scheduler_unless_set():
    """venus's worker hands a stalled LOW holder's slot to the urgent turns behind it, so its
    engines keep HIGH KV (the paper's rule); every other caller gets an engine that never
    idles for it. A value the user sets stays, and a dumped config loads again."""
    assert load_config().engine.work_conservation is False
    for overrides in (["scheduler.policy=action_level"], ["scheduler.policy=trajectory_level"],
                      ["scheduler.priority=action_level"]):
        assert load_config(overrides=overrides).engine.work_conservation is True
    kept = load_config(overrides=["engine.work_conservation=true"])
    assert kept.engine.work_conservation is True
    for config in (load_config(), kept):
        assert validate_config(config.model_dump(mode="json")) == config


def test_coordinator_policy_names_its_replacement(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("coordinator:\n  group_size: 4\n  policy: critical_path\n")
    with pytest.raises(ConfigError, match=r"coordinator.policy: no longer a config key; set scheduler.priority"):
        load_config(path)


def test_a_baseline_with_a_ranking_rule_is_an_error():
    with pytest.raises(ConfigError, match=r"scheduler.priority: 'fcfs' ranks groups.*'action_level' ranks none"):
        load_config(overrides=["scheduler.policy=action_level", "scheduler.priority=fcfs"])
    assert load_config(overrides=["scheduler.policy=action_level", "scheduler.priority=action_level"])
