"""batch_runner on a Ray cluster: rollout workers as Ray actors, the driver the only writer.

    python batch_runner.py ... --ray.address local --ray.workers 2              # a Ray cluster started here
    python batch_runner.py ... --ray.address HEAD_IP:6379 --ray.workers 16 --concurrency 32

Each worker is an async Ray actor that owns one `AgentRuntime`, built from the very
`BatchConfig` a local run uses (model clients, tool backend, agent loop), and runs up to
`--concurrency` prompts at once through batch_runner's `Runner`. The driver keeps at most
workers x concurrency prompts in flight, handing the next prompt to the least-loaded live
worker, and is the only process that writes `trajectories.jsonl` (batch_runner's
`LineWriter`: one whole line per write). The local run's exactly-once contract holds:

- a worker whose process or node dies loses its in-flight prompts; they go back to the
  front of the queue and run again on a live worker, and the slot gets a fresh actor that
  Ray places wherever there is room (it takes work only once it has started);
- a result for a prompt already in the output is dropped (counted as a duplicate);
- the output is the file a local run writes, so `--resume` after a killed driver (whose
  actors Ray removes with it) runs exactly the prompts that have no line yet.

Ray is imported here only, and this module only when `--ray` is given. See docs/scale_out.md.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any


from environments.batch.config import BatchConfig, Prompt, RayConfig
from environments.batch.output import LineWriter, Progress, _progress_loop, compute_stats, session_stats
from environments.batch.rollout import Runner

__all__ = ["RayRunError", "RolloutWorker", "run_on_ray"]

LOCAL = "local"
# A slot whose fresh actor dies this many times in a row before starting is a setup problem
# (the project is not installed on that node, the model server refuses it), not bad luck.
MAX_FAILED_STARTS = 3
NO_WORKER_WARNING_S = 60.0


class RayRunError(RuntimeError):
    """A problem the user must fix (cluster unreachable, workers cannot start); batch_runner prints it."""


class RolloutWorker:
    """One worker slot's runtime on some node: an async actor running many prompts at once."""

    def __init__(self, config_fields: dict[str, Any], api_key: str, slot: int) -> None:
        import ray

        self.config = BatchConfig(**config_fields, api_key=api_key)
        self.slot = slot
        self.node = ray.get_runtime_context().get_node_id()
        self._runtime: Any = None
        self._starting = asyncio.Lock()

    async def start(self) -> dict[str, Any]:
        """Enter the runtime (model clients, tool backend); a setup error fails this call."""
        from environments.runtime import AgentRuntime

        async with self._starting:
            if self._runtime is None:
                runtime = AgentRuntime(self.config.runtime, servers=self.config.model_servers())
                await runtime.__aenter__()
                self._runtime = runtime
        return {"node": self.node, "pid": os.getpid()}

    async def run(self, prompt: dict[str, Any]) -> dict[str, Any]:
        await self.start()
        progress = Progress(total=1, already=0)  # collects this prompt's retries
        record, error, attempts = await Runner(self.config, self._runtime).run_prompt(Prompt(**prompt), progress)
        return {
            "prompt_id": prompt["id"],
            "record": record,
            "error": error,
            "attempts": attempts,
            "retries": progress.retries,
            "node": self.node,
            "slot": self.slot,
        }

    async def stop(self) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            await runtime.__aexit__(None, None, None)


@dataclass
class _Slot:
    index: int
    actor: Any = None
    generation: int = 0
    ready: bool = False
    node: str | None = None
    in_flight: int = 0
    failed_starts: int = 0
    counts: Counter[str] = field(default_factory=Counter)


@dataclass
class _Call:
    kind: str  # "start" | "run"
    slot: int
    generation: int
    prompt: Prompt | None = None


def _prompt_fields(prompt: Prompt) -> dict[str, Any]:
    return {"id": prompt.id, "text": prompt.text, "toolsets": prompt.toolsets, "extra": prompt.extra}


