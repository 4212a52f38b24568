"""An environment for runs on the Qwen3-template tool model (tests/engine/tool_model.py): the
model thinks and calls `add`; after the result a user follows up once, so every trajectory
has a tool turn, a tool result and a follow-up user turn."""

import json

from tests.engine.tool_model import ADD_TOOL, TOOL_PROMPT

from venusrl.env.base import Environment, Episode, StepResult


class ThinkThenAddEnv(Environment):
    required_fields = ("a", "b")
    continues_without_tool_call = True  # the follow-up user turn

    def __init__(self):
        self.followed_up = False

    @staticmethod
    def generate_dataset(count, seed, **options):
        return [{"id": f"add-{seed}-{i}", "prompt": TOOL_PROMPT[0]["content"], "a": 2, "b": 3} for i in range(count)]

    async def reset(self, row, sandbox=None):
        self.check_row(row)
        return [dict(m) for m in TOOL_PROMPT], [ADD_TOOL]

    async def step(self, tool_calls):
        return StepResult([{"role": "tool", "tool_call_id": c["id"],
                            "content": str(sum(json.loads(c["function"]["arguments"]).values()))} for c in tool_calls])

    async def respond(self):
        if self.followed_up:
            return None
        self.followed_up = True
        return StepResult([{"role": "user", "content": "And 5 + 5?"}])

    def reward(self, episode: Episode) -> float:
        return float(any(m["role"] == "tool" and m["content"] == "5" for m in episode.messages))
