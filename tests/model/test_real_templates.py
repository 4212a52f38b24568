"""Token in, token out on the official chat templates (Qwen3, Qwen2.5, Llama 3.1 as the npm
registry ships them; tests/real_tokenizers.py): a conversation's ids are what the model saw
and sampled, each appended delta is the template's own rendering of the new messages, and the
mask counts exactly the sampled tokens."""

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.real_tokenizers import tokenizer_dir

from venusrl.model.chat import load_tokenizer
from venusrl.model.conversation import Conversation

TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "lookup", "description": "find a word", "parameters": {
        "type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}},
]
START = [{"role": "system", "content": "You are a careful assistant."},
         {"role": "user", "content": "What is 2 + 3, and what does 'sum' mean?"}]


@pytest.fixture(scope="module", params=["qwen3", "qwen2_5", "llama3_1"])
def tokenizer(request):
    return load_tokenizer(tokenizer_dir(request.param))


def qwen3():
    return load_tokenizer(tokenizer_dir("qwen3"))


def hermes(name, arguments):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


class Model:
    """Plays the model: its turns are the ids of the text it writes plus its end-of-turn id."""

    def __init__(self, conversation: Conversation):
        self.conversation, self.sampled = conversation, 0

    def says(self, text: str):
        tok = self.conversation.tokenizer
        ids = tok.encode(text) + [tok.eos_token_ids[0]]
        self.sampled += len(ids)
        parsed = self.conversation.add_assistant_turn(ids, id_prefix=f"t{self.sampled}")
        assert parsed.errors == []
        return parsed

    def then(self, messages):
        """Appends `messages`; checks the delta is the template's rendering of them after the
        assistant turn just taken (full-history render minus the render without them)."""
        conversation = self.conversation
        before = list(conversation.token_ids)
        added = conversation.add_messages(messages)
        assert conversation.token_ids == before + added  # append-only
        assert sum(conversation.generated_mask) == self.sampled
        assert [i for i, m in zip(conversation.token_ids, conversation.generated_mask, strict=True) if not m][-len(added):] == added
        return added


def tool_results(parsed, *contents):
    return [{"role": "tool", "tool_call_id": c["id"], "content": r} for c, r in zip(parsed.tool_calls, contents, strict=True)]


def test_qwen3_thinking_tool_calls_match_the_template_render_exactly():
    """One call, two parallel calls, a final answer, reasoning in every turn: the ids are the
    template's rendering of the whole conversation at every step."""
    tok = qwen3()
    conversation = Conversation.start(tok, START, TOOLS)
    model = Model(conversation)

    def full_render():
        return tok.encode(tok.render(conversation.messages, TOOLS, add_generation_prompt=True))

    assert conversation.token_ids == full_render()
    one = model.says("<think>\nI should add first.\n</think>\n\n" + hermes("add", {"a": 2, "b": 3}))
    assert one.reasoning_content == "I should add first." and one.content == ""
    assert conversation.messages[-1]["reasoning_content"] == "I should add first."
    model.then(tool_results(one, "5"))
    assert conversation.token_ids == full_render()
    two = model.says("<think>\nNow two lookups at once.\n</think>\n\n"
                     + hermes("lookup", {"word": "sum"}) + "\n" + hermes("lookup", {"word": "plus"}))
    assert [json.loads(c["function"]["arguments"]) for c in two.tool_calls] == [{"word": "sum"}, {"word": "plus"}]
    model.then(tool_results(two, "sum: the result of adding", "plus: and"))
    assert conversation.token_ids == full_render()
    final = model.says("<think>\nI have all I need.\n</think>\n\n2 + 3 = 5; a sum is the result of adding.")
    assert final.tool_calls == [] and final.content.startswith("2 + 3 = 5")
    text = tok.decode(conversation.token_ids)
    assert text + "\n" == tok.render(conversation.messages, TOOLS)  # the template ends a turn with a newline