def connect(ray: Any, config: RayConfig) -> bool:
    """Connect to (or start) the cluster; True when this call started the connection."""
    if ray.is_initialized():  # a caller (bench, notebook) already chose the cluster
        return False
    try:
        if config.address == LOCAL:
            cpus = max(os.cpu_count() or 1, math.ceil(config.workers * config.worker_cpus))
            ray.init(num_cpus=cpus, include_dashboard=False, logging_level="WARNING")
        else:
            ray.init(address=config.address, logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayRunError(
            f"cannot join the Ray cluster at {config.address!r} ({exc}); start one with `ray start --head` "
            "and pass its address, or pass --ray.address local"
        ) from exc
    return True


async def run_on_ray(
    config: BatchConfig,
    prompts: list[Prompt],
    pending: list[Prompt],
    stream: Any = sys.stderr,
    worker: type = RolloutWorker,
) -> dict[str, Any]:
    """Run `pending` on Ray workers, append results to the run's output; return the statistics.

    `worker` is the actor class (start/run/stop as RolloutWorker's); bench/scale.py passes a
    simulated rollout to measure this driver at scale.
    """
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    assert config.ray is not None
    rc = config.ray
    run_dir = config.run_dir
    out_path = run_dir / "trajectories.jsonl"
    progress = Progress(total=len(prompts), already=len(prompts) - len(pending))
    wall_started = time.monotonic()
    fields = config.model_dump(exclude={"api_key", "ray"})
    api_key = config.resolved_api_key()  # read once here; the workers get it, never the environment
    queue: deque[Prompt] = deque(pending)
    slots = [_Slot(i) for i in range(rc.workers)]
    calls: dict[asyncio.Future[Any], _Call] = {}
    written: set[str] = {p.id for p in prompts} - {p.id for p in pending}
    nodes: dict[str, Counter[str]] = {}
    events: list[dict[str, Any]] = []  # workers lost / ready, prompts re-run: wall-clock times (recovery)
    rerun = duplicates = restarts = running = 0
    last_error = ""
    started_here = False
    actor_class: Any = None

    def submit(ref: Any, call: _Call) -> None:
        calls[asyncio.wrap_future(ref.future())] = call

    def spawn(slot: _Slot) -> None:
        slot.actor = actor_class.options(
            num_cpus=rc.worker_cpus,
            max_concurrency=config.concurrency + 2,  # + start/stop beside the prompts
            max_restarts=0,  # the driver replaces a dead worker itself, knowing what it held
            scheduling_strategy="SPREAD",
        ).remote(fields, api_key, slot.index)
        slot.generation += 1
        slot.ready, slot.node, slot.in_flight = False, None, 0
        submit(slot.actor.start.remote(), _Call("start", slot.index, slot.generation))

    def lost(slot: _Slot, exc: BaseException) -> None:
        """The slot's actor (or its node) died: replace it once, however many calls report it."""
        nonlocal restarts
        print(f"[hermes-rl] worker {slot.index} lost ({type(exc).__name__}); starting a new one", file=stream)
        try:
            ray.kill(slot.actor, no_restart=True)
        except Exception:  # already gone with its node
            pass
        restarts += 1
        events.append({"time": time.time(), "worker": slot.index, "event": "lost"})
        slot.counts["restarts"] += 1
        spawn(slot)

    writer = failures = None
    ticker: asyncio.Task[None] | None = None
    try:
        if pending:
            started_here = connect(ray, rc)
            actor_class = ray.remote(worker)
            for slot in slots:
                spawn(slot)
        writer = LineWriter(out_path)
        failures = LineWriter(run_dir / "infra_failures.jsonl")
        ticker = asyncio.create_task(_progress_loop(progress, config.progress_interval_s, stream))
        while queue or running:
            if progress.consecutive_failures >= config.max_consecutive_infra_failures:
                break
            # Least-loaded first: the next prompt goes to the live worker holding the fewest.
            for slot in sorted((s for s in slots if s.ready), key=lambda s: s.in_flight):
                while queue and slot.in_flight < config.concurrency:
                    prompt = queue.popleft()
                    slot.in_flight += 1
                    running += 1
                    submit(
                        slot.actor.run.remote(_prompt_fields(prompt)), _Call("run", slot.index, slot.generation, prompt)
                    )
            if not calls:  # cannot happen: a slot not yet ready always has its start call pending
                raise RayRunError("no worker is running or starting; rerun with --resume")
            # Workers wait for room on the cluster without a word from Ray: say so once a minute.
            waiting = None if any(s.ready for s in slots) else NO_WORKER_WARNING_S
            done, _ = await asyncio.wait(calls, timeout=waiting, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                print(
                    f"[hermes-rl] no worker has started after {NO_WORKER_WARNING_S:.0f} s: does the cluster have "
                    f"{rc.worker_cpus:g} free CPU(s) per worker, and can every node import the project?",
                    file=stream,
                    flush=True,
                )
            for future in done:
                call = calls.pop(future)
                if call.kind == "run":
                    running -= 1
                slot = slots[call.slot]
                current = call.generation == slot.generation
                try:
                    reply = future.result()
                except RayTaskError as exc:  # the worker's own code raised: a setup or config error
                    message = str(exc.cause or exc).replace("--openai.base_url", "--base_url")
                    raise RayRunError(f"worker {slot.index} failed: {message}") from exc
                except (RayActorError, ray.exceptions.RayError) as exc:  # its process or node died
                    if call.prompt is not None:
                        queue.appendleft(call.prompt)
                        rerun += 1
                        events.append(
                            {"time": time.time(), "worker": slot.index, "event": "rerun", "prompt": call.prompt.id}
                        )
                        slot.counts["lost"] += 1
                    if current:
                        if call.kind == "start":
                            slot.failed_starts += 1
                            if slot.failed_starts >= MAX_FAILED_STARTS:
                                raise RayRunError(
                                    f"worker {slot.index} died {slot.failed_starts} times while starting ({exc}); "
                                    "is the project installed on every node (docs/scale_out.md)?"
                                ) from exc
                        lost(slot, exc)
                    continue
                if call.kind == "start":
                    if current:
                        slot.ready, slot.node, slot.failed_starts = True, reply["node"], 0
                        events.append({"time": time.time(), "worker": slot.index, "event": "ready"})
                        print(f"[hermes-rl] worker {slot.index} ready on node {slot.node}", file=stream, flush=True)
                    continue
                if current:
                    slot.in_flight -= 1
                node = nodes.setdefault(reply["node"], Counter())
                progress.retries += reply["retries"]
                if reply["record"] is not None:
                    if reply["prompt_id"] in written:  # a second answer for a prompt: the output keeps one
                        duplicates += 1
                        continue
                    writer.write(reply["record"])
                    written.add(reply["prompt_id"])
                    progress.done += 1
                    progress.consecutive_failures = 0
                    slot.counts["done"] += 1
                    node["done"] += 1
                else:
                    failures.write(
                        {
                            "prompt_id": reply["prompt_id"],
                            "error": reply["error"],
                            "attempts": reply["attempts"],
                            "time": time.time(),
                            "worker": slot.index,
                            "node": reply["node"],
                        }
                    )
                    progress.failed += 1
                    progress.consecutive_failures += 1
                    slot.counts["failed"] += 1
                    node["failed"] += 1
                    last_error = str(reply["error"])
    finally:
        for future in calls:  # a replacement still starting, or calls left by an error
            future.cancel()
        if ticker is not None:
            ticker.cancel()
        for w in (writer, failures):
            if w is not None:
                w.close()
        await _shutdown(ray if actor_class is not None else None, slots, started_here)
        if stream.isatty():
            stream.write("\n")
        print(progress.line(), file=stream, flush=True)
    stats = compute_stats(out_path, total_prompts=len(prompts))
    stats["session"] = {
        **session_stats(progress, len(pending), wall_started),
        "ray": {
            "address": rc.address,
            "workers": rc.workers,
            "rerun_after_worker_loss": rerun,
            "duplicates_dropped": duplicates,
            "worker_restarts": restarts,
            "per_worker": {str(s.index): dict(s.counts) for s in slots},
            "per_node": {n: dict(c) for n, c in nodes.items()},
            "worker_events": events,
        },
    }
    (run_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    if progress.consecutive_failures >= config.max_consecutive_infra_failures and queue:
        raise RayRunError(
            f"stopped after {progress.consecutive_failures} prompts in a row failed on infrastructure errors "
            f"(last: {last_error or '?'}); fix the server, then rerun with --resume"
        )
    if rerun or duplicates:
        print(
            f"[hermes-rl] ray: {rerun} prompts re-run after a worker was lost, {duplicates} duplicates dropped",
            file=stream,
        )
    return stats


async def _shutdown(ray: Any, slots: list[_Slot], disconnect: bool) -> None:
    """Close each live worker's runtime (workspaces removed), then end the actors."""
    if ray is None:
        return
    stops = [asyncio.wrap_future(s.actor.stop.remote().future()) for s in slots if s.ready]
    if stops:
        await asyncio.wait(stops, timeout=30)
    for s in slots:
        try:
            ray.kill(s.actor, no_restart=True)
        except Exception:  # its node is gone
            pass
    if disconnect:
        ray.shutdown()
