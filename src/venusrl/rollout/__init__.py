"""Rollout: agent loops, the rollout worker's action-level scheduling, orchestration."""
