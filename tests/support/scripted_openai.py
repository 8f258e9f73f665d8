"""A scripted OpenAI-compatible chat server on 127.0.0.1 for deterministic loop tests.

Each request to /v1/chat/completions is answered by the next entry of the script: a
message dict (content / tool_calls / reasoning_content), an int HTTP status to fail
with, or a callable taking the request JSON and returning either. Requests are
recorded so tests can assert what the loop sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

Reply = dict[str, Any] | int


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    return {
        "id": call_id or f"call_{uuid.uuid4().hex[:8]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
    }


class ScriptedOpenAIServer:
    def __init__(
        self,
        script: list[Reply | Callable[[dict[str, Any]], Reply]],
        delay_s: float = 0.0,
        models: tuple[str, ...] = ("scripted",),
    ) -> None:
        self.script = list(script)
        # What GET /v1/models lists, as a real server lists the models it serves.
        self.models = models
        self.requests: list[dict[str, Any]] = []
        self.delay_s = delay_s
        self.in_flight = 0
        self.max_in_flight = 0  # most requests the server held at once
        self._runner: web.AppRunner | None = None
        self.port = 0
        # GET /v1/models answers this status when set (a server that is down for its health check too).
        self.models_status: Callable[[], int] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> "ScriptedOpenAIServer":
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        # A reply still sleeping at exit (delay_s) belongs to a request the test gave up on:
        # cancel it at once instead of aiohttp's default minute-long wait for it.
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # started just above, so it has a server
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        status = self.models_status() if self.models_status is not None else 200
        if status != 200:
            return web.json_response({"error": {"message": f"scripted failure {status}"}}, status=status)
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})

    async def _chat(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if not self.script:
            return web.json_response({"error": {"message": "script exhausted"}}, status=500)
        entry = self.script.pop(0)
        reply = entry(body) if callable(entry) else entry
        if isinstance(reply, int):
            return web.json_response({"error": {"message": f"scripted failure {reply}"}}, status=reply)
        message = {"role": "assistant", "content": reply.get("content")}
        if reply.get("tool_calls"):
            message["tool_calls"] = reply["tool_calls"]
        if reply.get("reasoning_content"):
            message["reasoning_content"] = reply["reasoning_content"]
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )


@contextmanager
def serving_in_a_thread(server: ScriptedOpenAIServer) -> Iterator[ScriptedOpenAIServer]:
    """The server on its own event loop in a thread, for a test whose main thread runs a command
    in-process (`tests.support.cli.run_cli` starts its own loop and sets signal handlers)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="scripted-openai", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(30)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
