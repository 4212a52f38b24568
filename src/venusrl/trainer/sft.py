"""Supervised warm start: teach a model the tool-call format from demonstrations before RL.

Examples are tokenized with the agent loop's own `Conversation`, turn by turn, so the loss
mask marks exactly the tokens the RL path marks as generated: each assistant turn's text as
the chat template renders it, plus the end-of-turn token the model must learn to emit.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from venusrl.model.chat import ChatTokenizer, validate_messages
from venusrl.model.checkpoint import copy_tokenizer_files
from venusrl.model.conversation import Conversation, TemplateLayoutError, assistant_end_text
from venusrl.trainer.shared_prefix import causal_lm_logits, common_prefix_length, right_padded

log = logging.getLogger(__name__)

Tools = list[dict[str, Any]] | None
# Tokenizer, chat template and generation config of a model directory, copied as they are.

class SFTDataError(ValueError):
    """A conversation cannot be trained on; `index` is its position in the input."""

    def __init__(self, index: int, reason: str):
        super().__init__(f"example {index}: {reason}")
        self.index = index
        self.reason = reason


@dataclass(slots=True)
class SFTExample:
    token_ids: list[int]
    loss_mask: list[bool]  # True exactly where the agent loop's generated_mask is 1


def sft_examples(
    tokenizer: ChatTokenizer,
    conversations: Sequence[list[dict[str, Any]]],
    tools: Tools | Sequence[Tools] = None,
) -> list[SFTExample]:
    """`tools`: one list of OpenAI tool schemas shared by every conversation, or one list (or
    None) per conversation."""
    if not conversations:
        raise ValueError("no conversations to build SFT examples from")
    per_conversation = bool(tools) and all(t is None or isinstance(t, list) for t in tools)
    if per_conversation and len(tools) != len(conversations):
        raise ValueError(f"{len(tools)} tool lists for {len(conversations)} conversations")
    examples = []
    for index, messages in enumerate(conversations):
        try:
            examples.append(_example(tokenizer, messages, tools[index] if per_conversation else tools))
        except (ValueError, TypeError, KeyError) as err:
            raise SFTDataError(index, str(err)) from err
    return examples


def _example(tokenizer: ChatTokenizer, messages: list[dict[str, Any]], tools: Tools) -> SFTExample:
    validate_messages(messages)
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise ValueError("no assistant message to learn from")
    if first == 0:
        raise ValueError("messages[0]: the conversation must open with a system or user message")
    conversation = Conversation.start(tokenizer, messages[:first], tools)
    end_of_turn = assistant_end_text(tokenizer, tools)
    eos = next((e for e in tokenizer.eos_token_ids if end_of_turn.startswith(tokenizer.decode([e]))),
               tokenizer.eos_token_ids[0])
    pending: list[dict[str, Any]] = []
    for i in range(first, len(messages)):
        message = messages[i]
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if conversation.awaiting_messages:
            if not pending:
                raise ValueError(f"messages[{i}]: two assistant messages in a row")
            conversation.add_messages(pending)
            pending = []
        text = _assistant_text(tokenizer, conversation.messages, message, tools, end_of_turn)
        parsed = conversation.add_assistant_turn(tokenizer.encode(text) + [eos])
        if parsed.errors or _calls(parsed.tool_calls) != _calls(message.get("tool_calls") or []):
            problem = parsed.errors[0].message if parsed.errors else "they parse back differently"
            raise ValueError(f"messages[{i}]: tool calls do not survive rendering and parsing ({problem})")
    # Messages after the last assistant turn carry nothing to learn and are left out.
    return SFTExample(list(conversation.token_ids), [bool(g) for g in conversation.generated_mask])


def _assistant_text(
    tokenizer: ChatTokenizer, history: list[dict[str, Any]], message: dict[str, Any], tools: Tools, end: str
) -> str:
    """What the model generates for `message` after `history`, as the template renders it."""
    before = tokenizer.render(history, tools, add_generation_prompt=True)
    after = tokenizer.render(history + [message], tools)
    if not after.startswith(before) or not after.endswith(end):
        raise TemplateLayoutError("the chat template does not render an assistant message as generation "
                                  "prompt + generated text + end of turn")
    return after[len(before) : len(after) - len(end)]


def _calls(tool_calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """(name, arguments) of OpenAI-style or bare tool calls, arguments decoded."""
    functions = [call.get("function", call) for call in tool_calls]
    return [(f["name"], json.loads(a) if isinstance(a := f.get("arguments", {}), str) else a) for f in functions]


class ConversationRows(NamedTuple):
    conversations: list[list[dict[str, Any]]]
    tools: list[Tools]
    lines: list[int]  # the JSONL line of each conversation, from 1


def read_conversations_jsonl(path: Path) -> ConversationRows:
    """Rows of {"messages": [...], "tools": [...]} ("tools" optional); blank lines skipped.
    Errors name the file and line."""
    rows = ConversationRows([], [], [])
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: invalid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            raise ValueError(f'{path}:{number}: expected an object with a "messages" list')
        if not isinstance(row.get("tools"), list | None):
            raise ValueError(f'{path}:{number}: "tools" must be a list of tool schemas')
        rows.conversations.append(row["messages"])
        rows.tools.append(row.get("tools"))
        rows.lines.append(number)
    if not rows.conversations:
        raise ValueError(f"{path}: no conversations")
    return rows


def train_sft(
    model_dir: Path,
    out_dir: Path,
    examples: Sequence[SFTExample],
    epochs: int = 2,
    lr: float = 1e-5,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """AdamW (warm-up then cosine decay) on the token mean of the cross-entropy over each batch's assistant tokens, in
    float32 on the CPU; writes a complete Hugging Face directory (safetensors weights, the
    source's tokenizer files and chat template) to `out_dir`. The loss of an epoch is the
    token-weighted mean of its batches' losses, each measured before its update."""
    from transformers import AutoModelForCausalLM

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    _check_inputs(model_dir, out_dir, examples, epochs, lr, batch_size)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    lengths = [len(e.token_ids) for e in examples]
    steps_per_epoch = -(-len(examples) // batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(epochs * steps_per_epoch))
    losses, tokens_per_epoch = [], 0
    started = time.monotonic()
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeRemainingColumn())
    with Progress(*columns, disable=not progress) as bar:
        task = bar.add_task("sft", total=epochs * steps_per_epoch)
        for epoch in range(1, epochs + 1):
            epoch_started, loss_sum, tokens = time.monotonic(), 0.0, 0
            for batch in _length_grouped_batches(lengths, batch_size, rng):
                input_ids, attention_mask, labels = _collate([examples[i] for i in batch])
                prefix = common_prefix_length([examples[i].token_ids for i in batch])
                logits = causal_lm_logits(model, input_ids, attention_mask, prefix)
                count = int((labels[:, 1:] != _IGNORE).sum())
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=_IGNORE)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
                loss_sum += loss.item() * count
                tokens += count
                bar.update(task, advance=1, description=f"sft epoch {epoch}/{epochs} loss {loss.item():.4f}")
            losses.append(loss_sum / tokens)
            tokens_per_epoch = tokens
            log.info("sft epoch %d/%d: loss %.4f over %d assistant tokens, %.1fs", epoch, epochs, losses[-1],
                     tokens, time.monotonic() - epoch_started)
    _save(model, model_dir, out_dir)
    return {"loss_per_epoch": losses, "tokens_per_epoch": tokens_per_epoch, "examples": len(examples),
            "steps": epochs * steps_per_epoch, "seconds": time.monotonic() - started}


