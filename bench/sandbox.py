"""Sandbox slot timings, all measured in one run (`python -m bench.sandbox`, from the repository root).

Prints
- slot exec round trip (p50/p95) of a trivial command, vs the same command as a plain
  local subprocess (no HTTP, no bubblewrap) measured here as the baseline;
- execs/s with 32 slots (4 sandbox_server processes x 8 slots) busy at once, vs 32
  concurrent plain subprocesses;
- slot acquire+release(reset) vs starting (and stopping) a fresh sandbox_server;
- the same bench of the implementation before the untrusted-agents issue (git 22ffc7b, exported
  under build/ or given with --old-src), run right after in a subprocess: new vs old.
With --repeat N the new/old pair runs N times (alternated) and the summary gives min/median.

With --docker (`python -m bench.sandbox --docker`, a Docker engine and build/hermes-runtime needed) it
measures the local and the docker backend in the same run, 4 sandboxes x 8 slots each: time to a
ready pool (start until every slot's namespace is up), exec p50 of `true` in one slot, execs/s with
32 slots busy; and prints docker/local ratios.

With --attack (`python -m bench.sandbox --attack`, from the repository root) it measures instead slot B's exec p50 while slot A runs a fork bomb, then a
memory hog, against B's p50 on an idle server (same run). The fork bomb runs inside an outer
pids cgroup (needs root and cgroup v1 pids), so a regression cannot take the machine down.
"""

from __future__ import annotations

from bench.machine import load_note

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from backends.local import LocalBackendConfig, local_backend
from backends.process import start_sandbox_process
from slots.client import SandboxAddress, SandboxClient
from slots.pool import SlotPoolConfig
from sandbox_server.procs import run_command


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def ms(x: float) -> str:
    return f"{x * 1000:8.1f} ms"


async def execute(backend, slot, command: str, timeout: float = 30):
    return await backend.executor(slot).exec(command, timeout=timeout, max_output_bytes=1000)


async def timed(coro) -> float:
    t = time.perf_counter()
    await coro
    return time.perf_counter() - t


