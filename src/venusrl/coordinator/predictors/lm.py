"""lm: a Hugging Face causal LM with a regression head, fine-tuned on (messages, remaining
tokens) pairs (the paper's predictor, a fine-tuned Qwen3-0.6B). For users with a GPU; the
tests run it on the tiny model.

The head reads the last token's final hidden state and regresses the standardized
log(1 + remaining tokens). A saved predictor is a directory: the fine-tuned model and
tokenizer (Hugging Face format), regression_head.safetensors and predictor.json.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from venusrl.coordinator.predictors.base import PredictorError
from venusrl.coordinator.predictors.query import Example, PredictionQuery

logger = logging.getLogger(__name__)
FORMAT = "venusrl.lm/1"
HEAD_FILE = "regression_head.safetensors"
META_FILE = "predictor.json"


class LmPredictor:
    name = "lm"

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        max_tokens: int = 1024,
        learning_rate: float = 2e-5,
        epochs: int = 2,
        batch_size: int = 8,
        buffer_size: int = 20000,
        seed: int = 0,
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise PredictorError(f"{model_dir}: not a Hugging Face model directory (no config.json)")
        self.device = torch.device(device)
        self.max_tokens = max_tokens
        self.learning_rate = learning_rate
        self.epochs = epochs
        self.batch_size = batch_size
        self.seed = seed
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).to(self.device)
        with torch.random.fork_rng(devices=[]):  # the head's init must not depend on global RNG state
            torch.manual_seed(seed)
            self.head = nn.Linear(self.model.config.hidden_size, 1).to(self.device)
        self.target_mean = 0.0
        self.target_std = 1.0
        self._buffer: deque[Example] = deque(maxlen=buffer_size)
        meta_path = model_dir / META_FILE
        if meta_path.is_file():
            self._load_head(model_dir)
        self.model.eval()

    # ---- inference -------------------------------------------------------------------------

    def predict(self, query: PredictionQuery) -> float:
        return self.predict_many([query])[0]

    @torch.no_grad()
    def predict_many(self, queries: Sequence[PredictionQuery]) -> list[float]:
        out: list[float] = []
        for start in range(0, len(queries), self.batch_size):
            z = self._forward(queries[start : start + self.batch_size])
            log_remaining = z * self.target_std + self.target_mean
            out.extend(torch.clamp(torch.expm1(log_remaining), min=0.0).tolist())
        return out

    # ---- training --------------------------------------------------------------------------

    def observe(self, examples: Sequence[Example]) -> None:
        """Buffers examples; the LM is refit by `fit` at checkpoints (the paper's practice),
        not per trajectory."""
        self._buffer.extend(examples)

    def fit(self, examples: Sequence[Example] = ()) -> list[float]:
        """Fine-tune model and head on the examples (default: the buffered ones); returns the
        mean training loss of each epoch."""
        data = list(examples) or list(self._buffer)
        if len(data) < 2:
            raise PredictorError(f"lm predictor needs at least 2 examples to fit, got {len(data)}")
        targets = torch.tensor([math.log1p(e.remaining_tokens) for e in data])
        self.target_mean = float(targets.mean())
        self.target_std = float(targets.std().clamp(min=1e-3))
        params = list(self.model.parameters()) + list(self.head.parameters())
        optimizer = torch.optim.AdamW(params, lr=self.learning_rate)
        rng = random.Random(self.seed)
        order = list(range(len(data)))
        losses: list[float] = []
        self.model.train()
        try:
            for epoch in range(self.epochs):
                rng.shuffle(order)
                total = 0.0
                for start in range(0, len(order), self.batch_size):
                    batch = [data[i] for i in order[start : start + self.batch_size]]
                    z = self._forward([e.query for e in batch])
                    y = (torch.tensor([math.log1p(e.remaining_tokens) for e in batch], device=self.device)
                         - self.target_mean) / self.target_std
                    loss = nn.functional.mse_loss(z, y)
                    optimizer.zero_grad()
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(params, 1.0)
                    optimizer.step()
                    total += loss.item() * len(batch)
                losses.append(total / len(data))
                logger.info("lm predictor epoch %d: loss %.4f on %d examples", epoch + 1, losses[-1], len(data))
        finally:
            self.model.eval()
        return losses

    # ---- persistence -----------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()}, path / HEAD_FILE)
        (path / META_FILE).write_text(json.dumps({
            "format": FORMAT, "max_tokens": self.max_tokens,
            "target_mean": self.target_mean, "target_std": self.target_std,
        }, indent=2))

    def _load_head(self, path: Path) -> None:
        try:
            meta = json.loads((path / META_FILE).read_text())
        except json.JSONDecodeError as err:
            raise PredictorError(f"{path / META_FILE}:{err.lineno}: invalid JSON ({err.msg})") from None
        if meta.get("format") != FORMAT:
            raise PredictorError(f"{path / META_FILE}: format must be {FORMAT!r}, got {meta.get('format')!r}")
        for key in ("target_mean", "target_std"):
            if not isinstance(meta.get(key), (int, float)):
                raise PredictorError(f"{path / META_FILE}: field {key!r} must be a number")
        if not (path / HEAD_FILE).is_file():
            raise PredictorError(f"{path}: {HEAD_FILE} is missing")
        try:
            self.head.load_state_dict(load_file(path / HEAD_FILE, device=str(self.device)))
        except RuntimeError as err:
            raise PredictorError(f"{path / HEAD_FILE}: does not fit a {self.head.in_features}-wide head ({err})") from None
        self.target_mean = float(meta["target_mean"])
        self.target_std = float(meta["target_std"])

    # ---- internals -------------------------------------------------------------------------

    def _render(self, query: PredictionQuery) -> list[int]:
        messages = list(query.messages) or [{"role": "user", "content": query.prompt_text}]
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        if len(ids) > self.max_tokens:  # keep the task (head) and the latest progress (tail)
            head = self.max_tokens // 2
            ids = ids[:head] + ids[len(ids) - (self.max_tokens - head) :]
        return ids

    def _forward(self, queries: Sequence[PredictionQuery]) -> torch.Tensor:
        rows = [self._render(q) for q in queries]
        width = max(len(r) for r in rows)
        input_ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        last = hidden[torch.arange(len(rows), device=self.device), mask.sum(dim=1) - 1]
        return self.head(last).squeeze(-1)
