"""`calculator`: multi-step arithmetic with a `calculate` tool. The number of operations,
and so of useful tool calls (1 to 8), varies with the problem, so trajectory lengths vary
within a group (sampling) and across groups (difficulty). A row's `busy_calls` (default 0)
is how many of its first calls the tool answers with a transient error (BUSY_ERROR), as a
rate-limited service does: the same call made again then succeeds. No sandbox."""

from __future__ import annotations

import ast
import json
import operator
import random
import re
from collections.abc import Sequence
from typing import Any

from venusrl.env.base import DatasetRowError, Environment, Episode, StepResult

CALCULATE_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
SYSTEM_PROMPT = (
    "Solve the problem step by step. Use the calculate tool for every operation. "
    "When done, reply with 'Answer: <number>'."
)
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv, ast.USub: operator.neg}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
# 'Answer: N' must end the message (a full stop and whitespace may follow): a policy that
# writes more numbers after its answer is not graded on the first one it wrote
_ANSWER = re.compile(r"Answer:\s*(-?\d+(?:\.\d+)?)\.?\s*\Z")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
BUSY_ERROR = "error: calculator busy, try again"


def calculate(expression: str) -> str:
    """Numbers and + - * / only; errors come back as text for the model to read."""

    def evaluate(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](evaluate(node.operand))
        raise ValueError(f"unsupported expression element {type(node).__name__}")

    if len(expression) > 200:
        return "error: expression longer than 200 characters"
    try:
        value = evaluate(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as err:
        return f"error: {err}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


OPERATORS = ("+", "-", "*")  # what `make_problem` draws from; this order keeps the draws of earlier versions


def make_problem(rng: random.Random, steps: int, max_start: int = 20, max_operand: int = 50,
                 operators: Sequence[str] = OPERATORS) -> dict[str, Any]:
    """A chain of `steps` operations drawn uniformly from `operators` on small integers (the
    first number up to max_start, added or subtracted ones up to max_operand, factors 2..9);
    integer answer by construction. `operations` lists the operators in evaluation order."""
    value = rng.randint(1, max_start)
    text, operations = str(value), ""
    for _ in range(steps):
        op = rng.choice(operators)
        operand = rng.randint(2, min(9, max(2, max_operand))) if op == "*" else rng.randint(1, max_operand)
        text = f"({text} {op} {operand})"
        value = {"+": value + operand, "-": value - operand, "*": value * operand}[op]
        operations += op
    return {"question": f"Compute {text}.", "answer": value, "steps": steps, "operations": operations}


def generate_dataset(count: int, seed: int = 0, min_steps: int = 1, max_steps: int = 8, max_start: int = 20,
                     max_operand: int = 50, busy_fraction: float = 0.0,
                     operators: Sequence[str] = OPERATORS) -> list[dict[str, Any]]:
    """`count` problems of `min_steps`..`max_steps` operations (one tool call each) drawn from
    `operators` (a list of distinct ones among + - *); a `busy_fraction` of them (drawn at
    random) have `busy_calls: 1`, the first call failing."""
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
    if max_start < 1 or max_operand < 1:
        raise ValueError(f"need max_start >= 1 and max_operand >= 1, got {max_start}, {max_operand}")
    if not 0.0 <= busy_fraction <= 1.0:
        raise ValueError(f"busy_fraction: need 0 <= busy_fraction <= 1, got {busy_fraction}")
    check_operators(operators)
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        problem = make_problem(rng, rng.randint(min_steps, max_steps), max_start, max_operand, tuple(operators))
        row = {"id": f"calc-{seed}-{i}", **problem}
        if busy_fraction > 0:  # drawn only then: rows without busy calls are those of earlier versions
            row["busy_calls"] = int(rng.random() < busy_fraction)
        rows.append({**row, "prompt": row["question"]})
    return rows


def check_operators(operators: Any) -> None:
    if (not isinstance(operators, list | tuple) or not operators or len(set(operators)) != len(operators)
            or not all(op in OPERATORS for op in operators)):
        raise ValueError(f"operators: need a non-empty list of distinct operators among {list(OPERATORS)}, "
                         f"got {operators!r}")


class CalculatorEnv(Environment):
    required_fields = ("question", "answer")

    def __init__(self) -> None:
        self.tool_calls = 0
        self.busy_calls = 0

    async def reset(self, row: dict[str, Any], sandbox: Any = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        self.check_row(row)
        busy = row.get("busy_calls", 0)
        if not isinstance(busy, int) or isinstance(busy, bool) or busy < 0:
            raise DatasetRowError(f"row {row.get('id', '?')!r}: busy_calls must be an integer >= 0, got {busy!r}")
        self.busy_calls = busy
        return opening_messages(row), [CALCULATE_TOOL]

    async def step(self, tool_calls: list[dict[str, Any]]) -> StepResult:
        observations = []
        for call in tool_calls:
            self.tool_calls += 1
            if self.tool_calls <= self.busy_calls:
                result = BUSY_ERROR
            else:
                result = calculate(json.loads(call["function"]["arguments"])["expression"])
            observations.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        return StepResult(observations)

    def reward(self, episode: Episode) -> float:
        return float(final_answer_matches(episode))


def opening_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]


GRADED_ANSWER = "Answer: {}"  # the form the system prompt asks for and `final_answer_matches` reads


def demonstration(row: dict[str, Any], answer_form: str = GRADED_ANSWER,
                  swap_subtraction: bool = False) -> list[dict[str, Any]]:
    """The chat a perfect agent has for a `generate_dataset` row: the opening messages, one
    assistant turn per operation in evaluation order (each a single `calculate` call on the
    previous results, as the agent loop records it), the tool results, then the result in
    `answer_form` ('Answer: N' unless told otherwise). With `swap_subtraction` the agent is a
    careless one that calls every subtraction with its operands swapped ("7 - 3" as
    "3 - 7") and answers with what the tool returned: the same format, the wrong number."""
    CalculatorEnv().check_row(row)
    expression = row["question"].removeprefix("Compute ").removesuffix(".")
    try:
        tree = ast.parse(expression, mode="eval").body
    except SyntaxError as err:
        raise ValueError(f"question {row['question']!r} is not 'Compute <expression>.'") from err
    messages = opening_messages(row)

    def solve(node: ast.AST) -> str:
        if isinstance(node, ast.Constant | ast.UnaryOp) and isinstance(getattr(node, "operand", node), ast.Constant):
            return ast.unparse(node)  # a number, possibly negative
        if not isinstance(node, ast.BinOp) or type(node.op) not in _SYMBOLS:
            raise ValueError(f"question {row['question']!r}: cannot demonstrate {ast.unparse(node)!r}")
        left, right = solve(node.left), solve(node.right)
        if swap_subtraction and isinstance(node.op, ast.Sub):
            left, right = right, left
        step = f"{left} {_SYMBOLS[type(node.op)]} {right}"
        call_id = f"call-{sum(m['role'] == 'tool' for m in messages)}_0"
        call = {"id": call_id, "type": "function",
                "function": {"name": "calculate", "arguments": json.dumps({"expression": step})}}
        result = calculate(step)
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        return result

    messages.append({"role": "assistant", "content": answer_form.format(solve(tree))})
    return messages


def final_answer_matches(episode: Episode) -> bool:
    """The last assistant message ends with 'Answer: N', N equal to the row's answer."""
    final = next((m for m in reversed(episode.messages) if m["role"] == "assistant"), None)
    match = _ANSWER.search((final or {}).get("content") or "")
    return match is not None and abs(float(match.group(1)) - float(episode.row["answer"])) < 1e-6


def final_number_matches(episode: Episode) -> bool:
    """The last assistant message has the row's answer as its last number, in any form
    ('Answer: N', 'The result is N.', 'N'): the right number whether or not it is graded."""
    final = next((m for m in reversed(episode.messages) if m["role"] == "assistant"), None)
    numbers = _NUMBER.findall((final or {}).get("content") or "")
    return bool(numbers) and abs(float(numbers[-1]) - float(episode.row["answer"])) < 1e-6
