"""How many GPUs the Ray actors ask for: one per FSDP rank for the trainer, one for rollout,
sharing a single GPU only when the trainer has one rank."""

import pytest

pytest.importorskip("ray")

from venusrl.config import ConfigError, validate_config  # noqa: E402
from venusrl.runtime.ray_runtime import actor_gpus  # noqa: E402


def _config(device: str, world_size: int = 1):
    return validate_config({"model": {"path": "/models/any", "device": device}, "trainer": {"world_size": world_size}})


@pytest.mark.parametrize(("device", "world_size", "cluster_gpus", "expected"), [
    ("cpu", 1, 0, (0, 0)),
    ("cpu", 2, 8, (0, 0)),
    ("cuda", 1, 1, (0.5, 0.5)),
    ("cuda", 1, 2, (1, 1)),
    ("cuda", 4, 5, (1, 4)),
])
def test_actor_gpus(device, world_size, cluster_gpus, expected):
    assert actor_gpus(_config(device, world_size), cluster_gpus) == expected


def test_a_sharded_trainer_without_enough_gpus_is_a_config_error():
    with pytest.raises(ConfigError, match=r"trainer.world_size=2 needs 3 GPUs .* it has 2"):
        actor_gpus(_config("cuda", 2), 2)
