"""Request bodies of the OpenAI-compatible API, with venusrl's extensions (`priority`,
`trajectory_id`, `chat_template_kwargs`), and OpenAI-shaped errors.

Every field is bounded here, so that nothing a client sends reaches the engine's step
unchecked: a value the sampler cannot use (a temperature that underflows the softmax, a seed
past 64 bits, a penalty we do not apply) is a 400 naming the field, not an engine failure.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from venusrl.engine.request import MAX_TRAJECTORY_ID_CHARS
from venusrl.types import Priority, SamplingParams

_PRIORITY_NAMES = {"promoted": Priority.PROMOTED, "high": Priority.HIGH, "low": Priority.LOW}
MIN_TEMPERATURE = 0.01  # below it (and above 0) logits / T overflow float32: use 0 for greedy
MAX_SEED = 2**63 - 1  # the engine offsets a seed per token; torch seeds are 64-bit
MAX_TOKENS = 1 << 20
MAX_STOP = 4
# Arguments apply_chat_template itself takes: a template kwarg by one of these names would
# collide with them.
RESERVED_TEMPLATE_KWARGS = frozenset({"conversation", "messages", "tools", "documents", "chat_template",
                                      "add_generation_prompt", "continue_final_message", "tokenize", "padding",
                                      "truncation", "max_length", "return_tensors", "return_dict",
                                      "return_assistant_tokens_mask", "tokenizer_kwargs"})


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: StrictBool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: StrictInt | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False, description="0: greedy; default 1")
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: StrictInt | None = Field(None, ge=-1, le=MAX_TOKENS, description="0 or -1: no top-k cut")
    seed: StrictInt | None = Field(None, ge=0, le=MAX_SEED)
    presence_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0, le=2, allow_inf_nan=False)
    stop: str | list[str] | None = None
    n: StrictInt = Field(1, ge=1, le=1, description="only n=1 is served")
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    priority: StrictInt | str | None = Field(None, description="promoted/high/low or 0-2; default: the trajectory's")
    trajectory_id: str | None = Field(None, min_length=1, max_length=MAX_TRAJECTORY_ID_CHARS)

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = _lone_surrogate(data, "")
        if where is not None:
            raise ValueError(f"{where or 'body'}: a lone UTF-16 surrogate escape is not valid Unicode")
        return data

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float | None) -> float | None:
        if value is not None and 0 < value < MIN_TEMPERATURE:
            raise ValueError(f"must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {value!r}")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("only 0 is served (the engine applies no penalties)")
        return value

    @field_validator("repetition_penalty")
    @classmethod
    def _no_repetition_penalty(cls, value: float | None) -> float | None:
        if value is not None and value != 1:
            raise ValueError("only 1 is served (the engine applies no penalties)")
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("a stop string must not be empty")
        return value

    @field_validator("priority")
    @classmethod
    def _priority(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            _to_priority(value)
        return value

    def sampling_params(self, max_new_tokens: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_new_tokens=max_new_tokens, temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=max(0, self.top_k or 0), seed=self.seed, stop=stop,
        )

    @property
    def priority_level(self) -> Priority | None:
        return None if self.priority is None else _to_priority(self.priority)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none"] | dict[str, Any] | None = None
    max_completion_tokens: StrictInt | None = Field(None, ge=1, le=MAX_TOKENS)
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=0, description="only the sampled token's log-prob is returned")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="keyword arguments of the chat template for this request, e.g. {enable_thinking: false}")

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        clash = sorted(set(value or ()) & RESERVED_TEMPLATE_KWARGS)
        if clash:
            raise ValueError(f"{clash[0]!r} is an argument of the template call itself, not a template variable")
        return value

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[StrictInt] = Field(min_length=1)
    logprobs: StrictInt | None = Field(None, ge=0, le=0, description="0: the sampled token's log-prob")
    echo: StrictBool = Field(False, description="echo of the prompt is not served")

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo=true is not supported")
        return value

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


def _to_priority(value: int | str) -> Priority:
    if isinstance(value, str):
        if value.lower() not in _PRIORITY_NAMES:
            raise ValueError(f"priority must be one of {', '.join(_PRIORITY_NAMES)} or 0-2")
        return _PRIORITY_NAMES[value.lower()]
    if value not in (0, 1, 2):
        raise ValueError("priority must be one of promoted, high, low or 0-2")
    return Priority(value)


def _lone_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string (key or value) holding a lone surrogate, or None.
    Iterative: a deeply nested body must not exhaust the stack."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if any("\ud800" <= c <= "\udfff" for c in item):
                return where
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                name = str(key).encode("utf-8", "backslashreplace").decode()  # the path must be encodable
                child_path = f"{where}.{name}" if where else name
                stack += [(child, child_path), (key, child_path)]
        elif isinstance(item, list):
            stack += [(child, f"{where}[{i}]") for i, child in reversed(list(enumerate(item)))]
    return None


def error_response(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                   code: str | None = None) -> JSONResponse:
    """OpenAI's error body. The message is made safe to encode (a client's lone surrogate
    must not turn a 400 into a failure to write the 400)."""
    safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse(
        status_code=status,
        content={"error": {"message": safe, "type": kind, "param": param, "code": code}},
    )


_PATH_PREFIX = re.compile(r"^((?:messages|tools|prompt)(?:\[\d+\])?(?:\.\w+|\[\d+\])*): ")


def param_of(message: str) -> str | None:
    """The field an error message opens with ('messages[2].content: ...'), if it does."""
    match = _PATH_PREFIX.match(message)
    return match.group(1) if match else None


def validation_error_response(errors: list[dict[str, Any]]) -> JSONResponse:
    """A 400 for the first problem pydantic or the JSON parser found, naming its field."""
    first = errors[0]
    loc = [p for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        position = loc[0] if loc and isinstance(loc[0], int) else None
        where = f" at character {position}" if position is not None else ""
        return error_response(400, f"the body is not valid JSON ({detail}{where})")
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or None
    text = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    param = param or param_of(text)
    if param and not text.startswith(param):
        text = f"{param}: {text}"
    if first.get("type") == "missing" and not loc:
        text = "a JSON object body is required"
    return error_response(400, text, param=param)
