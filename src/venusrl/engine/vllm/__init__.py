"""engine.backend: vllm: vLLM's AsyncLLM under venus's scheduler (backend.py), its arguments, KV connectors, residency tiers, stats and worker extension."""
