"""The progress display of `venusrl train`: a bar over optimizer steps whose line carries
the figures a user watches (reward, groups ready, tokens/s, KV hit rate, sandboxes)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class TrainingProgress:
    def __init__(self, total_steps: int, done_steps: int = 0, enabled: bool = True) -> None:
        self._progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("{task.description}"), console=Console(stderr=True), disable=not enabled)
        self._task = self._progress.add_task("starting", total=total_steps, completed=done_steps)
        self._figures = ""
        self._groups = 0
        self._reward_sum = 0.0

    def __enter__(self) -> TrainingProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def note(self, text: str) -> None:
        self._progress.update(self._task, description=text)

    def group_trained(self, reward_mean: float) -> None:
        self._groups += 1
        self._reward_sum += reward_mean
        self.note(f"{self._figures} | {self._groups} groups in batch, reward {self._reward_sum / self._groups:.3f}")

    def stepped(self, step: int, record: dict) -> None:
        self._groups, self._reward_sum = 0, 0.0
        self._figures = (f"reward {record['reward_mean']:.3f}  ready {record.get('groups_ready', 0)}  "
                         f"tok/s {record['tokens_per_s']:.0f}  KV hit {record.get('kv_hit_rate', 0.0):.2f}"
                         + (f"  sandboxes {record['sandboxes_live']}" if "sandboxes_live" in record else ""))
        self._progress.update(self._task, completed=step, description=self._figures)