def test_qwen3_follow_up_user_turn_keeps_earlier_thinking_append_only():
    """Qwen3's template drops the think blocks of turns before the last user message; the
    trajectory keeps them. Pinned: the ids are the template's render with exactly those
    think blocks put back, and every earlier id is unchanged."""
    tok = qwen3()
    conversation = Conversation.start(tok, START, TOOLS)
    model = Model(conversation)
    one = model.says("<think>\nAdd.\n</think>\n\n" + hermes("add", {"a": 2, "b": 3}))
    model.then(tool_results(one, "5"))
    model.says("<think>\nAnswer.\n</think>\n\nIt is 5.")
    before = list(conversation.token_ids)
    added = model.then([{"role": "user", "content": "And 5 + 5?"}])
    assert tok.decode(added) == "\n<|im_start|>user\nAnd 5 + 5?<|im_end|>\n<|im_start|>assistant\n"
    assert conversation.token_ids[: len(before)] == before
    ours = tok.decode(conversation.token_ids)
    template = tok.render(conversation.messages, TOOLS, add_generation_prompt=True)
    assert ours != template
    assert "<think>\nAdd.\n</think>" in ours and "<think>" not in template
    assert re.sub(r"<think>\n.*?\n</think>\n\n", "", ours, flags=re.DOTALL) == template


def test_qwen3_enable_thinking_false_from_config_and_per_conversation():
    """enable_thinking=False: each generation prompt carries the empty think block (prompt
    ids, mask 0); the model's turns are the answer only. One call, two parallel calls, an
    answer, a follow-up user turn."""
    empty_think = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    for tok, kwargs in ((load_tokenizer(tokenizer_dir("qwen3"), template_kwargs={"enable_thinking": False}), None),
                        (qwen3(), {"enable_thinking": False})):
        conversation = Conversation.start(tok, START, TOOLS, template_kwargs=kwargs)
        assert tok.decode(conversation.token_ids).endswith(empty_think)
        model = Model(conversation)
        one = model.says(hermes("add", {"a": 2, "b": 3}))
        assert one.reasoning_content is None
        added = model.then(tool_results(one, "5"))
        assert tok.decode(added) == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n" + empty_think
        two = model.says(hermes("lookup", {"word": "sum"}) + "\n" + hermes("lookup", {"word": "plus"}))
        added = model.then(tool_results(two, "adding", "and"))
        assert tok.decode(added) == ("\n<|im_start|>user\n<tool_response>\nadding\n</tool_response>\n<tool_response>\n"
                                     "and\n</tool_response><|im_end|>\n" + empty_think)
        model.says("5.")
        added = model.then([{"role": "user", "content": "thanks"}])
        assert tok.decode(added).endswith(empty_think)
        # the template's own render differs from ours exactly by the empty think blocks of
        # the generation prompts it re-renders as plain assistant turns
        template = tok.render(conversation.messages, TOOLS, add_generation_prompt=True, template_kwargs=kwargs)
        assert tok.decode(conversation.token_ids).replace("<think>\n\n</think>\n\n", "") == template.replace(
            "<think>\n\n</think>\n\n", "")
    thinking = Conversation.start(qwen3(), START, TOOLS)
    assert not qwen3().decode(thinking.token_ids).endswith(empty_think)


def test_each_template_one_call_two_parallel_calls_answer_then_follow_up(tokenizer):
    """On every official template: the delta of each step is the template's rendering of the
    new messages after an assistant turn (full render of the history with them, minus the
    render up to and including that turn), and the ids decode to the model's text as sampled."""
    tok = tokenizer
    fmt = tok.tool_format.name
    write = (hermes if fmt == "hermes"
             else lambda n, a: json.dumps({"name": n, "parameters": a}))
    separator = "\n" if fmt == "hermes" else "; "
    conversation = Conversation.start(tok, START, TOOLS)
    model = Model(conversation)
    assert conversation.token_ids == tok.encode(tok.render(START, TOOLS, add_generation_prompt=True))
    texts = [write("add", {"a": 2, "b": 3}),
             write("lookup", {"word": "sum"}) + separator + write("lookup", {"word": "plus"}),
             "The answer is 5."]
    results = [["5"], ["adding", "and"], None]
    for text, result in zip(texts, results, strict=True):
        parsed = model.says(text)
        if result is None:
            assert parsed.tool_calls == [] and parsed.content == text
            new = [{"role": "user", "content": "Thanks. Once more?"}]
        else:
            assert len(parsed.tool_calls) == len(result)
            new = tool_results(parsed, *result)
        rendered = tok.render(conversation.messages + new, TOOLS, add_generation_prompt=True)
        added = model.then(new)
        if fmt == "hermes":  # the template renders the turn as sampled: what follows it is the delta
            eos_text = tok.decode([tok.eos_token_ids[0]])
            assert rendered.count(text) == 1
            assert eos_text + tok.decode(added) == rendered[rendered.index(text) + len(text):]
        elif fmt == "llama3_json":  # the template renders no tool calls; the delta is its message layout
            role = new[0]["role"]
            expected = "".join(f"<|start_header_id|>{role}<|end_header_id|>\n\n{m['content']}<|eot_id|>" for m in new)
            assert tok.decode(added) == expected + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    sampled = [t for t, m in zip(conversation.token_ids, conversation.generated_mask, strict=True) if m]
    eos_text = tok.decode([tok.eos_token_ids[0]])
    assert tok.decode(sampled) == eos_text.join(texts) + eos_text


