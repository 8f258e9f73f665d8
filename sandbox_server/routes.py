"""The HTTP face of a SandboxServer: bearer-token check, routes, error bodies, the NDJSON batch stream."""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web

from sandbox_server.errors import RequestError
from sandbox_server.server import SandboxServer

__all__ = ["build_app"]

log = logging.getLogger("sandbox_server")


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"error": message, "kind": kind}, status=status)


def build_app(server: SandboxServer) -> web.Application:
    @web.middleware
    async def guard(request: web.Request, handler):
        if not server.authorized(request):
            return _error(401, "unauthorized", "missing or wrong bearer token; send 'Authorization: Bearer <token>'")
        try:
            return await handler(request)
        except RequestError as exc:
            return _error(exc.status, exc.kind, str(exc))
        except FileNotFoundError as exc:
            return _error(404, "not_found", str(exc))
        except (IsADirectoryError, NotADirectoryError) as exc:
            return _error(400, "is_directory", str(exc))

    async def json_body(request: web.Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RequestError(400, "bad_request", "the body must be a JSON object") from None
        if not isinstance(body, dict):
            raise RequestError(400, "bad_request", "the body must be a JSON object")
        return body

    async def health(request):
        return web.json_response(server.health())

    async def exec_(request):
        slot = server._slot(request.match_info["slot"])
        return web.json_response(await server.exec(slot, await json_body(request)))

    async def reset(request):
        return web.json_response(await server.reset(server._slot(request.match_info["slot"])))

    async def interrupt(request):
        return web.json_response(await server.interrupt(server._slot(request.match_info["slot"])))

    async def get_file(request):
        slot = server._slot(request.match_info["slot"])
        data = await server.read_file(slot, request.query.get("path", ""))
        return web.Response(body=data, content_type="application/octet-stream")

    async def put_file(request):
        slot = server._slot(request.match_info["slot"])
        data = await request.read()
        return web.json_response(await server.write_file(slot, request.query.get("path", ""), data))

    async def artifacts(request):
        slot = server._slot(request.match_info["slot"])
        listing = await server.list_artifacts(slot, request.query.get("path", "."))
        return web.json_response(listing)

    async def archive(request):
        slot = server._slot(request.match_info["slot"])
        data = await server.archive(slot, request.query.get("path", "."))
        return web.Response(body=data, content_type="application/gzip")

    async def batch(request):
        body = await json_body(request)
        calls = body.get("calls")
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise RequestError(400, "bad_request", "'calls' must be a list of objects")

        async def one(i: int, call: dict) -> bytes:
            try:
                line = {"index": i, "ok": True, "result": await server.batch_call(call)}
            except RequestError as exc:
                line = {"index": i, "ok": False, "status": exc.status, "kind": exc.kind, "error": str(exc)}
            except Exception as exc:  # noqa: BLE001 - one bad call must never break the others' stream
                log.exception("batch call %d failed", i)
                line = {
                    "index": i,
                    "ok": False,
                    "status": 500,
                    "kind": "internal",
                    "error": f"{type(exc).__name__}: {exc}",
                }
            return (json.dumps(line) + "\n").encode()

        if len(calls) == 1:  # the usual case (a lone tool call): one line, one write, no tasks
            return web.Response(body=await one(0, calls[0]), content_type="application/x-ndjson")
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        # Lines go out as calls finish, so a slow command does not hold back quick ones; the lines
        # of calls that finish in the same turn of the loop go out as one write (one wake-up for
        # the client, not one each).
        finished: list[bytes] = []
        woken = asyncio.Event()

        async def run(i: int, call: dict) -> None:
            finished.append(await one(i, call))
            woken.set()

        tasks = [asyncio.ensure_future(run(i, c)) for i, c in enumerate(calls)]
        sent = 0
        while sent < len(tasks):
            await woken.wait()
            woken.clear()
            lines = finished[:]
            finished.clear()
            sent += len(lines)
            await response.write(b"".join(lines))
        await response.write_eof()
        return response

    app = web.Application(middlewares=[guard], client_max_size=server.config.max_file_bytes + 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_post("/slots/{slot}/exec", exec_)
    app.router.add_post("/slots/{slot}/reset", reset)
    app.router.add_post("/slots/{slot}/interrupt", interrupt)
    app.router.add_get("/slots/{slot}/file", get_file)
    app.router.add_put("/slots/{slot}/file", put_file)
    app.router.add_get("/slots/{slot}/artifacts", artifacts)
    app.router.add_get("/slots/{slot}/archive", archive)
    app.router.add_post("/batch", batch)
    return app
