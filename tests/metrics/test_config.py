import pytest
from pydantic import ValidationError

from venusrl.metrics.config import MetricsConfig


def test_defaults_write_jsonl_only():
    config = MetricsConfig()
    assert (config.tensorboard, config.wandb_project, config.log_every_steps) == (False, None, 1)


def test_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValidationError, match="extra"):
        MetricsConfig(tensorbord=True)
    with pytest.raises(ValidationError, match="log_every_steps"):
        MetricsConfig(log_every_steps=0)
