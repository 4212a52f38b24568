"""Request bodies of the OpenAI-compatible API, with venusrl's two extensions
(`priority`, `trajectory_id`), and OpenAI-shaped errors."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from venusrl.engine.request import MAX_TRAJECTORY_ID_CHARS
from venusrl.types import Priority, SamplingParams

_PRIORITY_NAMES = {"promoted": Priority.PROMOTED, "high": Priority.HIGH, "low": Priority.LOW}


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1, description="only n=1 is served")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    priority: int | str | None = Field(None, description="promoted/high/low or 0-2; default: the trajectory's")
    trajectory_id: str | None = Field(None, min_length=1, max_length=MAX_TRAJECTORY_ID_CHARS)

    @field_validator("priority")
    @classmethod
    def _priority(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            _to_priority(value)
        return value

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_new_tokens=self.max_tokens or default_max_tokens, temperature=self.temperature,
            top_p=self.top_p, top_k=self.top_k, seed=self.seed, stop=stop,
        )

    @property
    def priority_level(self) -> Priority | None:
        return None if self.priority is None else _to_priority(self.priority)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none"] | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=0, description="only the sampled token's log-prob is returned")

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs


class CompletionRequest(_Sampling):
    prompt: str | list[int] = Field(min_length=1)
    logprobs: int | None = Field(None, ge=0, le=0, description="0: the sampled token's log-prob")
    echo: bool = Field(False, description="echo of the prompt is not served")

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo=true is not supported")
        return value

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None


def _to_priority(value: int | str) -> Priority:
    if isinstance(value, str):
        if value.lower() not in _PRIORITY_NAMES:
            raise ValueError(f"priority must be one of {', '.join(_PRIORITY_NAMES)} or 0-2")
        return _PRIORITY_NAMES[value.lower()]
    if value not in (0, 1, 2):
        raise ValueError("priority must be one of promoted, high, low or 0-2")
    return Priority(value)


def error_response(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": kind, "param": param, "code": None}},
    )
