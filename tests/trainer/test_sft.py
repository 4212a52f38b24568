import asyncio
import json

import pytest
import torch
import typer
from tests.rollout.scripted import Scripted
from typer.testing import CliRunner

from venusrl.cli.sft import sft
from venusrl.env.base import Episode
from venusrl.env.calculator import CALCULATE_TOOL, CalculatorEnv, demonstration, generate_dataset
from venusrl.model.chat import load_tokenizer
from venusrl.model.checkpoint import load_model
from venusrl.rollout.agent_loop import run_agent_loop
from venusrl.rollout.config import RolloutConfig
from venusrl.trainer.sft import (
    SFTDataError,
    SFTExample,
    read_conversations_jsonl,
    sft_examples,
    train_sft,
)

TOOLS = [CALCULATE_TOOL]


def replay(row, demo):
    """Run the demonstration's tool calls through a fresh CalculatorEnv; returns the messages."""
    env = CalculatorEnv()
    messages, tools = asyncio.run(env.reset(row))
    assert tools == TOOLS
    for message in demo[len(messages):]:
        if message["role"] == "assistant":
            messages.append(message)
            if message.get("tool_calls"):
                messages += asyncio.run(env.step(message["tool_calls"])).observations
    return env, messages


def test_demonstration_replays_through_the_calculator_env_with_reward_one():
    for row in generate_dataset(30, seed=7):
        demo = demonstration(row)
        env, messages = replay(row, demo)
        assert messages == demo
        assert env.tool_calls == row["steps"]  # one operation per call
        assert env.reward(Episode(row, messages, "done")) == 1.0


def test_demonstration_of_an_unsupported_question():
    with pytest.raises(ValueError, match="cannot demonstrate"):
        demonstration({"question": "Compute -(2 + 3).", "answer": -5})
    with pytest.raises(ValueError, match="is not 'Compute <expression>.'"):
        demonstration({"question": "Compute 2 +.", "answer": 2})


def test_sft_example_is_what_the_agent_loop_records(tiny_tokenizer):
    """Replaying the demonstration as a model's turns through the real agent loop gives the
    same token ids, the same generated mask, the same messages and reward 1."""
    row = generate_dataset(5, seed=3)[4]
    demo = demonstration(row)
    turns = []
    for message in demo[2:]:
        if message["role"] == "assistant" and message.get("tool_calls"):
            expression = json.loads(message["tool_calls"][0]["function"]["arguments"])["expression"]
            body = json.dumps({"name": "calculate", "arguments": {"expression": expression}})
            turns.append((f"<tool_call>\n{body}\n</tool_call>", True))
        elif message["role"] == "assistant":
            turns.append((message["content"], True))
    config = RolloutConfig(max_turns=len(turns), max_total_tokens=8192)
    rollout = asyncio.run(run_agent_loop(CalculatorEnv(), row, Scripted(tiny_tokenizer, list(turns)), tiny_tokenizer,
                                         config, trajectory_id="call"))
    [example] = sft_examples(tiny_tokenizer, [demo], TOOLS)
    assert rollout.reward == 1.0 and rollout.messages == demo
    assert example.token_ids == rollout.token_ids
    assert example.loss_mask == [bool(m) for m in rollout.generated_mask]
    eos = tiny_tokenizer.eos_token_ids[0]
    assert sum(example.loss_mask) == sum(len(tiny_tokenizer.encode(text)) + 1 for text, _ in turns)
    assert [t for t, m in zip(example.token_ids, example.loss_mask, strict=True) if m].count(eos) == len(turns)


def test_per_conversation_tools_and_trailing_messages(tiny_tokenizer):
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "bye"}]  # nothing to learn after the last assistant turn
    shared = sft_examples(tiny_tokenizer, [chat], None)
    per_conversation = sft_examples(tiny_tokenizer, [chat, chat], [None, TOOLS])
    assert per_conversation[0] == shared[0] != per_conversation[1]
    masked = [t for t, m in zip(shared[0].token_ids, shared[0].loss_mask, strict=True) if m]
    assert tiny_tokenizer.decode(masked) == "hello<|im_end|>"
    assert "bye" not in tiny_tokenizer.decode(shared[0].token_ids)


@pytest.mark.parametrize(("chat", "message"), [
    ([{"role": "user", "content": "x"}], "no assistant message"),
    ([{"role": "assistant", "content": "x"}], r"messages\[0\]: the conversation must open"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
     r"messages\[2\]: two assistant messages in a row"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "nope", "arguments": "{}"}}]}],
     r"messages\[1\]: tool calls do not survive.*unknown tool 'nope'"),
    ([{"role": "user", "content": "x"}, {"role": "robot", "content": "a"}], r"messages\[1\]\.role"),
])
def test_bad_conversations_name_the_example(tiny_tokenizer, chat, message):
    good = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    with pytest.raises(SFTDataError, match="example 1: " + message) as info:
        sft_examples(tiny_tokenizer, [good, chat], TOOLS)
    assert info.value.index == 1


