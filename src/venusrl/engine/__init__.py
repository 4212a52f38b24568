"""Rollout engine: paged KV pool, trajectory-aware radix cache, priority-aware batching."""
