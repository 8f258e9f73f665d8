"""`python -m sandbox_server --data-dir DIR --slots N [--host H --port P] (--token-fd N | --token-file F | env SANDBOX_SERVER_TOKEN)`

Prints one JSON line {"event": "listening", "host", "port", "pid", "isolation"} on stdout
once it accepts requests, so whoever started it can find the port when it asked for 0.

The token never stays in this process's environment: /proc/<pid>/environ keeps the
environment a process was started with, so a token given as SANDBOX_SERVER_TOKEN makes the
server re-exec itself without it, handing the token over through a pipe. As PID 1 (a
container without an init) the process forks: PID 1 only reaps orphans and forwards
SIGTERM/SIGINT, the child serves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time

import uvloop
from aiohttp import web

from sandbox_server.bundle import current_runtime
from sandbox_server.isolation import SlotLimits
from sandbox_server.config import ServerConfig
from sandbox_server.routes import build_app
from sandbox_server.server import SandboxServer
from sandbox_server.tree import remove_tree

TOKEN_ENV = "SANDBOX_SERVER_TOKEN"


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, ServerConfig]:
    ap = argparse.ArgumentParser(prog="sandbox_server", description="Slots of isolated workspaces behind HTTP")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--token-file", help=f"file holding the bearer token (else --token-fd or ${TOKEN_ENV})")
    ap.add_argument("--token-fd", type=int, help="read the bearer token from this inherited file descriptor")
    ap.add_argument("--remove-data-dir", action="store_true", help="delete --data-dir when the server stops")
    ap.add_argument("--bwrap", default="bwrap")
    ap.add_argument("--workspace-mount", default="/workspace")
    ap.add_argument("--no-cache", action="store_true", help="no shared /cache directory")
    ap.add_argument(
        "--ro-path", action="append", default=[], help="a host path slots see read-only at the same place (repeatable)"
    )
    ap.add_argument("--max-output-bytes", type=int, default=1_000_000)
    ap.add_argument(
        "--no-spawn-helper",
        action="store_true",
        help="start commands through prlimit and setpriv even if hermes-spawn is built",
    )
    ap.add_argument(
        "--allow-root-commands",
        action="store_true",
        help="accept exec calls with as_root (a task verifier as its container's root); container backends only",
    )
    defaults = SlotLimits()
    for name, info in SlotLimits.model_fields.items():
        kind = float if info.annotation is float else int
        ap.add_argument(
            f"--{name.replace('_', '-')}", type=kind, default=getattr(defaults, name), help=info.description
        )
    ns = ap.parse_args(argv)
    limits = SlotLimits(**{name: getattr(ns, name) for name in SlotLimits.model_fields})
    config = ServerConfig(
        slots=ns.slots,
        data_dir=ns.data_dir,
        bwrap=ns.bwrap,
        workspace_mount=ns.workspace_mount,
        cache_mount=None if ns.no_cache else "/cache",
        max_output_bytes=ns.max_output_bytes,
        extra_ro_paths=ns.ro_path,
        spawn_helper=not ns.no_spawn_helper,
        limits=limits,
        allow_root_commands=ns.allow_root_commands,
    )
    return ns, config


def _read_token(ns: argparse.Namespace) -> str:
    # The token is a secret: it comes from a pipe, a file or the environment, never argv (visible in ps).
    if ns.token_fd is not None:
        with os.fdopen(ns.token_fd, "r") as fh:
            token = fh.read().strip()
    elif ns.token_file:
        with open(ns.token_file) as fh:
            token = fh.read().strip()
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        sys.exit(f"sandbox_server: no token; pass --token-fd or --token-file, or set {TOKEN_ENV}")
    return token


def _reexec_without_token_env(token: str) -> None:
    """Start again with the token in a pipe instead of the environment (which /proc shows)."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, token.encode())  # a token is far below the pipe's buffer
    os.close(write_fd)
    os.set_inheritable(read_fd, True)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    runtime = current_runtime()
    # In the self-contained runtime its launcher, not the interpreter: the image's loader may not run it.
    start = [str(runtime.launcher)] if runtime is not None else [sys.executable, "-m", "sandbox_server"]
    os.execve(start[0], [*start, *sys.argv[1:], "--token-fd", str(read_fd)], env)


def _run_as_init() -> None:
    """PID 1 of a container: fork the server, reap every orphan, pass SIGTERM/SIGINT on, exit with the server."""
    child = os.fork()
    if child == 0:
        return
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == child:
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


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
    if os.getpid() == 1:
        _run_as_init()
    ns, config = _parse(argv)
    token = _read_token(ns)
    if TOKEN_ENV in os.environ and argv is None:
        _reexec_without_token_env(token)
    try:
        # libuv's loop: each command costs the server about a sixth less CPU than asyncio's own loop
        # (bench/sandbox.py, 32 busy slots), with the same coroutines.
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(ns, config, token))
    finally:
        if ns.remove_data_dir:
            # Slot processes may still be exiting and writing: a few tries, then leave what stays.
            for attempt in range(5):
                try:
                    remove_tree(config.data_dir)
                    break
                except OSError:
                    time.sleep(0.2 * (attempt + 1))
    # Do not wait for file-operation threads: SIGTERM must stop the server even if one is stuck.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