def test_sft_examples_argument_errors(tiny_tokenizer):
    with pytest.raises(ValueError, match="no conversations"):
        sft_examples(tiny_tokenizer, [], TOOLS)
    with pytest.raises(ValueError, match="1 tool lists for 2 conversations"):
        sft_examples(tiny_tokenizer, [[], []], [TOOLS])


def test_read_conversations_jsonl_names_the_line(tmp_path):
    good = json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": TOOLS})
    path = tmp_path / "data.jsonl"
    path.write_text(f"{good}\n\n{json.dumps({'messages': []})}\n")
    rows = read_conversations_jsonl(path)
    assert rows.lines == [1, 3] and rows.tools == [TOOLS, None]
    for bad, message in [("{nope", "invalid JSON"), ('{"msgs": []}', 'expected an object with a "messages" list'),
                         ('{"messages": [], "tools": {}}', '"tools" must be a list')]:
        path.write_text(f"{good}\n{bad}\n")
        with pytest.raises(ValueError, match=f"data.jsonl:2: {message}"):
            read_conversations_jsonl(path)


def cli():
    app = typer.Typer()
    app.command()(sft)
    return app


def test_cli_bad_row_names_the_file_line(tiny_model_dir, tmp_path):
    good = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}
    bad = {"messages": [{"role": "user", "content": "x"}]}
    data = tmp_path / "data.jsonl"
    data.write_text(f"{json.dumps(good)}\n\n{json.dumps(bad)}\n")
    result = CliRunner().invoke(cli(), ["--model", str(tiny_model_dir), "--out", str(tmp_path / "out"),
                                        "--data", str(data)])
    assert result.exit_code == 2
    assert f"{data}:3: no assistant message" in result.output
    result = CliRunner().invoke(cli(), ["--model", str(tiny_model_dir), "--out", str(tmp_path / "out"),
                                        "--env", "swe_lite"])
    assert result.exit_code == 2 and "no generated demonstrations for environment 'swe_lite'" in result.output


def test_train_sft_input_errors(tiny_model_dir, tmp_path):
    example = SFTExample([1, 2, 3], [False, True, True])
    for examples, message in [([], "no SFT examples"),
                              ([example, SFTExample([1, 2], [True, False])], "example 1: no assistant token"),
                              ([SFTExample([1, 2], [True])], "example 0: loss_mask and token_ids differ")]:
        with pytest.raises(ValueError, match=message):
            train_sft(tiny_model_dir, tmp_path / "out", examples, progress=False)
    with pytest.raises(ValueError, match="out_dir must differ"):
        train_sft(tiny_model_dir, tiny_model_dir, [example], progress=False)


def assistant_loss(model, examples):
    """Token-mean cross-entropy over the examples' assistant tokens, with our own model code."""
    total, count = 0.0, 0
    with torch.no_grad():
        for example in examples:
            ids = torch.tensor([example.token_ids])
            mask = torch.tensor(example.loss_mask[1:])
            losses = torch.nn.functional.cross_entropy(model(ids)[0, :-1], ids[0, 1:], reduction="none")
            total += losses[mask].sum().item()
            count += int(mask.sum())
    return total / count


