"""Tool environments: what a trajectory talks to between generation turns."""
