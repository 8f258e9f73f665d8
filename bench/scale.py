"""Scale-out of batch_runner --ray over simulated nodes (run by hand; figures in docs/scale_out.md).

    .venv/bin/python -m bench.scale            # 10,000 prompts over N = 1, 2, 4, 8 nodes
    .venv/bin/python -m bench.scale --quick    # 800 prompts, same shape, a few minutes

What is real: a multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`, one raylet
per simulated node, all on 127.0.0.1, one 1-CPU worker actor per node), batch_runner's Ray
driver (`environments.batch.on_ray.run_on_ray`: dispatch, the single writer, node-loss recovery,
stats), and an OpenAI-shaped model server over HTTP in its own process whose every answer
takes a lognormal time. What is simulated: the rollout inside each worker — a prompt makes
1 + k model calls (k tool turns, 0-3, fixed per prompt) over HTTP, and each tool turn waits a
lognormal tool time instead of running a tool, so the workload is latency-bound (as with
remote model servers and sandboxes) and this 2-core machine measures the driver, not tools.

Per N: throughput (prompts/s between the first rollout start and the last finish), scaling
efficiency against N = 1 and per doubling, p50/p95/p99 rollout latency, time spent on the last
1% of prompts. Then a run at the largest N where one node is removed without warning halfway:
recovery time (node removed -> its replacement worker ready), rollouts re-run, duplicates in
the output (must be 0), and every prompt present.
"""

from __future__ import annotations

from bench.machine import load_note

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

NODE = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024}


# ---- the model server: an OpenAI-shaped answer after a lognormal time, in its own process ----


def serve_model(port_out: Any, median_s: float, sigma: float) -> None:
    from aiohttp import web

    rng = random.Random(0)

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(median_s * math.exp(rng.gauss(0.0, sigma)))
        message = {"role": "assistant", "content": "ok"}
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "sim",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
            }
        )

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        port_out.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


# ---- the simulated worker: RolloutWorker's interface, a latency-bound rollout inside ----------


class SimulatedWorker:
    """start/run/stop like environments.batch.on_ray.RolloutWorker; a rollout is HTTP model calls + tool waits."""

    def __init__(self, config_fields: dict[str, Any], api_key: str, slot: int) -> None:
        import ray

        self.base_url = config_fields["base_url"]
        self.tool_median_s = float(config_fields["runtime"]["extra_body"].get("sim_tool_median_s", 0.15))
        self.slot = slot
        self.node = ray.get_runtime_context().get_node_id()
        self._session: Any = None

    async def start(self) -> dict[str, Any]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return {"node": self.node, "pid": os.getpid()}

    async def run(self, prompt: dict[str, Any]) -> dict[str, Any]:
        await self.start()
        rng = random.Random(prompt["id"])
        tool_turns = rng.choice([0, 1, 1, 2, 2, 3])
        started = time.time()
        for turn in range(tool_turns + 1):
            async with self._session.post(
                self.base_url + "/chat/completions", json={"model": "sim", "messages": [{"role": "user"}]}
            ) as response:
                await response.json()
            if turn < tool_turns:
                await asyncio.sleep(self.tool_median_s * math.exp(rng.gauss(0.0, 0.8)))
        finished = time.time()
        record = {
            "prompt_id": prompt["id"],
            "toolsets": ["sim"],
            "stop_reason": "stop",
            "completed": True,
            "turns": tool_turns + 1,
            "tool_calls": {"sim": tool_turns} if tool_turns else {},
            "tool_errors": [],
            "format_errors": 0,
            "usage": {"prompt_tokens": 100 * (tool_turns + 1), "completion_tokens": 20 * (tool_turns + 1)},
            "duration_s": round(finished - started, 4),
            "started_at": started,
            "finished_at": finished,
        }
        return {
            "prompt_id": prompt["id"],
            "record": record,
            "error": None,
            "attempts": 1,
            "retries": 0,
            "node": self.node,
            "slot": self.slot,
        }

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()


# ---- one run ------------------------------------------------------------------------------------


