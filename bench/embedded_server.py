"""Embedded llama.cpp server: startup cost and how generation throughput scales with slots.

Startup is compared with the same run's baseline of spawning a Python that only imports
xllamacpp (what any child-process design pays). Throughput: N concurrent /completion
requests (N = n_parallel slots) against one request at a time, same server, same prompts.

    .venv/bin/python bench/embedded_server.py [--parallel 4] [--tokens 64] [--repeats 3]
"""

from __future__ import annotations

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
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
    main()