@pytest.mark.slow
def test_sft_lowers_the_loss_and_saves_a_directory_our_loader_reads(tiny_model_dir, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    rows = [row for row in generate_dataset(40, seed=11) if row["steps"] <= 2][:6]
    examples = sft_examples(tiny_tokenizer, [demonstration(row) for row in rows], TOOLS)
    out = tmp_path / "sft"
    metrics = train_sft(tiny_model_dir, out, examples, epochs=4, lr=3e-3, batch_size=4, seed=0, progress=False)
    assert len(metrics["loss_per_epoch"]) == 4 and metrics["loss_per_epoch"][-1] < metrics["loss_per_epoch"][0]
    assert metrics["tokens_per_epoch"] == sum(sum(e.loss_mask) for e in examples) and metrics["steps"] == 8

    trained = load_model(out)
    assert assistant_loss(trained, examples) < assistant_loss(load_model(tiny_model_dir), examples) - 0.5
    ids = torch.tensor([examples[0].token_ids])
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.allclose(trained(ids), hf(ids).logits, atol=1e-4)
    reloaded = load_tokenizer(out)
    assert reloaded.hf.chat_template == tiny_tokenizer.hf.chat_template
    assert reloaded.eos_token_ids == tiny_tokenizer.eos_token_ids


def test_cli_trains_on_generated_calculator_demonstrations(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli(), ["--model", str(tiny_model_dir), "--out", str(out), "--examples", "2",
                                        "--epochs", "1", "--lr", "1e-3", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output[result.output.index("{"):])["examples"] == 2
    load_model(out)


def qwen3_conversation(with_reasoning=True):
    """One call, two parallel calls, an answer, then a follow-up user turn and its answer."""
    think = (lambda text: {"reasoning_content": text}) if with_reasoning else (lambda text: {})
    calc = [{"id": "c0", "type": "function", "function": {"name": "calculate", "arguments": json.dumps(a)}}
            for a in ({"expression": "2 + 3"}, {"expression": "5 * 2"}, {"expression": "10 + 1"})]
    return [
        {"role": "user", "content": "Compute ((2 + 3) * 2) + 1, and 5 * 2."},
        {"role": "assistant", "content": None, "tool_calls": [calc[0]], **think("First 2 + 3.")},
        {"role": "tool", "tool_call_id": "c0", "content": "5"},
        {"role": "assistant", "content": "Two at once.", "tool_calls": [calc[1], calc[2]], **think("Now both.")},
        {"role": "tool", "tool_call_id": "c0", "content": "10"},
        {"role": "tool", "tool_call_id": "c0", "content": "11"},
        {"role": "assistant", "content": "11 and 10.", **think("Done.")},
        {"role": "user", "content": "And 1 + 1?"},
        {"role": "assistant", "content": "2."},
    ]


@pytest.mark.parametrize("with_reasoning", [True, False])
def test_qwen3_multi_turn_loss_mask_is_exactly_the_assistant_turns(qwen3_tokenizer, with_reasoning):
    """On the official Qwen3 template the mask covers each assistant turn as the template
    renders it right after its generation prompt -- always with its think block, empty when
    the message has no reasoning, as a Qwen3 model thinking writes it -- plus <|im_end|>."""
    tok = qwen3_tokenizer
    conversation = qwen3_conversation(with_reasoning)
    (example,) = sft_examples(tok, [conversation], TOOLS)
    runs, current = [], []
    for token, masked in zip(example.token_ids, example.loss_mask, strict=True):
        if masked:
            current.append(token)
        elif current:
            runs, current = [*runs, current], []
    runs += [current] if current else []
    call = '<tool_call>\n{{"name": "calculate", "arguments": {}}}\n</tool_call>'
    args = [c["function"]["arguments"] for m in conversation for c in m.get("tool_calls", [])]
    think = (lambda text: f"<think>\n{text}\n</think>\n\n") if with_reasoning else (lambda text: "<think>\n\n</think>\n\n")
    expected = [think("First 2 + 3.") + call.format(args[0]),
                think("Now both.") + "Two at once.\n" + call.format(args[1]) + "\n" + call.format(args[2]),
                think("Done.") + "11 and 10.",
                "<think>\n\n</think>\n\n2."]
    assert [tok.decode(r) for r in runs] == [e + "<|im_end|>" for e in expected]
    # up to the follow-up user turn the ids are the template's rendering of the conversation
    before_follow_up = tok.encode(tok.render(conversation[:7], TOOLS))
    if with_reasoning:
        assert example.token_ids[: len(before_follow_up) - 1] == before_follow_up[:-1]  # all but the final '\n'


def test_cli_sft_multi_turn_on_a_qwen3_directory(qwen3_model_dir, tmp_path):
    data = tmp_path / "conversations.jsonl"
    data.write_text("\n".join(json.dumps({"messages": qwen3_conversation(r), "tools": TOOLS}) for r in (True, False)))
    out = tmp_path / "out"
    result = CliRunner().invoke(cli(), ["--model", str(qwen3_model_dir), "--out", str(out), "--data", str(data),
                                        "--epochs", "1", "--batch-size", "2", "--lr", "1e-4", "--no-progress",
                                        "--chat-template-kwargs", '{"enable_thinking": true}'])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.output[result.output.index("{"):])
    assert metrics["examples"] == 2 and metrics["steps"] == 1
    assert load_tokenizer(out).hf.chat_template == load_tokenizer(qwen3_model_dir).hf.chat_template
    load_model(out)
    bad = CliRunner().invoke(cli(), ["--model", str(qwen3_model_dir), "--out", str(tmp_path / "x"), "--data", str(data),
                                     "--chat-template-kwargs", "[1]"])
    assert bad.exit_code == 2 and "--chat-template-kwargs" in bad.output
