"""`make demo` must keep working and stay honest: held-out problems disjoint from the SFT
and RL problems, demonstrations from a teacher who gets the order of a subtraction's
operands wrong in the configured share, and RL that raises held-out accuracy over the SFT
model (the control)."""

import json
import re
from pathlib import Path

import pytest

from venusrl.config import ConfigError, load_config
from venusrl.demo import UNGRADED_ANSWER, demonstrations, make_splits, run_demo
from venusrl.env.base import Episode
from venusrl.env.calculator import BUSY_ERROR, CalculatorEnv, demonstration, generate_dataset
from venusrl.model.tiny import make_tiny_model

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"
# the busy-tool task: the tool sometimes answers "busy", which no demonstration shows
BUSY = ["demo.teacher_swap_fraction=0", "data.generate_options.busy_fraction=0.5", "data.generate_options.max_steps=2",
        "rollout.max_turns=5"]
SMALL = ["demo.model_hidden=32", "demo.model_layers=1", "demo.model_heads=2", "demo.model_kv_heads=1", "demo.sft_examples=8", "demo.sft_epochs=1",
         "data.generate_train=8", "data.generate_eval=4", "trainer.steps=2", "trainer.checkpoint_every_steps=1",
         "coordinator.group_size=2", "coordinator.batch_groups=2", "rollout.max_new_tokens_per_turn=16"]


def _questions(rows):
    return {row["question"] for row in rows}


def test_held_out_problems_are_disjoint_from_sft_and_rl_problems():
    splits = make_splits(load_config(DEMO_CONFIG))
    config = load_config(DEMO_CONFIG)
    assert len(splits.held_out) == config.data.generate_eval == len(_questions(splits.held_out))
    assert not _questions(splits.held_out) & (_questions(splits.sft) | _questions(splits.train))
    assert len(splits.sft) == config.demo.sft_examples and len(splits.train) == config.data.generate_train


def test_demonstrations_never_meet_a_busy_tool_and_rl_and_eval_problems_do():
    splits = make_splits(load_config(DEMO_CONFIG, BUSY))
    assert all(row.get("busy_calls", 0) == 0 for row in splits.sft)
    for rows in (splits.train, splits.held_out):
        busy = sum(row["busy_calls"] for row in rows) / len(rows)
        assert 0.3 < busy < 0.7
    assert not any(BUSY_ERROR in str(m["content"]) for c in demonstrations(splits.sft[:50], 0.0, 1) for m in c)
    # two-operation demonstrations call the tool after a tool message, the move a retry needs
    assert {row["steps"] for row in splits.sft} == {1, 2}


# the demo's task, the imperfect teacher (results/demo-teacher/): half the problems
# subtractions, 45% of their demonstrations with the operands swapped
_QUESTION = re.compile(r"Compute \((\d+) ([+-]) (\d+)\)\.")  # a one-operation problem


def _first_call(conversation):
    return json.loads(conversation[2]["tool_calls"][0]["function"]["arguments"])["expression"]


def test_the_imperfect_teacher_swaps_the_given_share_of_subtractions_and_no_addition():
    config = load_config(DEMO_CONFIG)
    assert (config.demo.teacher_swap_fraction, config.demo.sft_ungraded_fraction) == (0.45, 0.0)
    splits = make_splits(config)
    for rows in (splits.sft, splits.train, splits.held_out):  # half additions, half subtractions
        assert 0.4 < sum(row["operations"] == "-" for row in rows) / len(rows) < 0.6
    operands = {row["question"]: _QUESTION.fullmatch(row["question"]).groups() for row in splits.sft}
    # a swap is visible only where the operands differ
    rows, env = [row for row in splits.sft[:200] if len(set(operands[row["question"]])) == 3], CalculatorEnv()
    conversations = demonstrations(rows, 0.0, seed=1, swap_fraction=config.demo.teacher_swap_fraction)
    swapped = 0
    for row, conversation in zip(rows, conversations, strict=True):
        a, op, b = operands[row["question"]]
        call, reward = _first_call(conversation), env.reward(Episode(row, conversation, "done"))
        if call == f"{a} {op} {b}":
            assert reward == 1.0
        else:  # the careless teacher: the operands of a subtraction swapped, its wrong result answered
            assert (op, call, reward) == ("-", f"{b} - {a}", 0.0)
            assert conversation[-1]["content"] == f"Answer: {int(b) - int(a)}"
            swapped += 1
    assert swapped == round(config.demo.teacher_swap_fraction * sum(row["operations"] == "-" for row in rows))
    assert demonstrations(rows, 0.0, seed=1, swap_fraction=0.0) == [demonstration(row) for row in rows]


@pytest.mark.parametrize("fraction", ["1", "-0.1"])
def test_a_teacher_swap_fraction_outside_0_to_1_is_named(fraction):
    with pytest.raises(ConfigError, match="demo.teacher_swap_fraction"):
        load_config(DEMO_CONFIG, [f"demo.teacher_swap_fraction={fraction}"])


def test_bad_operators_are_named_as_the_config_key():
    with pytest.raises(ValueError, match=r"data.generate_options: operators: .* got \['\+', '/'\]"):
        make_splits(load_config(DEMO_CONFIG, ["data.generate_options.operators=[+, /]"]))


def test_too_small_a_problem_space_for_disjoint_held_out_problems_is_named():
    config = load_config(DEMO_CONFIG, ["data.generate_options.max_start=2", "data.generate_options.max_operand=2"])
    with pytest.raises(ValueError, match="data.generate_eval"):
        make_splits(config)