def cpu_seconds(backend) -> dict[str, float]:
    """CPU used so far by this process (the client), the sandbox_servers, their slots' exec servers,
    and the commands those reaped (user + system, from /proc; bwrap's own share is left out)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    servers = {proc.pid for proc in backend.provider._procs.values()}
    tree, todo = set(), list(servers)
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += [p for p, pp in parent.items() if pp == pid and p not in tree]
    out = {"client": sum(os.times()[:2]), "servers": 0.0, "exec servers": 0.0, "commands": 0.0}
    for pid in tree:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        own, reaped = (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick
        if pid in servers:
            out["servers"] += own
        elif b"--serve" in cmdline:  # hermes-spawn --serve
            # its own time from schedstat (ns): a C server's share per process is below a clock tick
            out["exec servers"] += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
            out["commands"] += reaped
    return out


async def settled(backend) -> None:
    """Wait until every slot's namespace and exec server is up (/health `ready`), so start-up work
    (32 bwrap namespaces and exec servers) does not share the CPU with the timed calls."""
    for sb in backend._sandboxes.values():
        while not all(s.get("ready", True) for s in (await sb.client.health())["slots"]):
            await asyncio.sleep(0.05)


async def main(n_round_trips: int, per_slot: int, fresh_runs: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    pool = SlotPoolConfig(slots_per_sandbox=8, min_sandboxes=4, max_sandboxes=4, health_interval_s=60)
    backend = local_backend(LocalBackendConfig(pool=pool, data_root=str(root / "pool")))
    await backend.start()
    (root / "plain").mkdir()

    class Plain:  # a plain local subprocess through the same runner: no namespaces, no HTTP
        @staticmethod
        async def exec(command: str, **kw):
            return await run_command(
                ["bash", "-c", command], cwd=str(root / "plain"), env={"PATH": "/usr/bin:/bin"}, **kw
            )

    local = Plain()
    call = "true"
    try:
        # 1. round trip, one slot, sequential
        slot = await backend.acquire()
        await settled(backend)
        for _ in range(5):
            await execute(backend, slot, call)  # warm up connections
        slot_rt = [await timed(execute(backend, slot, call)) for _ in range(n_round_trips)]
        plain_rt = [await timed(local.exec("true", timeout=30, max_output_bytes=1000)) for _ in range(n_round_trips)]
        await backend.release(slot)

        # 2. throughput, 32 slots busy at once
        slots = [await backend.acquire() for _ in range(32)]
        await settled(backend)  # (the slot released above got a new namespace)
        sandboxes = list(backend._sandboxes.values())
        batches0 = sum(sb.batcher.batches_sent for sb in sandboxes)
        calls0 = sum(sb.batcher.calls_sent for sb in sandboxes)

        async def worker(s) -> None:
            for _ in range(per_slot):
                r = await execute(backend, s, call)
                assert r.exit_code == 0, r

        cpu0 = cpu_seconds(backend)
        t = time.perf_counter()
        await asyncio.gather(*(worker(s) for s in slots))
        slot_tput = 32 * per_slot / (time.perf_counter() - t)
        cpu = {k: (v - cpu0[k]) / (32 * per_slot) for k, v in cpu_seconds(backend).items()}

        async def plain_worker() -> None:
            for _ in range(per_slot):
                await local.exec("true", timeout=30, max_output_bytes=1000)

        times0 = os.times()
        t = time.perf_counter()
        await asyncio.gather(*(plain_worker() for _ in range(32)))
        plain_tput = 32 * per_slot / (time.perf_counter() - t)
        # this process and the commands it reaped (bash and its start), per command
        plain_cpu = (sum(os.times()[:4]) - sum(times0[:4])) / (32 * per_slot)
        batches = sum(sb.batcher.batches_sent for sb in sandboxes) - batches0
        calls = sum(sb.batcher.calls_sent for sb in sandboxes) - calls0
        for s in slots:
            await backend.release(s)

        # 3. acquire + reset (release) vs a fresh sandbox_server
        async def cycle() -> None:
            s = await backend.acquire()
            await execute(backend, s, "mkdir -p a/b && echo x > a/b/f")
            t0 = time.perf_counter()
            await backend.release(s)
            s = await backend.acquire()
            cycle_times.append(time.perf_counter() - t0)
            await backend.release(s)

        cycle_times: list[float] = []
        for _ in range(20):
            await cycle()

        fresh: list[float] = []
        import aiohttp

        async with aiohttp.ClientSession() as http:
            for i in range(fresh_runs):
                t0 = time.perf_counter()
                proc = await start_sandbox_process(data_dir=root / f"fresh-{i}", slots=8)
                client = SandboxClient(SandboxAddress("fresh", proc.url, proc.token), http)
                await client.health()
                fresh.append(time.perf_counter() - t0)
                await proc.stop()
    finally:
        await backend.stop()

    print("sandbox slots, local backend (4 sandbox_server x 8 slots, one bwrap namespace per slot)")
    print(f"  exec round trip, 1 slot ({n_round_trips}x `true`)")
    print(f"    slot  p50 {ms(statistics.median(slot_rt))}   p95 {ms(pct(slot_rt, 0.95))}")
    print(
        f"    plain p50 {ms(statistics.median(plain_rt))}   p95 {ms(pct(plain_rt, 0.95))}   (local subprocess, baseline)"
    )
    print(f"    ratio slot/plain p50: {statistics.median(slot_rt) / statistics.median(plain_rt):.2f}x")
    print(f"  throughput, 32 slots busy ({32 * per_slot} execs)")
    print(f"    slot  {slot_tput:8.1f} execs/s   ({calls} calls in {batches} batch requests)")
    print(f"    plain {plain_tput:8.1f} execs/s   (32 concurrent local subprocesses, baseline)")
    print(f"    ratio slot/plain: {slot_tput / plain_tput:.2f}x")
    print("    CPU per exec: " + ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in cpu.items()))
    slot_cpu = sum(cpu.values())
    print(f"    CPU per exec, all processes: slot {slot_cpu * 1000:.2f} ms, plain {plain_cpu * 1000:.2f} ms", end="")
    print(f" (slot/plain {slot_cpu / plain_cpu:.2f}x)")
    print("  getting a clean workspace")
    print(f"    slot release(reset)+acquire p50 {ms(statistics.median(cycle_times))}  p95 {ms(pct(cycle_times, 0.95))}")
    print(f"    fresh sandbox_server start  p50 {ms(statistics.median(fresh))}  ({fresh_runs} runs)")
    print(f"    ratio fresh/slot: {statistics.median(fresh) / statistics.median(cycle_times):.1f}x")
    return {
        "slot_p50": statistics.median(slot_rt),
        "plain_p50": statistics.median(plain_rt),
        "slot_tput": slot_tput,
        "plain_tput": plain_tput,
        "slot_cpu": slot_cpu,
        "plain_cpu": plain_cpu,
    }


def old_source(ref: str) -> Path:
    """The repository at `ref`, exported once under build/ (git archive; read-only use)."""
    repo = Path(__file__).resolve().parent.parent
    dest = repo / "build" / f"bench-old-{ref}"
    if not (dest / "bench" / "sandbox.py").exists():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(repo), "archive", ref], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    # The old tree gets its own spawn helper, as its setup would build it (else it measures the slower fallback).
    helper = dest / "sandbox_server" / "build_spawn_helper.sh"
    if helper.exists() and not (dest / "sandbox_server" / "hermes-spawn").exists():
        subprocess.run(["bash", str(helper), str(dest / "sandbox_server" / "hermes-spawn")], cwd=dest, check=True)
    return dest


def run_old(src: Path, n_round_trips: int, per_slot: int) -> dict[str, float]:
    """The old implementation's own bench (its server, client and batcher), in a subprocess."""
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [
        sys.executable,
        "-m",
        "bench.sandbox",
        "--round-trips",
        str(n_round_trips),
        "--per-slot",
        str(per_slot),
        "--fresh-runs",
        "1",
    ]
    if "--no-old" in (src / "bench" / "sandbox.py").read_text():
        argv.append("--no-old")  # the old bench would otherwise export and run its own predecessor
    out = subprocess.run(argv, cwd=src, env=env, check=True, capture_output=True, text=True).stdout
    print("  old implementation (" + str(src) + "):")
    print("\n".join("    " + line for line in out.splitlines()[1:9]))

    def num(pattern: str) -> float:
        m = re.search(pattern, out)
        if m is None:
            raise SystemExit(f"could not read {pattern!r} from the old bench's output:\n{out}")
        return float(m.group(1))

    return {
        "slot_p50": num(r"slot\s+p50\s+([\d.]+) ms") / 1000,
        "plain_p50": num(r"plain p50\s+([\d.]+) ms") / 1000,
        "slot_tput": num(r"slot\s+([\d.]+) execs/s"),
        "plain_tput": num(r"plain\s+([\d.]+) execs/s"),
    }


