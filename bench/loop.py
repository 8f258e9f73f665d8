"""The agent loop at scale: N concurrent trajectories in one process, instant model, trivial tool.

Every trajectory makes `--turns` tool turns and then answers; the model and the tool each
answer at once but yield to the event loop once (the least a network round trip costs), so
all N trajectories are alive together. Each configuration runs in a fresh process (its own
heap, GC state and peak RSS). The baseline is a commit as it was (`--baseline`, default 9fb32dd,
the last round's loop): `git archive` puts its tree in build/, this harness is copied into it
and run there in a process of its own, so the baseline's loop runs with its own model types,
tools and registry; only the printed numbers are compared. The baseline runs at 1,000 and 10,000.

    .venv/bin/python -m bench.loop [--quick] [--sizes 1000,10000,65000] [--turns 10] [--gc scaled,cpython] [--repeats 3] [--baseline REF]

Each row is the median of `--repeats` processes. Prints tool-turns/s per wall second and per
CPU second of the process (the second is steadier on a shared machine: other jobs stretch
wall time, not much the CPU time a run needs), the share of wall time spent in the garbage
collector, peak RSS per trajectory, and the ratios the targets are stated in: each size
against this run's first size under the same collector settings (by wall and by CPU time),
and ours against the baseline at 1,000 and 10,000 (the baseline under CPython's own collector
settings, as it ran), with the load average (bench/machine.py: idle or loaded). Each `--gc` profile (environments/gc_tuning.py; `scaled:2` sets its
`middle_share`) is applied the way a runner applies it; `scaled` is what
process/serve/evaluate and batch_runner use unless told otherwise. `--gc off` is no runner's
profile but the ceiling: the collector disabled, so its row shows how flat the loop is without
any collector cost. `GC % CPU` is the collector's share of the process's CPU time, `kept/traj`
the objects the collector tracks per finished trajectory (what a full collection walks at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import shutil
import json
import statistics
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path
from typing import Any

from bench.machine import load_note

BASELINE_COMMIT = "9fb32dd"  # the last round's loop, before tool-argument validation
ROOT = Path(__file__).resolve().parent.parent
SYSTEM = "You are a careful agent. Use the echo tool, then answer."
ARGS = json.dumps({"text": "ping"})


def baseline_tree(commit: str = BASELINE_COMMIT) -> Path:
    """build/bench-baseline-<commit>: the commit's tree (extracted once) with this harness in it."""
    tree = ROOT / "build" / f"bench-baseline-{commit}"
    if not tree.is_dir():
        staging = tree.with_name(f"{tree.name}.{uuid.uuid4().hex[:8]}")  # renamed into place when complete
        staging.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(staging)], input=archive, check=True)
        staging.rename(tree)
    for name in ("loop.py", "machine.py"):  # the same workload and measurement
        shutil.copyfile(Path(__file__).with_name(name), tree / "bench" / name)
    return tree


class InstantModel:
    """A tool call on each of the first `turns` turns, then an answer; one yield per call."""

    def __init__(self, turns: int, opening: int, turn_type: type) -> None:
        self.turns = turns
        self.opening = opening
        self.turn_type = turn_type  # the ModelTurn of the tree being measured

    async def chat(self, messages, tools, *options, **sampling):  # the baseline's loop passes keywords
        ModelTurn = self.turn_type  # noqa: N806 - a class
        await asyncio.sleep(0)
        done = (len(messages) - self.opening) // 2
        if done >= self.turns:
            usage = {"prompt_tokens": 90, "completion_tokens": 3}
            return ModelTurn(content="All done.", finish_reason="stop", usage=usage)
        call = {"id": f"call_{done}", "type": "function", "function": {"name": "echo", "arguments": ARGS}}
        return ModelTurn(
            content=None,
            tool_calls=[call],
            finish_reason="tool_calls",
            usage={"prompt_tokens": 80 + done, "completion_tokens": 12},
        )


class NoExecutor:
    """The echo tool never reaches an executor."""

    workspace = "/"
    python = "python3"


async def echo(args: dict[str, Any], context: Any) -> str:
    await asyncio.sleep(0)
    return args["text"]


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


