"""RUN_DIR/trained.jsonl: which prompts each optimizer step trained.

One line per step, `{"step", "weight_version", "prompt_ids"}`. On resume, lines past the
checkpoint's step are removed: those steps died with the process and their groups are
trained again, so the ledger always agrees with the checkpointed weights (each prompt
appears once per epoch)."""

from __future__ import annotations

import json
from pathlib import Path

from venusrl.durable import append_durable, write_atomic

LEDGER_FILE = "trained.jsonl"  # in the run directory


class TrainedLedger:
    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, step: int, weight_version: int, prompt_ids: list[str]) -> None:
        append_durable(self.path, json.dumps({"step": step, "weight_version": weight_version,
                                              "prompt_ids": prompt_ids}) + "\n")

    def truncate_after(self, step: int) -> None:
        """Atomic: a kill during the rewrite leaves the old ledger, never a half one."""
        kept = [entry for entry in self.entries() if entry["step"] <= step]
        write_atomic(self.path, "".join(json.dumps(entry) + "\n" for entry in kept))

    def entries(self) -> list[dict]:
        """Complete lines only: a line torn by a kill is not a step that happened."""
        if not self.path.exists():
            return []
        entries = []
        for line in self.path.read_text().splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return entries