def summary(pairs: list[tuple[dict[str, float], dict[str, float] | None]]) -> None:
    def line(name: str, values: list[float], fmt: str, target: str = "") -> None:
        print(f"  {name:44s} min {fmt.format(min(values))}  median {fmt.format(statistics.median(values))}  {target}")

    new = [n for n, _ in pairs]
    print(f"summary over {len(pairs)} run(s); {load_note()}")
    line("slot exec p50 (ms)", [n["slot_p50"] * 1000 for n in new], "{:6.2f}", "(target <= 3 ms, idle)")
    line(
        "32-slot throughput, slot / plain",
        [n["slot_tput"] / n["plain_tput"] for n in new],
        "{:5.2f}x",
        "(target >= 1.0x)",
    )
    line("CPU per exec, all processes, slot / plain", [n["slot_cpu"] / n["plain_cpu"] for n in new], "{:5.2f}x")
    old = [(n, o) for n, o in pairs if o is not None]
    if old:
        line("new vs old: exec p50, old / new", [o["slot_p50"] / n["slot_p50"] for n, o in old], "{:5.2f}x")
        line("new vs old: 32-slot throughput, new / old", [n["slot_tput"] / o["slot_tput"] for n, o in old], "{:5.2f}x")


async def measure_backend(backend, n_round_trips: int, per_slot: int) -> dict[str, float]:
    """Time to a ready pool, exec p50 in one slot, and 32-slot throughput of one backend (stopped after)."""
    t0 = time.perf_counter()
    await backend.start()
    try:
        await settled(backend)
        ready = time.perf_counter() - t0
        slot = await backend.acquire()
        for _ in range(5):
            await execute(backend, slot, "true")
        rt = [await timed(execute(backend, slot, "true")) for _ in range(n_round_trips)]
        await backend.release(slot)
        slots = [await backend.acquire() for _ in range(32)]
        await settled(backend)

        async def worker(s) -> None:
            for _ in range(per_slot):
                r = await execute(backend, s, "true")
                assert r.exit_code == 0, r

        t = time.perf_counter()
        await asyncio.gather(*(worker(s) for s in slots))
        tput = 32 * per_slot / (time.perf_counter() - t)
        for s in slots:
            await backend.release(s)
    finally:
        await backend.stop()
    return {"ready_s": ready, "p50": statistics.median(rt), "p95": pct(rt, 0.95), "tput": tput}


