"""`RunInterrupted`: a run that lost what it cannot go on without (the node of its rollout
or trainer actor, every rollout engine) stops with this; `venusrl train` on the same run
directory resumes it from its newest checkpoint."""

from __future__ import annotations

from pathlib import Path


class RunInterrupted(RuntimeError):
    def __init__(self, what: str, run_dir: Path) -> None:
        checkpoints = sorted((run_dir / "checkpoints").glob("step-*"))
        resume = f"its newest checkpoint ({checkpoints[-1].name})" if checkpoints else "the start (no checkpoint yet)"
        super().__init__(f"{what}; the run stopped. `venusrl train` on {run_dir} resumes it from {resume}")
