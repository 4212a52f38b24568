"""`venusrl serve`: OpenAI-compatible HTTP API over the engine.

Endpoints: /v1/chat/completions (tools in, tool_calls out, streaming, logprobs),
/v1/completions, /v1/models, /health, /stats, and POST /v1/trajectories/{id}/release.
Extensions in the body: `priority` (promoted/high/low or 0-2) and `trajectory_id` (released
by that route, or by the engine's idle TTL). A client that disconnects aborts its request.
/health answers 503 once the engine is dead, so a supervisor restarts the process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from venusrl.engine.async_engine import AsyncEngine, EngineStopped, RequestFailed
from venusrl.engine.engine import RequestOutput
from venusrl.engine.openai_protocol import ChatCompletionRequest, CompletionRequest, error_response
from venusrl.model.chat import ChatTokenizer
from venusrl.model.tool_calls import OPEN, parse_tool_calls

log = logging.getLogger(__name__)


class _TextView:
    """The text a client sees of an output: stop token dropped, cut at a stop string, and
    while streaming, held back where a stop string or a tool call might be starting."""

    def __init__(self, tokenizer: ChatTokenizer, stop_ids: tuple[int, ...], stop: tuple[str, ...]):
        self.tokenizer, self.stop_ids, self.stop = tokenizer, stop_ids, stop
        self.sent = ""

    def full(self, output: RequestOutput) -> str:
        ids = output.output_ids
        if ids and ids[-1] in self.stop_ids and output.finish_reason == "stop":
            ids = ids[:-1]
        text = self.tokenizer.decode(ids)
        cuts = [text.index(s) for s in self.stop if s in text]
        return text[: min(cuts)] if cuts else text

    def streamable_delta(self, output: RequestOutput) -> str:
        text = self.full(output)
        if not output.finished:
            hold = max((len(s) - 1 for s in self.stop), default=0)
            text = text[: len(text) - hold] if hold else text
            text = text.rstrip("\ufffd")  # an incomplete UTF-8 sequence
        if OPEN in text:
            text = text[: text.index(OPEN)]
        delta = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent += delta
        return delta


def create_app(
    engine: AsyncEngine, tokenizer: ChatTokenizer, model_name: str, api_key: str | None = None,
    default_max_tokens: int = 512,
) -> FastAPI:
    app = FastAPI(title="venusrl engine")

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1") and request.headers.get("authorization") != f"Bearer {api_key}":
            return error_response(401, "invalid or missing API key", kind="authentication_error")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if p != "body")
        return error_response(400, f"{param}: {first['msg']}", param=param or None)

    @app.exception_handler(EngineStopped)
    async def engine_stopped(_: Request, err: EngineStopped) -> JSONResponse:
        return error_response(503, str(err), kind="server_error")

    @app.exception_handler(RequestFailed)
    async def request_failed(_: Request, err: RequestFailed) -> JSONResponse:  # alone: the engine serves on
        return error_response(500, str(err), kind="server_error")

    @app.get("/health")
    async def health():
        if not engine.alive:
            return JSONResponse({"status": "dead", "error": str(engine.error)}, status_code=503)
        version = await engine.acall(lambda e: e.weight_version)
        return {"status": "ok", "weight_version": version, "restarts": engine.restarts}

    @app.post("/v1/trajectories/{trajectory_id}/release")
    async def release_trajectory(trajectory_id: str):
        try:
            known = await engine.acall(lambda e: e.release_trajectory(trajectory_id))
        except ValueError as err:
            return error_response(400, str(err), param="trajectory_id")
        if not known:
            return error_response(404, f"trajectory {trajectory_id[:64]!r} is not live (released, expired or never "
                                  "started)", param="trajectory_id", kind="not_found_error")
        return {"id": trajectory_id, "object": "trajectory", "released": True}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return await engine.acall(lambda e: e.stats())

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "venusrl"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        tools = None if body.tool_choice == "none" else body.tools
        try:
            prompt_ids = tokenizer.encode_chat(body.messages, tools)
        except (ValueError, TypeError) as err:
            return error_response(400, str(err), param="messages")
        if body.max_completion_tokens:
            body.max_tokens = body.max_completion_tokens
        return await _serve(request, body, prompt_ids, chat=True, tools=tools)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        prompt_ids = body.prompt if isinstance(body.prompt, list) else tokenizer.encode(body.prompt)
        return await _serve(request, body, prompt_ids, chat=False, tools=None)

    async def _serve(request: Request, body, prompt_ids: list[int], chat: bool, tools):
        sampling = body.sampling_params(default_max_tokens)
        try:
            outputs = engine.generate(prompt_ids, sampling, body.priority_level, body.trajectory_id)
            first = await anext(outputs)
        except ValueError as err:
            return error_response(400, str(err), param="prompt" if not chat else "messages")
        except EngineStopped as err:
            return error_response(503, str(err), kind="server_error")
        completion_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        view = _TextView(tokenizer, engine.engine.eos_token_ids, sampling.stop)
        log.info("%s: %d prompt tokens, priority %s, trajectory %s, stream=%s", completion_id, len(prompt_ids),
                 body.priority, body.trajectory_id, body.stream)
        if body.stream:
            return StreamingResponse(
                _stream(completion_id, first, outputs, view, body, chat, tools, len(prompt_ids)),
                media_type="text/event-stream",
            )
        final = await _until_finished(request, first, outputs)
        if final is None:
            return error_response(499, "client disconnected", kind="client_closed_request")
        return _response(completion_id, final, view, body, chat, tools, len(prompt_ids))

    async def _stream(completion_id, first, outputs, view, body, chat, tools, prompt_len) -> AsyncIterator[str]:
        created = int(time.time())
        base = {"id": completion_id, "created": created, "model": model_name,
                "object": "chat.completion.chunk" if chat else "text_completion"}

        def chunk(payload: dict[str, Any], finish: str | None = None, logprobs=None) -> str:
            choice = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"], choice["logprobs"] = payload, logprobs
            else:
                choice["text"], choice["logprobs"] = payload.get("content", ""), logprobs
            return f"data: {json.dumps({**base, 'choices': [choice]}, ensure_ascii=False)}\n\n"

        if chat:
            yield chunk({"role": "assistant", "content": ""})
        output = first
        try:
            while True:
                delta = view.streamable_delta(output)
                logprobs = None
                if body.wants_logprobs:
                    logprobs = _logprobs(tokenizer, output.new_token_ids, output.new_logprobs, chat)
                if delta or logprobs:
                    yield chunk({"content": delta}, logprobs=logprobs)
                if output.finished:
                    break
                output = await anext(outputs)
        except (EngineStopped, RequestFailed) as err:
            yield f"data: {json.dumps({'error': {'message': str(err), 'type': 'server_error'}})}\n\n"
            return
        finish = _finish_reason(output)
        # text held back (a possible tool call or stop string) is sent now; well-formed tool
        # calls go out as tool_calls deltas, anything else stays content
        content, calls = view.full(output), []
        if chat and tools:
            parsed = parse_tool_calls(content, tools, id_prefix=f"call_{completion_id[-8:]}")
            if parsed.tool_calls:
                content, calls = parsed.content, parsed.tool_calls
        sent = view.sent if content.startswith(view.sent) else view.sent.strip()
        if content.startswith(sent) and content[len(sent):]:
            yield chunk({"content": content[len(sent):]})
        for index, call in enumerate(calls):
            yield chunk({"tool_calls": [{"index": index, **call}]})
        if calls and finish == "stop":
            finish = "tool_calls"
        yield chunk({}, finish=finish)
        if body.include_usage:
            usage = _usage(prompt_len, len(output.output_ids))
            yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    def _response(completion_id, output, view, body, chat, tools, prompt_len) -> dict[str, Any]:
        text, finish = view.full(output), _finish_reason(output)
        usage = _usage(prompt_len, len(output.output_ids))
        base = {"id": completion_id, "created": int(time.time()), "model": model_name, "usage": usage,
                "weight_versions": sorted(set(output.weight_versions))}
        logprobs = _logprobs(tokenizer, output.output_ids, output.logprobs, chat) if body.wants_logprobs else None
        if not chat:
            return {**base, "object": "text_completion",
                    "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}]}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if tools:
            parsed = parse_tool_calls(text, tools, id_prefix=f"call_{completion_id[-8:]}")
            if parsed.tool_calls:
                message = {"role": "assistant", "content": parsed.content or None, "tool_calls": parsed.tool_calls}
                finish = "tool_calls" if finish == "stop" else finish
        return {**base, "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}]}

    return app


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
    tokens = [tokenizer.decode([i]) for i in ids]
    if chat:
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                            for t, lp in zip(tokens, logprobs, strict=True)]}
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None, "text_offset": None}
