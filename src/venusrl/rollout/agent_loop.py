"""One trajectory's agent loop: generate a turn, parse its tool calls, run them in the
environment, feed the observations back, until the model answers without a tool call, the
environment says done, or a limit is hit. Everything the trainer needs is recorded: token
ids, the mask of generated tokens, their behaviour log-probs and the weight version of each
turn. This `Rollout` is the trajectory's one record: the worker hands it to the coordinator
with the done event and the trainer reads it. Malformed calls, tool errors and timeouts
become observations; truncation is marked."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from venusrl.env.base import Environment, Episode
from venusrl.model.chat import ChatTokenizer
from venusrl.model.conversation import Conversation
from venusrl.rollout.config import RolloutConfig
from venusrl.types import SamplingParams

log = logging.getLogger(__name__)


class TurnOutput(Protocol):
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    weight_versions: list[int]


GenerateFn = Callable[[list[int], SamplingParams, str], Awaitable[TurnOutput]]


class TurnObserver(Protocol):
    """Told of each turn boundary (the rollout worker reports them to the coordinator)."""

    def turn_started(self, context_ids: list[int], messages: Sequence[dict[str, Any]]) -> None:
        """Generation starts; context_ids are the tokens fed since the last generated ones,
        messages the chat so far (what a length predictor reads)."""

    def turn_ended(self, output: TurnOutput, tool_call: bool) -> None: ...

    def tool_returned(self, error: bool) -> None: ...


@dataclass(slots=True)
class TurnRecord:
    generated_tokens: int
    weight_versions: tuple[int, ...]  # distinct versions the turn's tokens were sampled under
    finish_reason: str
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0


@dataclass(slots=True)
class Rollout:
    trajectory_id: str
    token_ids: list[int]
    generated_mask: list[int]
    logprobs: list[float]  # aligned with token_ids; 0.0 where the mask is 0
    messages: list[dict[str, Any]]
    turns: list[TurnRecord] = field(default_factory=list)
    finish_reason: str = "done"  # done, env_done, max_turns, max_total_tokens
    reward: float = 0.0

    @property
    def truncated(self) -> bool:
        return self.finish_reason in ("max_turns", "max_total_tokens")


async def run_agent_loop(
    env: Environment,
    row: dict[str, Any],
    generate: GenerateFn,
    tokenizer: ChatTokenizer,
    config: RolloutConfig,
    trajectory_id: str,
    sandbox: Any = None,
    observer: TurnObserver | None = None,
) -> Rollout:
    messages, tools = await env.reset(row, sandbox)
    conversation = Conversation.start(tokenizer, messages, tools)
    rollout = Rollout(trajectory_id, conversation.token_ids, conversation.generated_mask,
                      [0.0] * len(conversation.token_ids), conversation.messages)
    rollout.finish_reason = "max_turns"
    consumed = 0  # tokens already reported to the observer
    for turn in range(config.max_turns):
        budget = config.max_total_tokens - len(conversation.token_ids)
        if budget <= 0:
            rollout.finish_reason = "max_total_tokens"
            break
        sampling = SamplingParams(max_new_tokens=min(config.max_new_tokens_per_turn, budget),
                                  temperature=config.temperature, top_p=config.top_p)
        if observer is not None:
            observer.turn_started(conversation.token_ids[consumed:], conversation.messages)
        output = await generate(list(conversation.token_ids), sampling, trajectory_id)
        parsed = conversation.add_assistant_turn(output.output_ids, id_prefix=f"{trajectory_id}-{turn}")
        consumed = len(conversation.token_ids)
        calls_tool = bool(parsed.tool_calls or parsed.errors)
        truncated = output.finish_reason == "length" and len(output.output_ids) >= budget
        continues = not truncated and (calls_tool or env.continues_without_tool_call)
        if observer is not None:
            observer.turn_ended(output, tool_call=continues)
        rollout.logprobs.extend(output.logprobs)
        record = TurnRecord(len(output.output_ids), tuple(sorted(set(output.weight_versions))),
                            output.finish_reason or "stop", len(parsed.tool_calls), len(parsed.errors))
        rollout.turns.append(record)
        if truncated:
            rollout.finish_reason = "max_total_tokens"
            break
        started = time.monotonic()
        if calls_tool:
            observations, env_done, failed = await _run_tools(env, parsed.tool_calls, config.tool_timeout_s)
            record.tool_errors += failed
            observations += [{"role": "user", "content": e.message} for e in parsed.errors]
        else:
            reply = await env.respond() if env.continues_without_tool_call else None
            if reply is None:
                if continues and observer is not None:  # reported as going on: close the turn
                    observer.tool_returned(error=False)
                rollout.finish_reason = "done"
                break
            observations, env_done = reply.observations, reply.done
        record.tool_seconds = time.monotonic() - started
        added = conversation.add_messages(observations)
        rollout.logprobs.extend([0.0] * len(added))
        if observer is not None:
            observer.tool_returned(error=record.tool_errors > 0)
        if env_done:
            rollout.finish_reason = "env_done"
            break
    episode = Episode(row, conversation.messages, rollout.finish_reason,
                      tool_calls=sum(t.tool_calls for t in rollout.turns),
                      tool_errors=sum(t.tool_errors for t in rollout.turns))
    reward = env.reward(episode)
    rollout.reward = float(await reward if inspect.isawaitable(reward) else reward)
    log.info("trajectory %s finished (%s): %d turns, %d tokens, reward %.3f", trajectory_id,
             rollout.finish_reason, len(rollout.turns), len(rollout.token_ids), rollout.reward)
    return rollout


async def _run_tools(
    env: Environment, calls: Sequence[dict[str, Any]], timeout_s: float
) -> tuple[list[dict[str, Any]], bool, int]:
    """(observations, environment done, failed calls). A timeout or an exception in the
    environment is reported to the model as the result of every call of the step."""
    if not calls:
        return [], False, 0
    try:
        result = await asyncio.wait_for(env.step(list(calls)), timeout=timeout_s)
    except TimeoutError:
        message = f"error: tool call timed out after {timeout_s:g}s"
    except Exception as err:  # the environment's failure is the model's observation, not a crash
        log.warning("tool step failed: %s", err)
        message = f"error: {type(err).__name__}: {err}"
    else:
        return result.observations, result.done, 0
    return [{"role": "tool", "tool_call_id": c["id"], "content": message} for c in calls], False, len(calls)
