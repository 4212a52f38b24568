"""Print a model's held-out episodes on the demo task: the question, the answer, and each
message after the system prompt (tool calls included), greedy and sampled, through the
evaluation's own loop (a scorer that records every episode it is asked to score).

    python results/demo-teacher/episodes.py MODEL_DIR SEED [N_PROBLEMS]
"""

import sys
from pathlib import Path

from venusrl.config import load_config
from venusrl.coordinator.dataset import prompt_from_row
from venusrl.demo import make_splits
from venusrl.runtime.evaluation import evaluate_model

if __name__ == "__main__":
    model_dir, seed = Path(sys.argv[1]), int(sys.argv[2])
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    config = load_config("examples/demo.yaml", [f"run.seed={seed}"])
    rows = make_splits(config).held_out[:count]
    prompts = [prompt_from_row(dict(row), f"held-out row {i}", f"held-out-{i}") for i, row in enumerate(rows)]
    episodes = []

    def record(episode) -> bool:
        episodes.append(episode)
        return True

    evaluate_model(model_dir, config, prompts, samples=1, seed=seed, scorers={"recorded": record})
    for episode in episodes:
        print(episode.row["question"], "=>", episode.row["answer"])
        for message in episode.messages[1:]:
            print("   ", message["role"], repr(message.get("content")), message.get("tool_calls") or "")
