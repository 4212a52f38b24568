"""A tiny model that really emits a tool call: taught, by overfitting, to answer
TOOL_PROMPT with TOOL_REPLY (or, over the real Qwen3 vocabulary and template, THINKING_REPLY). Lets the server's and agent loop's tool paths be tested end to
end on a model rather than on canned text."""

import torch

from venusrl.model.chat import load_tokenizer
from venusrl.model.checkpoint import load_model, save_weights
from venusrl.model.generate import generate
from venusrl.model.tiny import make_tiny_model
from venusrl.types import SamplingParams

ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
TOOL_PROMPT = [{"role": "user", "content": "add 2 and 3"}]
TOOL_REPLY = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


# Qwen3's thinking layout, with an emoji the Qwen3 vocabulary splits over three tokens (its
# logprob bytes are partial UTF-8 sequences).
SPLIT_EMOJI = "\U0001fae0"
THINKING_REPLY = f"<think>\nAdd them {SPLIT_EMOJI}.\n</think>\n\n" + TOOL_REPLY


def teach_tool_call(path):
    return teach_reply(make_tiny_model(path, seed=4), TOOL_REPLY)


def teach_reply(path, reply, lr=3e-3):
    """Overfit the model at `path` to answer TOOL_PROMPT (with ADD_TOOL) with `reply`."""
    tokenizer = load_tokenizer(path)
    model = load_model(path).train()
    prompt = tokenizer.encode_chat(TOOL_PROMPT, [ADD_TOOL])
    target = tokenizer.encode(reply) + [tokenizer.eos_token_ids[0]]
    ids = torch.tensor([prompt + target])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    greedy = SamplingParams(max_new_tokens=len(target) + 4, temperature=0)
    for step in range(600):
        logits = model.lm_head(model.hidden_states(ids[:, :-1])[0, len(prompt) - 1 :])  # the reply's rows only
        loss = torch.nn.functional.cross_entropy(logits, ids[0, len(prompt) :])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 9 and generate(model.eval(), prompt, greedy).token_ids == target:
            break
        model.train()
    assert generate(model.eval(), prompt, greedy).token_ids == target, "the tiny model did not learn the reply"
    save_weights(model, path)
    return path
