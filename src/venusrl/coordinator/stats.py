"""Running estimates the priority rule converts predicted tokens into time with."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RunningStats:
    """Exponential moving averages, each starting from its configured prior.

    seconds_per_token is the decode time of one token (the paper's Observation 1: it is
    nearly constant under a saturated, asynchronous pipeline); tool_seconds the duration of
    one tool call; tokens_per_turn the generated tokens of one turn; total_tokens the
    generated tokens of one finished trajectory.
    """

    seconds_per_token: float
    tool_seconds: float
    tokens_per_turn: float
    total_tokens: float
    smoothing: float

    def _mix(self, old: float, sample: float) -> float:
        return old + self.smoothing * (sample - old)

    def observe_turn(self, generated: int, seconds: float) -> None:
        if generated > 0:
            self.tokens_per_turn = self._mix(self.tokens_per_turn, generated)
            if seconds > 0:
                self.seconds_per_token = self._mix(self.seconds_per_token, seconds / generated)

    def observe_tool(self, seconds: float) -> None:
        if seconds >= 0:
            self.tool_seconds = self._mix(self.tool_seconds, seconds)

    def observe_finished(self, generated: int) -> None:
        self.total_tokens = self._mix(self.total_tokens, generated)
