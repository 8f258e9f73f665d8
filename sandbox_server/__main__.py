"""`python -m sandbox_server --data-dir DIR --slots N [--host H --port P] (--token-file F | env SANDBOX_SERVER_TOKEN)`

Prints one JSON line {"event": "listening", "host", "port", "pid", "isolation"} on stdout
once it accepts requests, so whoever started it can find the port when it asked for 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

from aiohttp import web

from sandbox_server.server import SandboxServer, ServerConfig, build_app

TOKEN_ENV = "SANDBOX_SERVER_TOKEN"


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, ServerConfig]:
    ap = argparse.ArgumentParser(prog="sandbox_server", description="Slots of isolated workspaces behind HTTP")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--token-file", help=f"file holding the bearer token (else ${TOKEN_ENV})")
    ap.add_argument("--bwrap", default="bwrap")
    ap.add_argument("--workspace-mount", default="/workspace")
    ap.add_argument("--no-cache", action="store_true", help="no shared /cache directory")
    ap.add_argument("--max-output-bytes", type=int, default=1_000_000)
    ns = ap.parse_args(argv)
    config = ServerConfig(
        slots=ns.slots,
        data_dir=ns.data_dir,
        bwrap=ns.bwrap,
        workspace_mount=ns.workspace_mount,
        cache_mount=None if ns.no_cache else "/cache",
        max_output_bytes=ns.max_output_bytes,
    )
    return ns, config


def _read_token(ns: argparse.Namespace) -> str:
    # The token is a secret: it comes from a file or the environment, never argv (visible in ps).
    if ns.token_file:
        with open(ns.token_file) as fh:
            token = fh.read().strip()
    else:
        token = os.environ.pop(TOKEN_ENV, "").strip()
    if not token:
        sys.exit(f"sandbox_server: no token; pass --token-file or set {TOKEN_ENV}")
    return token


async def _serve(ns: argparse.Namespace, config: ServerConfig, token: str) -> None:
    server = SandboxServer(config, token)
    await server.start()
    runner = web.AppRunner(build_app(server), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, ns.host, ns.port)
    await site.start()
    port = runner.addresses[0][1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(
        json.dumps(
            {
                "event": "listening",
                "host": ns.host,
                "port": port,
                "pid": os.getpid(),
                "isolation": server.isolation.available,
                "isolation_reason": server.isolation.reason,
            }
        ),
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        await server.stop()  # kill running commands before the sockets close
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    ns, config = _parse(argv)
    token = _read_token(ns)
    asyncio.run(_serve(ns, config, token))


if __name__ == "__main__":
    main()
