"""An agent loop written against the e2b SDK, and nothing else: it runs unchanged on E2B's
cloud or on venusrl's sandboxes (`venusrl sandbox serve --e2b`, then point E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY at it).

    python examples/e2b_agent/agent.py --limit 500

One episode: the task is a question whose answer takes computing; the policy answers with
tool calls (write a file, run a shell command, read a file) that run in the sandbox, sees
their results, and ends with `Answer: N`. The policy here is a scripted one that writes and
runs a program (so the example needs no model); any chat model that emits the same tool
calls (OpenAI-style function calling on TOOLS) drops in as `policy`.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any

from e2b import CommandExitException, Sandbox

TOOLS = [
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a text file in the sandbox.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "run_shell", "description": "Run a shell command in the sandbox; returns exit code, stdout, stderr.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file from the sandbox.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]
SYSTEM_PROMPT = "Solve the task with the tools; the sandbox has python3. End with 'Answer: <number>'."
MAX_OBSERVATION_CHARS = 2000
MAX_TURNS = 8

Policy = Callable[[list[dict[str, Any]]], dict[str, Any]]  # messages -> the assistant's message


def task(limit: int) -> dict[str, Any]:
    answer = sum(all(k % d for d in range(2, int(k**0.5) + 1)) for k in range(2, limit))
    return {"prompt": f"How many primes are there below {limit}?", "answer": answer}


def run_tool(sandbox: Sandbox, name: str, arguments: dict[str, Any], timeout_s: float = 30.0) -> str:
    """One tool call in the sandbox, as the text the model sees."""
    if name == "write_file":
        return f"wrote {sandbox.files.write(arguments['path'], arguments['content']).path}"
    if name == "read_file":
        return sandbox.files.read(arguments["path"])
    if name == "run_shell":
        try:
            result = sandbox.commands.run(arguments["command"], timeout=timeout_s)
        except CommandExitException as failed:  # a non-zero exit is an observation, not an error
            result = failed
        return f"exit code {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return f"unknown tool {name!r}"


def run_episode(sandbox: Sandbox, prompt: str, policy: Policy) -> list[dict[str, Any]]:
    """The agent loop: ask the policy, run its tool calls, feed back the results, until it
    answers without a tool call (or runs out of turns). Returns the conversation."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
    for _ in range(MAX_TURNS):
        reply = policy(messages)
        messages.append(reply)
        if not reply.get("tool_calls"):
            break
        for call in reply["tool_calls"]:
            output = run_tool(sandbox, call["function"]["name"], json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output[-MAX_OBSERVATION_CHARS:]})
    return messages


def final_answer(messages: list[dict[str, Any]]) -> int | None:
    found = re.search(r"Answer:\s*(-?\d+)", messages[-1].get("content") or "")
    return int(found.group(1)) if found else None


def _call(index: int, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": f"call-{index}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def scripted_policy(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Write a program for the question, run it, answer with what it printed."""
    turn = sum(1 for m in messages if m["role"] == "assistant")
    limit = int(re.search(r"below (\d+)", messages[1]["content"]).group(1))
    if turn == 0:
        program = (f"n = {limit}\nsieve = [True] * n\nsieve[:2] = [False] * min(2, n)\n"
                   "for i in range(2, int(n ** 0.5) + 1):\n    if sieve[i]:\n"
                   "        sieve[i * i::i] = [False] * len(sieve[i * i::i])\nprint(sum(sieve))\n")
        return {"role": "assistant", "content": None, "tool_calls": [_call(0, "write_file", path="primes.py", content=program)]}
    if turn == 1:
        return {"role": "assistant", "content": None, "tool_calls": [_call(1, "run_shell", command="python3 primes.py")]}
    printed = re.search(r"stdout:\n(\d+)", messages[-1]["content"])
    return {"role": "assistant", "content": f"Answer: {printed.group(1) if printed else 'unknown'}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=1000, help="the task: count the primes below this")
    parser.add_argument("--template", default="base", help="E2B template id")
    args = parser.parse_args()
    question = task(args.limit)
    with Sandbox.create(args.template) as sandbox:
        messages = run_episode(sandbox, question["prompt"], scripted_policy)
    answer = final_answer(messages)
    print(json.dumps({"sandbox": sandbox.sandbox_id, "turns": sum(m["role"] == "assistant" for m in messages),
                      "tool_calls": sum(m["role"] == "tool" for m in messages), "answer": answer,
                      "expected": question["answer"], "solved": answer == question["answer"]}))


if __name__ == "__main__":
    main()
