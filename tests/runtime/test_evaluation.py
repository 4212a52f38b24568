"""Held-out evaluation: greedy and sampled rollouts through the agent loop, scored by the
reward and extra scorers, overall and per value of each of some row fields."""

import pytest

from venusrl.config import validate_config
from venusrl.coordinator.dataset import prompt_from_row
from venusrl.env.calculator import final_number_matches, generate_dataset
from venusrl.runtime.evaluation import evaluate_model


def _setup(model_dir):
    config = validate_config({
        "model": {"path": str(model_dir)},
        "rollout": {"environment": "calculator", "max_turns": 2, "max_new_tokens_per_turn": 12,
                    "max_total_tokens": 1024, "temperature": 1.0},
        "engine": {"kv_capacity_tokens": 16384, "page_size": 16},
    })
    rows = generate_dataset(6, seed=3, min_steps=1, max_steps=1, busy_fraction=0.5)
    return config, [prompt_from_row(dict(r), f"row {i}", f"r{i}") for i, r in enumerate(rows)]


def test_figures_per_decoding_score_and_group_and_the_same_seed_gives_the_same_figures(tiny_model_dir):
    config, prompts = _setup(tiny_model_dir)
    result = evaluate_model(tiny_model_dir, config, prompts, samples=2, seed=5,
                            scorers={"any_form": final_number_matches}, breakdowns=("busy_calls", "operations"))
    assert result["prompts"] == 6 and result["sampled_per_prompt"] == 2
    for decoding in ("greedy", "sampled"):
        assert set(result[decoding]) == {"graded", "any_form"}
        assert 0.0 <= result[decoding]["graded"] <= result[decoding]["any_form"] <= 1.0
    groups = result["by_busy_calls"]
    assert sum(g["prompts"] for g in groups.values()) == 6 and set(groups) <= {"0", "1"}
    operators = result["by_operations"]
    assert sum(g["prompts"] for g in operators.values()) == 6 and set(operators) <= {"+", "-", "*"}
    assert evaluate_model(tiny_model_dir, config, prompts, samples=2, seed=5, scorers={"any_form": final_number_matches},
                          breakdowns=("busy_calls", "operations")) == result


def test_no_held_out_prompts_is_an_error(tiny_model_dir):
    config, _ = _setup(tiny_model_dir)
    with pytest.raises(ValueError, match="at least one held-out prompt"):
        evaluate_model(tiny_model_dir, config, [])
