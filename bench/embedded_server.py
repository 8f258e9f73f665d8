"""Embedded llama.cpp server: startup cost and how generation throughput scales with slots.

Startup is compared with the same run's baseline of spawning a Python that only imports
xllamacpp (what any child-process design pays). Throughput: N concurrent /completion
requests (N = n_parallel slots) against one request at a time, same server, same prompts.
`--contention`: generation with one core kept busy by another process, at libgomp's default
spin count (the baseline) and at `EmbeddedLLMConfig.omp_spin_count`, each also idle.

    .venv/bin/python bench/embedded_server.py [--parallel 4] [--tokens 64] [--repeats 3] [--contention]
"""

from __future__ import annotations

from bench.machine import load_note

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

import httpx

from embedded_llm import EmbeddedLLM, EmbeddedLLMConfig


def time_import_baseline() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import xllamacpp"], check=True)
    return time.perf_counter() - started


def time_startup(config: EmbeddedLLMConfig) -> tuple[float, float]:
    llm = EmbeddedLLM(config)
    started = time.perf_counter()
    llm.start()
    up = time.perf_counter() - started
    started = time.perf_counter()
    llm.stop()
    return up, time.perf_counter() - started


async def generate(client: httpx.AsyncClient, prompt: str, tokens: int, seed: int) -> int:
    r = await client.post(
        "/completion",
        json={"prompt": prompt, "n_predict": tokens, "ignore_eos": True, "seed": seed, "cache_prompt": False},
    )
    r.raise_for_status()
    return int(r.json()["tokens_predicted"])


async def throughput(llm: EmbeddedLLM, concurrency: int, requests: int, tokens: int) -> float:
    prompts = [f"Write a short story about robot number {i}." for i in range(requests)]
    async with httpx.AsyncClient(base_url=llm.server_url, timeout=600) as client:
        started = time.perf_counter()
        done = 0
        for i in range(0, requests, concurrency):
            batch = prompts[i : i + concurrency]
            done += sum(await asyncio.gather(*(generate(client, p, tokens, i + j) for j, p in enumerate(batch))))
        return done / (time.perf_counter() - started)


LIBGOMP_DEFAULT_SPINS = 300_000  # GOMP_SPINCOUNT when neither it nor OMP_WAIT_POLICY is set


def contention(threads: int, tokens: int) -> None:
    ours = EmbeddedLLMConfig().omp_spin_count
    rates = {}
    for spins in (LIBGOMP_DEFAULT_SPINS, ours):
        with EmbeddedLLM(EmbeddedLLMConfig(n_parallel=1, threads=threads, omp_spin_count=spins)) as llm:
            idle = asyncio.run(throughput(llm, 1, 2, tokens))
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                busy = asyncio.run(throughput(llm, 1, 2, tokens))
            finally:
                hog.kill()
                hog.wait()
        rates[spins] = (idle, busy)
        print(f"{threads} threads, {spins} spins: idle {idle:.1f} tok/s, one core busy {busy:.1f} tok/s")
    (base_idle, base_busy), (our_idle, our_busy) = rates[LIBGOMP_DEFAULT_SPINS], rates[ours]
    print(
        f"{ours} spins vs libgomp's default: idle {our_idle / base_idle:.2f}x, one core busy {our_busy / base_busy:.1f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contention", action="store_true", help="only the busy-core comparison (about a minute)")
    args = ap.parse_args()
    if args.contention:
        contention(args.threads, min(args.tokens, 16))
        return
    config = EmbeddedLLMConfig(n_parallel=args.parallel, threads=args.threads)

    baseline = statistics.median(time_import_baseline() for _ in range(args.repeats))
    runs = [time_startup(config) for _ in range(args.repeats)]
    up = statistics.median(r[0] for r in runs)
    down = statistics.median(r[1] for r in runs)
    print(f"import-only child baseline: {baseline:.2f}s")
    print(f"startup until /health answers: {up:.2f}s  ({up / baseline:.1f}x baseline)   stop: {down:.2f}s")

    with EmbeddedLLM(config) as llm:
        requests = args.parallel * 2
        sequential = asyncio.run(throughput(llm, 1, requests, args.tokens))
        concurrent = asyncio.run(throughput(llm, args.parallel, requests, args.tokens))
    print(f"generation, 1 request at a time: {sequential:.1f} tok/s")
    print(f"generation, {args.parallel} concurrent (slots): {concurrent:.1f} tok/s  ({concurrent / sequential:.2f}x)")


if __name__ == "__main__":
    print(load_note(), flush=True)  # idle or loaded: how to read the ratios below
    main()
