"""The calculator environment with a reward that is a hash of the conversation's text: a
group's trajectories (sampled, so different) score differently even from an untrained model,
so every group carries advantages and a training step moves the weights."""

from __future__ import annotations

import json
import zlib

from venusrl.env import calculator
from venusrl.env.base import Episode


class HashedRewardEnv(calculator.CalculatorEnv):
    generate_dataset = staticmethod(calculator.generate_dataset)

    def reward(self, episode: Episode) -> float:
        return zlib.crc32(json.dumps(episode.messages, sort_keys=True).encode()) / 2**32