def test_think_blocks_are_never_executed():
    tok = qwen3()
    conversation = Conversation.start(tok, START, TOOLS)
    drafted = "<think>\nMaybe " + hermes("add", {"a": 1, "b": 1}) + "? No: a literal <tool_call> is fine here.\n</think>\n\n"
    parsed = conversation.add_assistant_turn(tok.encode(drafted + hermes("add", {"a": 2, "b": 3})) + [tok.eos_token_ids[0]])
    assert parsed.errors == []
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [{"a": 2, "b": 3}]
    assert "<tool_call>" in parsed.reasoning_content
    cut_off = Conversation.start(tok, START, TOOLS)
    parsed = cut_off.add_assistant_turn(tok.encode("<think>\nI will call " + hermes("add", {"a": 1, "b": 2})))
    assert parsed.tool_calls == [] and parsed.errors == [] and parsed.content == ""


def test_detected_formats():
    assert qwen3().tool_format.name == "hermes"
    assert load_tokenizer(tokenizer_dir("qwen2_5")).tool_format.name == "hermes"
    assert load_tokenizer(tokenizer_dir("llama3_1")).tool_format.name == "llama3_json"
    assert load_tokenizer(tokenizer_dir("qwen3"), tool_call_format="qwen3_coder").tool_format.name == "qwen3_coder"


def test_qwen3_coder_format_is_detected_from_its_template_layout():
    """No package ships Qwen3-Coder's template; its tool-call layout (XML function and
    parameter tags inside <tool_call>) is what detection keys on."""
    from venusrl.model.tool_formats import detect_format

    coder = ("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
             "{{- '<parameter=' + name + '>\\n' + value + '\\n</parameter>\\n' }}{{- '</function>\\n</tool_call>' }}")
    assert detect_format(coder).name == "qwen3_coder"
    assert detect_format(qwen3().hf.chat_template).name == "hermes"


def test_make_tiny_with_a_real_tokenizer_from_the_cli(tmp_path):
    from typer.testing import CliRunner

    from venusrl.cli import app
    from venusrl.model.checkpoint import load_model

    result = CliRunner().invoke(app, ["model", "make-tiny", str(tmp_path / "m"), "--layers", "1", "--hidden", "16",
                                      "--heads", "2", "--kv-heads", "1", "--tokenizer-dir", str(tokenizer_dir("qwen3"))])
    assert result.exit_code == 0, result.output
    model, tok = load_model(tmp_path / "m"), load_tokenizer(tmp_path / "m")
    assert model.args.vocab_size >= tok.vocab_size == 151669
    assert tok.eos_token_ids == (151645, 151643)  # <|im_end|>, <|endoftext|>: Qwen3's generation config
    assert tok.hf.chat_template == qwen3().hf.chat_template
    result = CliRunner().invoke(app, ["model", "make-tiny", str(tmp_path / "n"), "--tokenizer-dir", str(tmp_path)])
    assert result.exit_code == 2 and "tokenizer.json" in result.output


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(exclude_categories=["Cs"]), max_size=30))
def test_token_bytes_concatenate_to_the_texts_bytes(tokenizer, text):
    """(Of the text as the tokenizer normalises it: Qwen's NFC maps U+2F800 to U+4E3D.)"""
    ids = tokenizer.encode(text)
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == tokenizer.decode(ids).encode()


def test_a_template_failure_names_the_message_index():
    """A template's own error (here a Qwen3 template broken on assistant messages) is a
    ValueError naming the first message it fails on."""
    from venusrl.model.chat import TemplateRenderError

    tok = load_tokenizer(tokenizer_dir("qwen3"))
    assert "{%- if '</think>' in message.content %}" in tok.hf.chat_template
    tok.hf.chat_template = tok.hf.chat_template.replace("{%- if '</think>' in message.content %}",
                                                        "{%- if message.content.nope() %}")
    messages = [{"role": "user", "content": "a"}] * 3 + [{"role": "assistant", "content": "b"}] * 4
    with pytest.raises(TemplateRenderError, match=r"^messages\[3\]: the chat template cannot render it"):
        tok.render(messages)
