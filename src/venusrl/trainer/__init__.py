"""Trainer: GRPO/PPO losses, the streaming trainer, SFT warm start, weight sync."""
