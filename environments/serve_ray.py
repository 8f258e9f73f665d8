"""`serve` on a Ray cluster: K env worker processes feeding one run-api, replaced when they die.

    python -m environments.serve_ray --ray local --workers 2 --env_module environments.mhqa_env \\
        -- --env.rollout_server_url http://HEAD:8000 --openai.base_url http://GPU:8000/v1 ...

Each worker is a Ray actor that runs one `python -m ENV_MODULE serve ARGS...` process (the env's
own strict CLI, unchanged) and waits for it. That process registers itself with run-api
(`/register-env`, its own env id) exactly as a hand-started `serve` does. The serve process dies
with its actor (PR_SET_PDEATHSIG), so a lost actor or node leaves no orphan posting groups.

The driver supervises: a worker whose actor, node or serve process dies gets a fresh actor that
Ray places wherever there is room (up to `--max_restarts` per worker); it registers anew. A serve
that refuses its flags (exit 2) stops the run at once: every replacement would refuse them too. A
worker whose serve exits 0 is done (the trainer's run is done); the driver exits once all are.
A group is posted to run-api in one request (environments/trainer_boundary.py), so a worker that
dies mid-group loses that group's rollouts but never sends half of it. See docs/scale_out.md.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from environments.batch.config import RayConfig
from environments.batch.on_ray import RayRunError, connect

__all__ = ["EnvWorker", "ServeRayConfig", "main", "run_serve_on_ray"]

_PR_SET_PDEATHSIG = 1
USAGE_ERROR = 2  # what the env CLI exits with for bad flags or config (argparse's and environments/cli.py's)


class ServeRayConfig(BaseModel):
    """Where and how many `serve` env workers run, and what each runs."""

    ray: RayConfig
    env_module: str = Field(min_length=1, description="The env's module, run as `python -m ENV_MODULE serve ...`")
    serve_args: list[str] = Field(default_factory=list, description="The env's serve flags, passed as given")
    max_restarts: int = Field(3, ge=0, description="Replacements per worker before the run stops")


class EnvWorker:
    """One env worker slot on some node: an async actor owning one `serve` process."""

    def __init__(self, slot: int) -> None:
        import ray

        self.slot = slot
        self.node = ray.get_runtime_context().get_node_id()
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self, env_module: str, serve_args: list[str]) -> dict[str, Any]:
        import environments

        # The project root as this node imports it, so `-m` finds the env module there too.
        root = Path(environments.__file__).resolve().parents[1]
        prctl = ctypes.CDLL(None).prctl  # looked up before the fork: the child only calls it
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            env_module,
            "serve",
            *serve_args,
            cwd=root,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL),
        )
        return {"node": self.node, "pid": os.getpid(), "serve_pid": self._proc.pid}

    async def wait(self) -> tuple[int, str]:
        """serve's exit code and its last stderr line; every line goes on to this actor's stderr,
        which Ray streams to the driver."""
        assert self._proc is not None and self._proc.stderr is not None, "start() first"
        last = ""
        async for line in log_lines(self._proc.stderr):
            print(line, file=sys.stderr, flush=True)
            last = line or last
        return await self._proc.wait(), last

    async def stop(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            try:
                await asyncio.wait_for(self._proc.wait(), 30)
            except TimeoutError:
                self._proc.kill()


LOG_LINE_CHARS = 16_384
# C0 controls but tab, DEL and C1 controls: a log quoting model text must not drive the driver's terminal.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x09), *range(0x0A, 0x20), 0x7F, *range(0x80, 0xA0))}


async def log_lines(stream: asyncio.StreamReader) -> AsyncIterator[str]:
    """A log's lines, each cut to LOG_LINE_CHARS with its control characters written out: a line of any
    length (a log quoting model text) is forwarded, never the end of the forwarding."""
    pending = b""
    while chunk := await stream.read(1 << 16):
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for raw in whole:
            yield _shown(raw)
        if len(pending) > 4 * LOG_LINE_CHARS:  # keep the head of an endless line, drop the rest as it comes
            pending = pending[: 4 * LOG_LINE_CHARS]
    if pending:
        yield _shown(pending)


def _shown(raw: bytes) -> str:
    line = raw.decode(errors="replace").rstrip()
    cut = " [... the rest of this line is cut]" if len(line) > LOG_LINE_CHARS else ""
    return line[:LOG_LINE_CHARS].translate(_CONTROLS) + cut


def _say(line: str) -> None:
    print(f"[hermes-rl] serve_ray: {line}", file=sys.stderr, flush=True)


async def _supervise(ray: Any, actor_class: Any, config: ServeRayConfig, slot: int, actors: dict[int, Any]) -> None:
    """Keep worker `slot` running until its serve exits 0; replace it when it dies."""
    from ray.exceptions import RayActorError

    restarts = 0
    while True:
        # SPREAD: one node lost takes as few workers as possible with it.
        actor = actor_class.options(
            num_cpus=config.ray.worker_cpus, max_restarts=0, scheduling_strategy="SPREAD"
        ).remote(slot)
        actors[slot] = actor
        try:
            info = await actor.start.remote(config.env_module, config.serve_args)
            _say(
                f"worker {slot} started on node {info['node']} (actor pid {info['pid']}, serve pid {info['serve_pid']})"
            )
            code, last_line = await actor.wait.remote()
        except RayActorError as exc:
            reason = f"its actor or node died ({type(exc).__name__})"
        else:
            if code == 0:
                _say(f"worker {slot} done: serve exited 0")
                return
            if code == USAGE_ERROR:  # the env CLI refused its flags or config: a restart would too
                raise RayRunError(
                    f"worker {slot}: serve refused its flags or config (exit {code}): {last_line!r}; "
                    "fix the serve flags after --"
                )
            reason = f"serve exited with {code} ({last_line!r})"
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # its node is gone
            pass
        if restarts >= config.max_restarts:
            raise RayRunError(
                f"worker {slot} lost {restarts + 1} times, last: {reason}; see the serve log above "
                f"and fix its flags or the node, or raise --max_restarts"
            )
        restarts += 1
        _say(f"worker {slot} lost: {reason}; restarting it ({restarts} of {config.max_restarts})")


async def run_serve_on_ray(config: ServeRayConfig) -> None:
    """Run the workers until every serve is done; raises RayRunError when one cannot be kept running."""
    import ray

    disconnect = connect(ray, config.ray)
    actors: dict[int, Any] = {}
    tasks = [
        asyncio.ensure_future(_supervise(ray, ray.remote(EnvWorker), config, slot, actors))
        for slot in range(config.ray.workers)
    ]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        stops = [asyncio.wrap_future(a.stop.remote().future()) for a in actors.values()]
        if stops:
            await asyncio.wait(stops, timeout=40)
        for actor in actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # its node is gone
                pass
        if disconnect:
            ray.shutdown()


def parse_args(argv: list[str]) -> ServeRayConfig:
    own, sep, serve_args = (
        (argv[: argv.index("--")], "--", argv[argv.index("--") + 1 :]) if "--" in argv else (argv, "", [])
    )
    parser = argparse.ArgumentParser(
        prog="python -m environments.serve_ray",
        description="Run an env's `serve` as K Ray actors feeding one run-api; the env's flags go after --.",
        usage="%(prog)s --ray ADDRESS [--workers K] [--worker_cpus C] [--max_restarts R] --env_module MODULE -- SERVE_ARGS",
    )
    parser.add_argument("--ray", required=True, help=RayConfig.model_fields["address"].description)
    parser.add_argument("--workers", type=int, default=2, help="env worker actors, one serve process each")
    parser.add_argument(
        "--worker_cpus", type=float, default=1.0, help=RayConfig.model_fields["worker_cpus"].description
    )
    parser.add_argument(
        "--max_restarts", type=int, default=3, help=ServeRayConfig.model_fields["max_restarts"].description
    )
    parser.add_argument("--env_module", required=True, help=ServeRayConfig.model_fields["env_module"].description)
    args = parser.parse_args(own)
    if not sep:
        parser.error("the env's serve flags go after -- (e.g. -- --env.rollout_server_url http://HOST:8000)")
    try:
        return ServeRayConfig(
            ray=RayConfig(address=args.ray, workers=args.workers, worker_cpus=args.worker_cpus),
            env_module=args.env_module,
            serve_args=serve_args,
            max_restarts=args.max_restarts,
        )
    except ValueError as exc:
        parser.error(str(exc).replace("\n", " "))


def main(argv: list[str] | None = None) -> int:
    config = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        asyncio.run(run_serve_on_ray(config))
    except RayRunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
