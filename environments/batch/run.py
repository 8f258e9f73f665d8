"""batch_runner's run: every prompt of the file not yet in the output, on local workers or on Ray."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from typing import Any

from environments.batch.config import BatchConfig, BatchError, Prompt, load_prompts, sample_toolsets
from environments.batch.output import LineWriter, Progress, _progress_loop, compute_stats, session_stats, recover_output
from environments.batch.rollout import Runner, codeact_agents
from environments.gc_tuning import collector
from environments.models.base import ChatModel
from environments.runtime import AgentRuntime, HermesEnvError


async def run_batch(
    config: BatchConfig, stream: Any = sys.stderr, model: Callable[[], ChatModel] | None = None
) -> dict[str, Any]:
    """Run every prompt not yet in the output; return the statistics (also written to stats.json).

    `model` replaces the model server with a `ChatModel` factory (tests).
    """
    prompts = load_prompts(config.dataset_file)
    run_dir = config.run_dir
    out_path = run_dir / "trajectories.jsonl"
    if out_path.exists() and out_path.stat().st_size and not config.resume:
        raise BatchError(
            f"{out_path} already has results; pass --resume to continue that run or choose another --run_name"
        )
    done_ids = recover_output(out_path)
    known = {p.id for p in prompts}
    if done_ids - known:
        raise BatchError(
            f"{out_path} has results for {len(done_ids - known)} ids not in {config.dataset_file}; "
            "is this the same dataset?"
        )
    pending = [p for p in prompts if p.id not in done_ids]
    runtime = AgentRuntime(config.runtime, servers=config.model_servers(), model=model)
    registry = runtime.registry
    for p in pending:  # unknown distributions / toolsets fail now, not in a worker
        ts = p.toolsets if p.toolsets is not None else sample_toolsets(config.distribution, p.id, config.seed)
        unknown = set(ts) - registry.toolsets
        if unknown:
            raise BatchError(
                f"prompt {p.id!r} asks for unknown toolsets {sorted(unknown)}; known: {sorted(registry.toolsets)}"
            )
    if config.ray is not None:  # the same run with Ray actors as workers; Ray is imported only then
        if model is not None:
            raise BatchError(
                "--ray.address: Ray workers reach the model server at --base_url; a model factory cannot travel"
            )
        from environments.batch.on_ray import RayRunError, run_on_ray

        _start_run_dir(config)
        try:
            return await run_on_ray(config, prompts, pending, stream)
        except RayRunError as exc:
            raise BatchError(str(exc)) from exc

    progress = Progress(total=len(prompts), already=len(done_ids))
    wall_started = time.monotonic()
    queue: asyncio.Queue[Prompt] = asyncio.Queue()
    for p in pending:
        queue.put_nowait(p)
    last_error: list[str] = []
    try:
        await runtime.__aenter__()  # model server(s), web and tool backends; fails fast naming the URL
    except HermesEnvError as exc:
        flags = str(exc).replace("--openai.base_url", "--base_url").replace("--openai.api_key", "--api_key")
        flags = flags.replace("--env.runtime.", "--runtime.")
        raise BatchError(flags) from exc
    try:  # the input is good and the servers answer: only now does the run leave files behind
        _start_run_dir(config)
        writer = LineWriter(out_path)
        failures = LineWriter(run_dir / "infra_failures.jsonl")
    except BaseException:
        await runtime.__aexit__(None, None, None)
        raise
    ticker = asyncio.create_task(_progress_loop(progress, config.progress_interval_s, stream))
    pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="codeagent") if config.agent == "codeact" else None
    try:
        runner = Runner(config, runtime, codeact_agents(runtime, pool) if pool is not None else None)

        async def worker() -> None:
            while not queue.empty() and progress.consecutive_failures < config.max_consecutive_infra_failures:
                prompt = queue.get_nowait()
                record, error, attempts = await runner.run_prompt(prompt, progress)
                if record is not None:
                    writer.write(record)
                    progress.done += 1
                    progress.consecutive_failures = 0
                else:
                    failures.write({"prompt_id": prompt.id, "error": error, "attempts": attempts, "time": time.time()})
                    progress.failed += 1
                    progress.consecutive_failures += 1
                    last_error[:] = [str(error)]

        with collector(config.gc):
            await asyncio.gather(*(worker() for _ in range(min(config.concurrency, max(len(pending), 1)))))
    finally:
        ticker.cancel()
        writer.close()
        failures.close()
        await runtime.__aexit__(None, None, None)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if stream.isatty():
            stream.write("\n")
        print(progress.line(), file=stream, flush=True)
    stats = compute_stats(out_path, total_prompts=len(prompts))
    stats["session"] = session_stats(progress, len(pending), wall_started)
    (run_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    if progress.consecutive_failures >= config.max_consecutive_infra_failures and not queue.empty():
        raise BatchError(
            f"stopped after {progress.consecutive_failures} prompts in a row failed on infrastructure errors "
            f"(last: {last_error[0] if last_error else '?'}); fix the server, then rerun with --resume"
        )
    return stats


def _start_run_dir(config: BatchConfig) -> None:
    """The run directory and its config, written once every input has been checked (bad input writes nothing)."""
    config.run_dir.mkdir(parents=True, exist_ok=True)
    (config.run_dir / "run_config.json").write_text(config.model_dump_json(indent=2, exclude={"api_key"}))