async def trajectories(loop_module: types.ModuleType, n: int, turns: int) -> list[Any]:
    from tools.context import ToolContext, ToolLimits
    from tools.registry import Tool, ToolRegistry

    registry = ToolRegistry(
        [
            Tool(
                "echo",
                "bench",
                "Echo the text back.",
                {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
                echo,
            )
        ]
    )
    tools = registry.definitions()
    config = loop_module.AgentLoopConfig(max_turns=turns + 1, time_budget_s=3600)
    model = InstantModel(turns, opening=2, turn_type=loop_module.ModelTurn)
    limits, executor = ToolLimits(), NoExecutor()
    runs = []
    for i in range(n):
        ctx = ToolContext(executor, limits, task_id=f"t{i}")
        agent = loop_module.HermesAgentLoop(model, tools, ctx, config, registry)
        runs.append(agent.run([{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"task {i}"}]))
    return await asyncio.gather(*runs)


def worker(impl: str, n: int, turns: int, gc_profile: str) -> dict[str, Any]:
    module = importlib.import_module("environments.agent_loop")  # of the tree this process runs in
    if gc_profile == "off":
        # Not a runner's profile: the ceiling. The collector never runs, so the row shows how flat the
        # loop itself is (event loop, caches, memory) and what share of a size's cost is the collector's.
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            return measure(module, impl, n, turns)
        finally:
            gc.enable()
            gc.unfreeze()
    if impl == "baseline" and not (ROOT / "environments" / "gc_tuning.py").is_file():
        # a baseline that predates environments/gc_tuning.py ran under CPython's collector
        if gc_profile != "cpython":
            raise SystemExit(f"the baseline runs under the cpython collector only, not {gc_profile!r}")
        return measure(module, impl, n, turns)
    from environments.gc_tuning import GCConfig, collector

    profile, _, share = gc_profile.partition(":")  # e.g. scaled:2 (middle_share 2)
    config = GCConfig(profile=profile, **({"middle_share": float(share)} if share else {}))
    with collector(config):
        return measure(module, impl, n, turns)


def measure(module: types.ModuleType, impl: str, n: int, turns: int) -> dict[str, Any]:
    gc.collect()
    rss0 = rss_kb("VmRSS")
    gc_time = [0.0, 0.0, 0.0]  # seconds per generation
    gc_count = [0, 0, 0]
    gc_started = [0.0, 0.0]  # wall, CPU
    gc_cpu = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:  # observes only; the profile sets the thresholds
        if phase == "start":
            gc_started[0], gc_started[1] = time.perf_counter(), time.thread_time()
        else:
            gc_time[info["generation"]] += time.perf_counter() - gc_started[0]
            gc_cpu[0] += time.thread_time() - gc_started[1]
            gc_count[info["generation"]] += 1

    gc.callbacks.append(on_gc)
    tracked0 = len(gc.get_objects())
    t0, c0 = time.perf_counter(), time.process_time()
    results = asyncio.run(trajectories(module, n, turns))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    gc.callbacks.remove(on_gc)
    # What the finished results keep for the collector to walk (the heap a full collection walks at
    # the end of the run, when every trajectory has all its turns).
    kept = (len(gc.get_objects()) - tracked0) / n
    bad = [r.stop_reason for r in results if r.stop_reason != "finished" or r.tool_call_count != turns]
    if bad:
        raise SystemExit(f"{impl} at {n}: {len(bad)} trajectories did not make {turns} tool turns ({bad[0]})")
    return {
        "impl": impl,
        "n": n,
        "turns": turns,
        "wall_s": wall,
        "cpu_s": cpu,
        "tool_turns_per_s": n * turns / wall,
        "tool_turns_per_cpu_s": n * turns / cpu,
        "gc_share": sum(gc_time) / wall,
        "gc_cpu_share": gc_cpu[0] / cpu,
        "full_collections": gc_count[2],
        "gc_s_by_generation": gc_time,
        "collections_by_generation": gc_count,
        "kb_per_trajectory": (rss_kb("VmHWM") - rss0) / n,
        "tracked_per_trajectory": kept,
        "loop_source": module.__file__,
    }


def run_worker(impl: str, n: int, turns: int, gc_profile: str, commit: str = BASELINE_COMMIT) -> dict[str, Any]:
    tree = baseline_tree(commit) if impl == "baseline" else ROOT
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.loop",
            "--worker",
            impl,
            "--n",
            str(n),
            "--turns",
            str(turns),
            "--gc",
            gc_profile,
        ],
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if not Path(result["loop_source"]).resolve().is_relative_to(tree):
        raise SystemExit(f"the {impl} worker ran {result['loop_source']}, not the loop in {tree}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes", default="1000,10000,65000", help="comma-separated trajectory counts; the first is the reference"
    )
    ap.add_argument("--turns", type=int, default=10, help="tool turns per trajectory")
    ap.add_argument("--quick", action="store_true", help="5 tool turns per trajectory (about half the time)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the baseline loop")
    ap.add_argument("--baseline", default=BASELINE_COMMIT, help="git ref whose loop is the baseline")
    ap.add_argument(
        "--gc", default="scaled,cpython", help="collector profiles to run ours under (off: the no-collector ceiling)"
    )
    ap.add_argument("--repeats", type=int, default=3, help="processes per row; the median is reported")
    ap.add_argument("--worker", choices=("current", "baseline"), help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    turns = 5 if args.quick else args.turns
    if args.worker:
        print(json.dumps(worker(args.worker, args.n, turns, args.gc)))
        return

    sizes = [int(s) for s in args.sizes.split(",")]
    profiles = args.gc.split(",")
    print(f"agent loop, instant model, {turns} tool turns per trajectory, one process per row")
    print(load_note())
    print(
        f"{'loop':<9} {'collector':<10} {'trajectories':>12} {'tool-turns/s':>13} {'GC % wall':>9} {'full GCs':>8} "
        f"{'KB/traj':>8} {'vs ' + format(sizes[0], ','):>9} {'turns/CPU s':>11} {'CPU vs ' + format(sizes[0], ','):>13} "
        f"{'GC % CPU':>8} {'kept/traj':>9}"
    )
    rows = {}
    plan = [("current", p, n) for p in profiles for n in sizes]
    baseline_sizes = [n for n in sizes if n in (1_000, 10_000)]
    # The baseline runs under our first profile when its tree has the collector profiles (9fb32dd
    # does: the same collector on both sides), else under CPython's, as it ran.
    has_profiles = (baseline_tree(args.baseline) / "environments" / "gc_tuning.py").is_file()
    base_profile = profiles[0] if has_profiles else "cpython"
    if not args.no_baseline:
        for n in baseline_sizes:  # next to ours at the same size, so load drifts hit both
            plan.insert(plan.index(("current", profiles[0], n)) + 1, ("baseline", base_profile, n))
    for impl, profile, n in plan:
        runs = [run_worker(impl, n, turns, profile, args.baseline) for _ in range(args.repeats)]
        r = sorted(runs, key=lambda r: r["tool_turns_per_s"])[len(runs) // 2]
        r["tool_turns_per_cpu_s"] = statistics.median(x["tool_turns_per_cpu_s"] for x in runs)
        rows[impl, profile, n] = r
        ref = rows.get(("current", profile, sizes[0]), r)
        first, first_cpu = ref["tool_turns_per_s"], ref["tool_turns_per_cpu_s"]
        print(
            f"{impl:<9} {profile:<10} {n:>12,} {r['tool_turns_per_s']:>13,.0f} {r['gc_share'] * 100:>9.1f} "
            f"{r['full_collections']:>8} {r['kb_per_trajectory']:>8.1f} {r['tool_turns_per_s'] / first:>9.2f} "
            f"{r['tool_turns_per_cpu_s']:>11,.0f} {r['tool_turns_per_cpu_s'] / first_cpu:>13.2f} "
            f"{r['gc_cpu_share'] * 100:>8.1f} {r['tracked_per_trajectory']:>9.1f}",
            flush=True,
        )
    for n in baseline_sizes:
        base = rows.get(("baseline", base_profile, n))
        for profile in profiles:
            ours = rows.get(("current", profile, n))
            if base and ours:
                ratio = ours["tool_turns_per_s"] / base["tool_turns_per_s"]
                cpu_ratio = ours["tool_turns_per_cpu_s"] / base["tool_turns_per_cpu_s"]
                print(
                    f"ours ({profile} collector) / {args.baseline} ({base_profile} collector) "
                    f"at {n:,} trajectories: {ratio:.2f}x (per CPU second: {cpu_ratio:.2f}x)"
                )
    print(load_note())


if __name__ == "__main__":
    main()