_IGNORE = -100  # label of a position the loss skips: prompt, tool output, padding


def _check_inputs(model_dir: Path, out_dir: Path, examples: Sequence[SFTExample], epochs: int, lr: float,
                  batch_size: int) -> None:
    if not examples:
        raise ValueError("no SFT examples")
    for index, example in enumerate(examples):
        if len(example.loss_mask) != len(example.token_ids):
            raise ValueError(f"example {index}: loss_mask and token_ids differ in length")
        if not any(example.loss_mask[1:]):  # the first token has nothing before it to predict it
            raise ValueError(f"example {index}: no assistant token to train on")
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs ≥ 1, batch_size ≥ 1, lr > 0; got {epochs}, {batch_size}, {lr}")
    if out_dir.resolve() == model_dir.resolve():
        raise ValueError("out_dir must differ from model_dir")


def _length_grouped_batches(lengths: list[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffled batches of similar lengths, to pad little: shuffle, sort within windows of 8
    batches, cut into batches, shuffle the batches."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = 8 * batch_size
    order = [i for start in range(0, len(order), window)
             for i in sorted(order[start : start + window], key=lengths.__getitem__)]
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def warmup_cosine(total_steps: int, warmup_fraction: float = 0.05):
    """Learning-rate factor: linear warm-up, then cosine decay to zero, so the saved weights
    are not a snapshot of a noisy constant-rate walk."""
    warmup = max(1, int(total_steps * warmup_fraction))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def _collate(batch: list[SFTExample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids (pad id 0), attention mask, and labels: the token id where the
    loss applies, _IGNORE elsewhere."""
    input_ids = right_padded([e.token_ids for e in batch], torch.long)
    attention_mask = right_padded([[1] * len(e.token_ids) for e in batch], torch.long)
    labels = right_padded([[t if keep else _IGNORE for t, keep in zip(e.token_ids, e.loss_mask, strict=True)]
                           for e in batch], torch.long, padding_value=_IGNORE)
    return input_ids, attention_mask, labels


def _save(model: torch.nn.Module, model_dir: Path, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    copy_tokenizer_files(model_dir, out_dir)  # the source's generation_config.json replaces the re-serialised one
    log.info("sft: wrote %s", out_dir)
