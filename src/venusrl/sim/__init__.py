"""Discrete-event cluster simulator: the real coordinator, policies, engine scheduler and
radix cache, with a cost model in place of the forward pass and the sandbox."""
