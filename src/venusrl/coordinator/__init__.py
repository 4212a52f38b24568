"""Control plane of rollout: the data coordinator, priority policies, length predictors."""

from venusrl.coordinator.config import CoordinatorConfig, PredictorConfig
from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.coordinator.decisions import Decisions, PriorityPolicy
from venusrl.coordinator.policies import RULES, PriorityRule, make_rule

__all__ = [
    "RULES",
    "CoordinatorConfig",
    "DataCoordinator",
    "Decisions",
    "PredictorConfig",
    "PriorityPolicy",
    "PriorityRule",
    "make_rule",
]