async def compare_docker(n_round_trips: int, per_slot: int, image: str, engine: str) -> None:
    from backends.docker import DockerBackendConfig, docker_backend

    pool = SlotPoolConfig(slots_per_sandbox=8, min_sandboxes=4, max_sandboxes=4, health_interval_s=60)
    root = Path(tempfile.mkdtemp(prefix="bench-sandbox-docker-"))
    local = await measure_backend(
        local_backend(LocalBackendConfig(pool=pool, data_root=str(root))), n_round_trips, per_slot
    )
    docker_config = DockerBackendConfig(
        pool=pool, image=image, engine=engine, pull="never", labels={"hermes-rl.bench": "sandbox"}
    )
    docker = await measure_backend(docker_backend(docker_config), n_round_trips, per_slot)
    print(f"sandbox backends, same run: 4 sandboxes x 8 slots each (docker: {image}, runtime mounted)")
    print(f"  {'':34s} {'local':>12s} {'docker':>12s}   docker/local")
    rows = [
        ("time to a ready pool", "ready_s", lambda v: f"{v:10.2f} s"),
        (f"exec p50, 1 slot ({n_round_trips}x `true`)", "p50", ms),
        ("exec p95, 1 slot", "p95", ms),
        (f"32 slots busy ({32 * per_slot} execs)", "tput", lambda v: f"{v:6.1f} exec/s"),
    ]
    for name, key, fmt in rows:
        print(f"  {name:34s} {fmt(local[key]):>12s} {fmt(docker[key]):>12s}   {docker[key] / local[key]:5.2f}x")


async def attack(n: int) -> None:
    from sandbox_server.isolation import SlotLimits
    from tests.security.conftest import outer_process_limit

    limits = SlotLimits(max_processes=200, max_memory_bytes=1024 * 1024 * 1024)
    root = Path(tempfile.mkdtemp(prefix="bench-sandbox-attack-"))
    pool = SlotPoolConfig(slots_per_sandbox=2, min_sandboxes=1, max_sandboxes=1, health_interval_s=60)
    results: dict[str, float] = {}
    attacks = {
        "fork bomb": "bomb() { bomb | bomb & }; bomb; sleep 120",
        "memory hog": "python3 -c \"\nwhile True:\n  try: b = b'x' * (900 * 2**20); del b\n  except MemoryError: pass\"",
    }
    with outer_process_limit(1500):
        backend = local_backend(LocalBackendConfig(pool=pool, data_root=str(root), limits=limits))
        await backend.start()
        try:
            a, b = await backend.acquire(), await backend.acquire()
            call = "true"
            for _ in range(5):
                await execute(backend, b, call)
            results["idle"] = statistics.median([await timed(execute(backend, b, call)) for _ in range(n)])
            for name, command in attacks.items():
                hog = asyncio.create_task(execute(backend, a, command, timeout=120))
                await asyncio.sleep(3)  # let it fill what it can
                results[name] = statistics.median([await timed(execute(backend, b, call)) for _ in range(n)])
                await backend.release(a)  # reset kills it
                await asyncio.gather(hog, return_exceptions=True)
                a = await backend.acquire()
        finally:
            await backend.stop()
    print(f"slot B exec p50 while slot A attacks ({n}x `true`; limits: 200 processes, 1 GiB per process)")
    for name, value in results.items():
        print(f"  {name:11s} p50 {ms(value)}   ratio to idle: {value / results['idle']:.2f}x")


if __name__ == "__main__":
    print(load_note(), flush=True)  # idle or loaded: how to read the ratios below
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--round-trips", type=int, default=200)
    # 40 calls per slot (1,280 in all, about 2 s): long enough that the run is the steady state, not the
    # pool's first connections and the first batches (10 per slot gave 0.4 s runs that moved +-10%).
    ap.add_argument("--per-slot", type=int, default=40, help="execs per slot in the 32-slot throughput run")
    ap.add_argument("--fresh-runs", type=int, default=5)
    ap.add_argument("--attack", action="store_true", help="slot B's latency under a fork bomb / memory hog in slot A")
    ap.add_argument("--docker", action="store_true", help="the docker backend beside the local one, same run")
    ap.add_argument("--docker-image", default="debian:bookworm", help="image the docker sandboxes run in")
    ap.add_argument("--docker-engine", default="unix:///var/run/docker.sock", help="engine API address")
    ap.add_argument("--repeat", type=int, default=1, help="new/old pairs to run (summary: min and median)")
    ap.add_argument("--old-ref", default="22ffc7b", help="git revision of the old implementation")
    ap.add_argument("--old-src", help="a checkout of the old implementation (instead of exporting --old-ref)")
    ap.add_argument("--no-old", action="store_true", help="skip the old implementation")
    ns = ap.parse_args()
    if ns.attack:
        asyncio.run(attack(ns.round_trips))
    elif ns.docker:
        asyncio.run(compare_docker(ns.round_trips, ns.per_slot, ns.docker_image, ns.docker_engine))
    else:
        src = None if ns.no_old else Path(ns.old_src) if ns.old_src else old_source(ns.old_ref)
        pairs = []
        for _ in range(ns.repeat):
            new = asyncio.run(main(ns.round_trips, ns.per_slot, ns.fresh_runs))
            pairs.append((new, run_old(src, ns.round_trips, ns.per_slot) if src else None))
        summary(pairs)
