"""`venusrl serve`: OpenAI-compatible HTTP API over the engine.

Endpoints: /v1/chat/completions (tools in, tool_calls out, reasoning_content, streaming,
logprobs), /v1/completions, /v1/models, /health, /stats, and POST
/v1/trajectories/{id}/release. Extensions in the body: `priority` (promoted/high/low or 0-2),
`trajectory_id` (released by that route, or by the engine's idle TTL) and
`chat_template_kwargs`. A client that disconnects aborts its request. /health answers 503
once the engine is dead, so a supervisor restarts the process.

Anything a client sends gets a 4xx in OpenAI's error shape, never a 500: bodies are bounded
in openai_protocol.py, rendering failures name the message, and the parser's own errors are
reshaped here. A streamed reply's deltas add up to the non-streamed reply (model/turn_stream.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from venusrl.engine.async_engine import EngineStopped, RequestFailed
from venusrl.engine.client import EngineClient
from venusrl.engine.engine import RequestOutput
from venusrl.engine.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    error_response,
    param_of,
    validation_error_response,
)
from venusrl.model.chat import ChatTokenizer
from venusrl.model.tool_formats.base import ParsedTurn
from venusrl.model.turn_stream import TurnStream, final_turn, prompt_opens_reasoning

log = logging.getLogger(__name__)


class _TextView:
    """The text a client sees of an output: stop token dropped, cut at a stop string, and
    while streaming, held back where a stop string or a UTF-8 character might be incomplete."""

    def __init__(self, tokenizer: ChatTokenizer, stop_ids: tuple[int, ...], stop: tuple[str, ...]):
        self.tokenizer, self.stop_ids, self.stop = tokenizer, stop_ids, stop

    def full(self, output: RequestOutput) -> str:
        ids = output.output_ids
        if ids and ids[-1] in self.stop_ids and output.finish_reason == "stop":
            ids = ids[:-1]
        text = self.tokenizer.decode(ids)
        cuts = [text.index(s) for s in self.stop if s in text]
        return text[: min(cuts)] if cuts else text

    def so_far(self, output: RequestOutput) -> str:
        text = self.full(output)
        if output.finished:
            return text
        hold = max((len(s) - 1 for s in self.stop), default=0)
        text = text[: len(text) - hold] if hold else text
        return text.rstrip("\ufffd")  # an incomplete UTF-8 sequence


@dataclass(slots=True)
class _Chat:
    """What a chat request adds to serving: its tools and whether its prompt opened a think block."""

    tools: list[dict[str, Any]] | None
    opened: bool


def create_app(
    engine: EngineClient, tokenizer: ChatTokenizer, model_name: str, api_key: str | None = None,
    default_max_tokens: int = 512,
) -> FastAPI:
    app = FastAPI(title="venusrl engine")
    _install_error_handlers(app)
    info = engine.info()  # the engine may be in another process: nothing here reaches into it
    context_tokens = min(info.max_position_embeddings, info.kv_capacity_tokens)

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        protected = request.url.path.startswith("/v1") or request.url.path == "/stats"
        if api_key and protected and request.headers.get("authorization") != f"Bearer {api_key}":
            return error_response(401, "invalid or missing API key", kind="authentication_error", code="invalid_api_key")
        return await call_next(request)

    @app.get("/health")
    async def health():
        health = await engine.health()
        if not health.alive:
            return JSONResponse({"status": "dead", "error": health.error}, status_code=503)
        return {"status": "ok", "weight_version": health.weight_version, "restarts": health.restarts}


    @app.post("/v1/trajectories/{trajectory_id}/release")
    async def release_trajectory(trajectory_id: str):
        try:
            known = await engine.release_trajectory(trajectory_id)
        except ValueError as err:
            return error_response(400, str(err), param="trajectory_id")
        if not known:
            return error_response(404, f"trajectory {trajectory_id[:64]!r} is not live (released, expired or never "
                                  "started)", param="trajectory_id", kind="not_found_error")
        return {"id": trajectory_id, "object": "trajectory", "released": True}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return (await engine.stats()).to_dict()


    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "venusrl"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        if (refused := _unknown_model(body.model)) is not None:
            return refused
        tools = None if body.tool_choice == "none" else body.tools
        try:
            prompt = tokenizer.render(body.messages, tools, add_generation_prompt=True,
                                      template_kwargs=body.chat_template_kwargs)
            prompt_ids = tokenizer.encode(prompt)
        except (ValueError, TypeError) as err:
            return error_response(400, str(err), param=param_of(str(err)) or "messages")
        return await _serve(request, body, prompt_ids, _Chat(tools, prompt_opens_reasoning(prompt)))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        if (refused := _unknown_model(body.model)) is not None:
            return refused
        prompt_ids = body.prompt if isinstance(body.prompt, list) else tokenizer.encode(body.prompt)
        return await _serve(request, body, prompt_ids, None)

    def _unknown_model(name: str | None) -> JSONResponse | None:
        if name is None or name == model_name:
            return None
        return error_response(404, f"The model `{name}` does not exist or you do not have access to it.",
                              param="model", code="model_not_found")

    def _max_new_tokens(prompt_len: int, requested: int | None, chat: bool) -> tuple[int, JSONResponse | None]:
        """Tokens the turn may generate: what was asked for, within the context (the model's
        positions and the KV pool: a request larger than the pool could never be served)."""
        room = context_tokens - prompt_len
        if room < 1:
            message = f"the prompt is {prompt_len} tokens; this model's context is {context_tokens} tokens"
            return 0, error_response(400, message, param="messages" if chat else "prompt")
        if requested is None:
            return min(default_max_tokens, room), None
        if requested > room:
            message = (f"max_tokens: {prompt_len} prompt tokens + {requested} exceed this model's context of "
                       f"{context_tokens} tokens")
            return 0, error_response(400, message, param="max_tokens")
        return requested, None

    async def _serve(request: Request, body, prompt_ids: list[int], chat: _Chat | None):
        max_new_tokens, refused = _max_new_tokens(len(prompt_ids), body.requested_max_tokens, chat is not None)
        if refused is not None:
            return refused
        sampling = body.sampling_params(max_new_tokens)
        try:
            outputs = engine.generate(prompt_ids, sampling, body.priority_level, body.trajectory_id)
            first = await anext(outputs)
        except ValueError as err:
            return error_response(400, str(err), param="messages" if chat else "prompt")
        except EngineStopped as err:
            return error_response(503, str(err), kind="server_error")
        completion_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        view = _TextView(tokenizer, info.eos_token_ids, sampling.stop)
        log.info("%s: %d prompt tokens, priority %s, trajectory %s, stream=%s", completion_id, len(prompt_ids),
                 body.priority, body.trajectory_id, body.stream)
        if body.stream:
            return StreamingResponse(_stream(completion_id, first, outputs, view, body, chat, len(prompt_ids)),
                                     media_type="text/event-stream")
        final = await _until_finished(request, first, outputs)
        if final is None:
            return error_response(499, "client disconnected", kind="client_closed_request")
        return _response(completion_id, final, view, body, chat, len(prompt_ids))

    async def _stream(completion_id, first, outputs, view, body, chat: _Chat | None, prompt_len) -> AsyncIterator[str]:
        base = {"id": completion_id, "created": int(time.time()), "model": model_name,
                "object": "chat.completion.chunk" if chat else "text_completion"}

        def chunk(delta: dict[str, Any], finish: str | None = None, logprobs=None) -> str:
            choice = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
            if chat:
                choice["delta"] = delta
            else:
                choice["text"] = delta.get("content", "")
            return f"data: {json.dumps({**base, 'choices': [choice]}, ensure_ascii=False)}\n\n"

        turn_stream = TurnStream(chat.tools, tokenizer.tool_format, chat.opened) if chat else None
        sent = ""  # of a completion's text
        if chat:
            yield chunk({"role": "assistant", "content": ""})
        output = first
        try:
            while True:
                text = view.so_far(output)
                if turn_stream is not None:
                    delta = _delta(*turn_stream.update(text))
                else:
                    piece = text[len(sent) :] if text.startswith(sent) else ""
                    delta, sent = {"content": piece}, sent + piece
                logprobs = (_logprobs(tokenizer, output.new_token_ids, output.new_logprobs, chat is not None)
                            if body.wants_logprobs else None)
                if any(delta.values()) or logprobs:
                    yield chunk(delta, logprobs=logprobs)
                if output.finished:
                    break
                output = await anext(outputs)
        except (EngineStopped, RequestFailed) as err:
            yield f"data: {json.dumps({'error': {'message': str(err), 'type': 'server_error'}})}\n\n"
            return
        finish = _finish_reason(output)
        if turn_stream is not None:
            turn, reasoning, content = turn_stream.finish(view.full(output), _call_prefix(completion_id))
            if reasoning or content:
                yield chunk(_delta(reasoning, content))
            for index, call in enumerate(turn.tool_calls):
                yield chunk({"tool_calls": [{"index": index, **call}]})
            if turn.tool_calls and finish == "stop":
                finish = "tool_calls"
        yield chunk({}, finish=finish)
        if body.include_usage:
            usage = _usage(prompt_len, len(output.output_ids))
            yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    def _response(completion_id, output, view, body, chat: _Chat | None, prompt_len) -> dict[str, Any]:
        text, finish = view.full(output), _finish_reason(output)
        base = {"id": completion_id, "created": int(time.time()), "model": model_name,
                "usage": _usage(prompt_len, len(output.output_ids)),
                "weight_versions": sorted(set(output.weight_versions))}
        logprobs = (_logprobs(tokenizer, output.output_ids, output.logprobs, chat is not None)
                    if body.wants_logprobs else None)
        if chat is None:
            return {**base, "object": "text_completion",
                    "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}]}
        turn = final_turn(text, chat.tools, tokenizer.tool_format, chat.opened, _call_prefix(completion_id))
        if turn.tool_calls and finish == "stop":
            finish = "tool_calls"
        return {**base, "object": "chat.completion",
                "choices": [{"index": 0, "message": _message(turn), "finish_reason": finish, "logprobs": logprobs}]}

    return app


def _install_error_handlers(app: FastAPI) -> None:
    """OpenAI's error shape for what FastAPI would answer in its own: validation and JSON
    parser errors (400, not 422), unknown routes and methods; a stopped engine is a 503 (on
    /stats too), any other server fault a 500."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, err: RequestValidationError) -> JSONResponse:
        return validation_error_response(list(err.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, err: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
        return error_response(err.status_code, str(err.detail), code=code)

    @app.exception_handler(EngineStopped)
    async def engine_stopped(_: Request, err: EngineStopped) -> JSONResponse:
        return error_response(503, str(err), kind="server_error", code="engine_stopped")

    @app.exception_handler(RequestFailed)
    async def request_failed(_: Request, err: RequestFailed) -> JSONResponse:  # alone: the engine serves on
        return error_response(500, str(err), kind="server_error", code="request_failed")

    @app.exception_handler(Exception)
    async def server_fault(request: Request, err: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, f"internal error ({type(err).__name__})", kind="server_error")


def _call_prefix(completion_id: str) -> str:
    return f"call_{completion_id[-8:]}"


def _delta(reasoning: str, content: str) -> dict[str, str]:
    delta = {"reasoning_content": reasoning} if reasoning else {}
    return {**delta, "content": content}


def _message(turn: ParsedTurn) -> dict[str, Any]:
    """The reply's message: content None beside tool calls when the turn wrote no text."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.content or (None if turn.tool_calls else "")}
    if turn.reasoning_content is not None:
        message["reasoning_content"] = turn.reasoning_content
    if turn.tool_calls:
        message["tool_calls"] = turn.tool_calls
    return message


async def _until_finished(request: Request, first: RequestOutput, outputs: AsyncIterator[RequestOutput]) -> RequestOutput | None:
    """The final output, or None when the client went away first (the request is aborted)."""
    if first.finished:
        return first

    async def last() -> RequestOutput:
        output = first
        async for output in outputs:  # noqa: B007 (the last one is the answer)
            pass
        return output

    task = asyncio.ensure_future(last())
    while not task.done():
        await asyncio.wait({task}, timeout=0.25)
        if not task.done() and await request.is_disconnected():
            task.cancel()  # the generator's cleanup aborts the request and frees its KV
            await asyncio.gather(task, return_exceptions=True)
            return None
    return task.result()


def _finish_reason(output: RequestOutput) -> str:
    return "length" if output.finish_reason == "length" else "stop"


def _usage(prompt_len: int, completion_len: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_len, "completion_tokens": completion_len, "total_tokens": prompt_len + completion_len}


def _logprobs(tokenizer: ChatTokenizer, ids: list[int], logprobs: list[float], chat: bool) -> dict[str, Any]:
    """Each token's text and its own bytes (a token holding part of a UTF-8 character has
    bytes that decode to nothing alone; concatenated they are the text's bytes)."""
    tokens = [tokenizer.decode([i]) for i in ids]
    if chat:
        return {"content": [{"token": t, "logprob": lp, "bytes": list(tokenizer.token_bytes(i)), "top_logprobs": []}
                            for i, t, lp in zip(ids, tokens, logprobs, strict=True)]}
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None, "text_offset": None}
