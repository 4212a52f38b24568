"""`venusrl serve`'s app on a real uvicorn server on a loopback port, for the tests."""

import asyncio
import contextlib
import socket
import threading

import httpx
import uvicorn

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.server import create_app

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@contextlib.contextmanager
def serving(model_dir, model_name="tiny", kv_capacity_tokens=8192, **app_kwargs):
    """Yields (base URL, engine). The socket listens before the server thread starts, so the
    first request simply queues until uvicorn accepts it: nothing waits on a timer."""
    engine = Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=kv_capacity_tokens, page_size=4))
    async_engine = AsyncEngine(engine)
    app = create_app(async_engine, engine.tokenizer, model_name, api_key=API_KEY, **app_kwargs)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert httpx.get(f"{base}/health", timeout=60).status_code == 200
    try:
        yield base, engine
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        # the engine's thread outlives the server otherwise, stepping (and releasing idle
        # trajectories) beside every later test of the session
        asyncio.run(async_engine.shutdown())