def run_once(
    work: Path, name: str, base_url: str, n_prompts: int, nodes: int, concurrency: int, tool_median_s: float, kill: Any
) -> dict[str, Any]:
    """One batch over `nodes` workers through the real driver; `kill(progress_path)` runs beside it."""
    from batch_runner import BatchConfig, load_prompts
    from environments.batch.config import RayConfig
    from environments.batch.on_ray import run_on_ray
    from environments.runtime import RuntimeConfig

    dataset = work / f"{name}.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"p{i:05d}", "prompt": "x"}) + "\n" for i in range(n_prompts)))
    config = BatchConfig(
        dataset_file=dataset,
        run_name=name,
        model="sim",
        base_url=base_url,
        output_dir=work / "runs",
        concurrency=concurrency,
        runtime=RuntimeConfig(extra_body={"sim_tool_median_s": tool_median_s}),
        progress_interval_s=5.0,
        ray=RayConfig(address="bench", workers=nodes, worker_cpus=1.0),
    )
    config.run_dir.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(dataset)
    out = config.run_dir / "trajectories.jsonl"
    killer = threading.Thread(target=kill, args=(out,), daemon=True) if kill else None
    if killer:
        killer.start()
    stats = asyncio.run(run_on_ray(config, prompts, prompts, sys.stderr, worker=SimulatedWorker))
    if killer:
        killer.join()
    records = [json.loads(line) for line in out.read_bytes().split(b"\n")[:-1]]
    ids = [r["prompt_id"] for r in records]
    start = min(r["started_at"] for r in records)
    ends = sorted(r["finished_at"] for r in records)
    span = ends[-1] - start
    latencies = sorted(r["duration_s"] for r in records)
    q = statistics.quantiles(latencies, n=100)
    at_99 = ends[math.ceil(0.99 * len(ends)) - 1]
    # Between the 10th and the 90th percentile of finishes: neither the ramp-up nor the tail.
    t10, t90 = ends[len(ends) // 10], ends[(9 * len(ends)) // 10]
    return {
        "nodes": nodes,
        "prompts": n_prompts,
        "recorded": len(records),
        "unique": len(set(ids)),
        "duplicates_in_output": len(ids) - len(set(ids)),
        "missing": n_prompts - len(set(ids)),
        "throughput_per_s": round(len(records) / span, 2),
        "steady_per_s": round((9 * len(ends) // 10 - len(ends) // 10) / (t90 - t10), 2),
        "span_s": round(span, 2),
        "wall_s": stats["session"]["wall_time_s"],
        "p50_s": round(q[49], 3),
        "p95_s": round(q[94], 3),
        "p99_s": round(q[98], 3),
        "last_1pct_s": round(ends[-1] - at_99, 2),
        "ray": stats["session"]["ray"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="800 prompts, concurrency 24 per node")
    p.add_argument("--prompts", type=int, default=None)
    p.add_argument("--nodes", default="1,2,4,8")
    p.add_argument("--concurrency", type=int, default=None, help="prompts in flight per node (default 64; quick 24)")
    p.add_argument("--call_median_s", type=float, default=0.5, help="median model-call time (lognormal, sigma 0.6)")
    p.add_argument("--tool_median_s", type=float, default=0.15, help="median tool time (lognormal, sigma 0.8)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    a = p.parse_args()
    n_prompts = a.prompts or (800 if a.quick else 10_000)
    concurrency = a.concurrency or (24 if a.quick else 64)
    sizes = [int(x) for x in a.nodes.split(",")]

    # The raylets listen on 127.0.0.1 only; without this Ray setting (for one-machine clusters) the
    # driver would rewrite the loopback address to the machine's outward IP. Read when ray is imported.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray.cluster_utils import Cluster

    ctx = multiprocessing.get_context("spawn")
    ports = ctx.Queue()
    server = ctx.Process(target=serve_model, args=(ports, a.call_median_s, 0.6), daemon=True)
    server.start()
    base_url = f"http://127.0.0.1:{ports.get(timeout=60)}/v1"
    load_before = os.getloadavg()
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 0, "include_dashboard": False})
    results: list[dict[str, Any]] = []
    try:
        ray.init(address=cluster.address, logging_level="WARNING")
        work = Path(tempfile.mkdtemp(prefix="hermes-scale-"))
        for n in sizes:
            while len(cluster.worker_nodes) < n:
                cluster.add_node(**NODE, num_cpus=1)
            cluster.wait_for_nodes()
            r = run_once(work, f"n{n}", base_url, n_prompts, n, concurrency, a.tool_median_s, None)
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "ray"}), flush=True)

        # Node loss at the largest N: a node removed without warning halfway, a spare joins.
        n = max(sizes)
        removed_at: list[float] = []

        def kill(out: Path) -> None:
            while not out.exists() or out.read_bytes().count(b"\n") < n_prompts // 2:
                time.sleep(0.05)
            victim = next(iter(cluster.worker_nodes))
            removed_at.append(time.time())
            cluster.remove_node(victim, allow_graceful=False)
            cluster.add_node(**NODE, num_cpus=1)

        loss = run_once(work, "loss", base_url, n_prompts, n, concurrency, a.tool_median_s, kill)
        events = loss["ray"]["worker_events"]
        lost = [e for e in events if e["event"] == "lost"]
        ready = [e for e in events if e["event"] == "ready" and lost and e["time"] > lost[0]["time"]]
        rerun_ids = {e["prompt"] for e in events if e["event"] == "rerun"}
        records = [json.loads(line) for line in (work / "runs/loss/trajectories.jsonl").read_text().splitlines()]
        rerun_done = [r["finished_at"] for r in records if r["prompt_id"] in rerun_ids]
        loss["node_loss"] = {
            "detected_after_s": round(lost[0]["time"] - removed_at[0], 2) if lost else None,
            # Node removed -> every rollout it held is in the output again.
            "recovery_s": round(max(rerun_done) - removed_at[0], 2) if rerun_done else None,
            "replacement_ready_after_s": round(ready[0]["time"] - removed_at[0], 2) if ready else None,
            "rerun": loss["ray"]["rerun_after_worker_loss"],
            "duplicates_dropped_by_driver": loss["ray"]["duplicates_dropped"],
        }
        print(json.dumps({k: v for k, v in loss.items() if k != "ray"}), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
        server.terminate()
    for key in ("throughput_per_s", "steady_per_s"):
        base = results[0][key] / results[0]["nodes"]
        for prev, r in zip([None, *results], results):
            r[f"eff_{key}"] = round(r[key] / (base * r["nodes"]), 3)
            if prev is not None:
                step = r[key] / prev[key] / (r["nodes"] / prev["nodes"])
                r[f"step_{key}"] = round(step, 3)
    print(f"\nload average before {load_before}, after {os.getloadavg()} ({os.cpu_count()} CPUs)")
    print(f"{n_prompts} prompts, {concurrency} in flight per node, model call median {a.call_median_s}s")
    print(
        "| nodes | prompts/s (whole run) | eff. vs 1 | eff. per doubling | prompts/s (steady, 10-90%) "
        "| eff. vs 1 | eff. per doubling | p50 s | p95 s | p99 s | last 1% s | dup |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['nodes']} | {r['throughput_per_s']} | {r['eff_throughput_per_s']} "
            f"| {r.get('step_throughput_per_s', '-')} | {r['steady_per_s']} | {r['eff_steady_per_s']} "
            f"| {r.get('step_steady_per_s', '-')} | {r['p50_s']} | {r['p95_s']} | {r['p99_s']} "
            f"| {r['last_1pct_s']} | {r['duplicates_in_output']} |"
        )
    nl = loss["node_loss"]
    print(
        f"\nnode loss at N={n}: detected after {nl['detected_after_s']}s, its rollouts all in the output again "
        f"after {nl['recovery_s']}s, replacement worker ready after {nl['replacement_ready_after_s']}s "
        f"(None: the run ended first), {nl['rerun']} rollouts re-run, {loss['duplicates_in_output']} duplicates "
        f"in the output, {loss['missing']} missing, throughput {loss['throughput_per_s']}/s"
    )
    if a.json:
        a.json.write_text(json.dumps({"results": results, "node_loss": loss}, indent=2))


if __name__ == "__main__":
    print(load_note(), flush=True)  # idle or loaded: how to read the ratios below
    main()