def test_demo_runs_end_to_end_small(tmp_path):
    config = load_config(DEMO_CONFIG, [f"demo.workdir={tmp_path}", *SMALL])
    summary = run_demo(config, progress=False)
    assert summary["parity_max_abs_diff"] < 1e-4
    assert summary["steps"] == 2 and summary["scheduler"] == "venus"
    for evaluation in (summary["before"], summary["after"]):
        assert set(evaluation) >= {"greedy", "sampled", "by_operations"} and "by_busy_calls" not in evaluation
        assert sum(group["prompts"] for group in evaluation["by_operations"].values()) == 4
        for decoding in ("greedy", "sampled"):
            graded, any_form = evaluation[decoding]["graded"], evaluation[decoding]["any_form"]
            assert 0.0 <= graded <= any_form <= 1.0  # the graded form is one of the forms
    assert summary["accuracy_after"] == summary["after"]["sampled"]["graded"]
    assert summary["gain_over_control"] == pytest.approx(summary["accuracy_after"] - summary["accuracy_before"])
    assert summary["wall_s"] >= summary["train_wall_s"] > 0
    run_dir = Path(summary["run_dir"])
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    held_out = [json.loads(line) for line in (tmp_path / "data" / "held_out.jsonl").read_text().splitlines()]
    sft = [json.loads(line) for line in (tmp_path / "data" / "sft.jsonl").read_text().splitlines()]
    assert len(held_out) == 4 and not _questions(held_out) & _questions(sft)


@pytest.mark.slow
def test_rl_raises_held_out_accuracy_over_the_sft_model(tmp_path):
    """`make demo` itself, judged on held-out problems disjoint from SFT and RL problems:
    RL raises sampled graded accuracy over the SFT model (the control) by the 0.15 the demo
    shows, and the gain is the skill the teacher got wrong (subtractions' operand order),
    not the answer form (any form moves with graded) and not at a comparable cost to additions.
    The run is asynchronous, so repeats differ: five runs of seed 0 at lr 1e-4 gained +0.195
    to +0.270, subtractions +0.44 to +0.50, and moved additions by +0.008 to -0.083
    (results/demo-teacher/README.md); the bounds leave that spread room."""
    summary = run_demo(load_config(DEMO_CONFIG, [f"demo.workdir={tmp_path}"]), progress=False)
    before, after = summary["before"], summary["after"]
    assert summary["gain_over_control"] >= 0.15
    subtractions, additions = before["by_operations"]["-"], after["by_operations"]["+"]
    assert after["by_operations"]["-"]["sampled"]["graded"] >= subtractions["sampled"]["graded"] + 0.2
    assert additions["sampled"]["graded"] >= before["by_operations"]["+"]["sampled"]["graded"] - 0.1
    for evaluation in (before, after):
        assert evaluation["sampled"]["any_form"] - evaluation["sampled"]["graded"] < 0.05


def test_rl_starts_from_a_reused_sft_model_and_a_missing_one_is_named(tmp_path):
    model = make_tiny_model(tmp_path / "model", hidden=32, layers=1)
    config = load_config(DEMO_CONFIG, [f"demo.workdir={tmp_path / 'run'}", *SMALL, f"demo.sft_model={model}"])
    summary = run_demo(config, progress=False)
    assert summary["sft_reused"] == str(model) and summary["sft_seconds"] == 0.0
    assert summary["steps"] == 2 and (tmp_path / "run" / "data" / "held_out.jsonl").is_file()
    missing = load_config(DEMO_CONFIG, [f"demo.workdir={tmp_path / 'run2'}", *SMALL, f"demo.sft_model={tmp_path}"])
    with pytest.raises(ValueError, match="demo.sft_model"):
        run_demo(missing, progress=False)


def test_the_final_step_must_be_checkpointed(tmp_path):
    config = load_config(DEMO_CONFIG, [f"demo.workdir={tmp_path}", *SMALL, "trainer.checkpoint_every_steps=3"])
    with pytest.raises(ValueError, match="trainer.checkpoint_every_steps"):
        run_demo(config, progress=False)


def test_too_few_rl_problems_for_the_steps_are_named_before_any_work(tmp_path):
    config = load_config(DEMO_CONFIG, [f"demo.workdir={tmp_path}", *SMALL, "data.generate_train=3"])
    with pytest.raises(ValueError, match="trainer.steps"):
        run_demo(config, progress=False)
    assert not (tmp_path / "model").exists()


def test_the_grader_takes_the_graded_answer_form_only():
    env = CalculatorEnv()
    for row in generate_dataset(20, seed=3):
        graded, ungraded = demonstration(row), demonstration(row, UNGRADED_ANSWER)
        assert graded[:-1] == ungraded[:-1]
        assert ungraded[-1]["content"] == f"The result is {row['answer']}."
        assert env.reward(Episode(row, graded, "done")) == 1.0
        assert env.reward(Episode(row, ungraded, "done")) == 0.0


def test_demo_demonstrations_end_ungraded_in_the_given_fraction():
    rows = generate_dataset(40, seed=4)
    endings = [c[-1]["content"] for c in demonstrations(rows, 0.25, seed=1)]
    assert sum(e.startswith("The result is") for e in endings) == 10
    assert sum(e.startswith("Answer: ") for e in endings) == 30
    assert demonstrations(rows, 0.25, seed=1) == demonstrations(rows, 0.25, seed=1)
