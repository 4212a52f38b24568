"""venusrl: agentic RL training through multi-turn tool use."""

__version__ = "0.1.0"
