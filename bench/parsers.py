"""Tool-call parser throughput per family: calls/s and MB/s on a fixed corpus.

The corpus is the same for every family: the same conversations' assistant turns (plain
answers, one call, parallel calls, long file-writing arguments with escapes) written in
each family's markup by `environments.tool_call_parsers.testing`. The baseline, measured
in the same run, is `json.loads` of every call's arguments and nothing else: the least
any parser must do. `x json` is how many times that floor a family costs.

    .venv/bin/python bench/parsers.py [--repeats 5] [--min-seconds 0.3]

A second table times hostile inputs (thousands of broken or unterminated blocks in one
long text): the worst case per family, with the plain-corpus time per MB for scale. A
parser that is quadratic somewhere shows up here as seconds instead of milliseconds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Callable

from environments.tool_call_parsers import get_parser
from environments.tool_call_parsers.testing import LAYOUTS, Call


def corpus_calls(seed: int = 7) -> list[tuple[str, list[Call]]]:
    """(prose, calls) turns: a fixed mix of answers and calls, reproducible from the seed."""
    rng = random.Random(seed)
    words = "the weather file path config value tool answer result paris tokyo quick check".split()
    turns: list[tuple[str, list[Call]]] = []
    for i in range(200):
        prose = " ".join(rng.choice(words) for _ in range(rng.randrange(0, 25)))
        kind = i % 5
        if kind == 0:
            turns.append((prose or "Done.", []))
            continue
        calls: list[Call] = []
        for _ in range(1 if kind in (1, 2) else rng.randrange(2, 5)):
            pick = rng.randrange(3)
            if pick == 0:
                calls.append(("get_weather", {"city": rng.choice(["Paris", "Tokyo", "São Paulo"]), "unit": "celsius"}))
            elif pick == 1:
                body = "\n".join(f"line {j}: it's \"quoted\" — naïve 日本語 \\ {{json}}" for j in range(rng.randrange(1, 40)))
                calls.append(("write_file", {"path": f"src/mod_{i}.py", "content": body}))
            else:
                calls.append(("configure", {"options": {"depth": i, "flags": [True, False, None]}, "count": i, "ratio": i / 7}))
        turns.append((prose, calls))
    return turns


def timed(fn: Callable[[], object], repeats: int, min_seconds: float) -> float:
    """Median seconds of one fn() over `repeats` timings of at least `min_seconds` each."""
    loops = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        if time.perf_counter() - t0 >= min_seconds:
            break
        loops *= 2
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        samples.append((time.perf_counter() - t0) / loops)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=0.3)
    args = ap.parse_args()

    turns = corpus_calls()
    n_calls = sum(len(c) for _, c in turns)
    arg_texts = [json.dumps(a, ensure_ascii=False) for _, calls in turns for _, a in calls]

    def baseline() -> None:
        for t in arg_texts:
            json.loads(t)

    base = timed(baseline, args.repeats, args.min_seconds)
    print(f"corpus: {len(turns)} turns, {n_calls} calls; baseline json.loads of the arguments: {n_calls / base:,.0f} calls/s")
    print()
    header = f"{'family':<14} {'MB':>6} {'calls/s':>11} {'MB/s':>7} {'us/turn':>8} {'x json':>7}"
    print(header)
    print("-" * len(header))
    for family in sorted(LAYOUTS):
        name, write = LAYOUTS[family]
        texts = [(prose + "\n" if prose and calls else prose) + (write(calls) if calls else "") for prose, calls in turns]
        parser = get_parser(name)
        # Correctness first: a fast parser that drops calls would be a meaningless row.
        got = sum(len(parser.parse(t)[1]) for t in texts)
        if got != n_calls:
            raise SystemExit(f"{family}: parsed {got} calls from a corpus of {n_calls}")
        size_mb = sum(len(t.encode()) for t in texts) / 1e6

        def run(parser=parser, texts=texts) -> None:
            for t in texts:
                parser.parse(t)

        sec = timed(run, args.repeats, args.min_seconds)
        print(
            f"{family:<14} {size_mb:>6.2f} {n_calls / sec:>11,.0f} {size_mb / sec:>7.1f} "
            f"{sec / len(texts) * 1e6:>8.1f} {sec / base:>7.1f}"
        )
    hostile_table()


def hostile_inputs() -> dict[str, str]:
    """~100-300 KB texts made of one broken construct repeated (each family's and others')."""
    return {
        "unclosed JSON + closers": ('{"a": [' * 200 + "</tool_call>") * 50,
        "opening tags only": "<tool_call>" * 20_000,
        "truncated JSON lines": "[\n" + '  {"name": "x", "parameters": {"k": [1,2,3]},\n' * 2000,
        "brackets": "[" * 50_000,
        "deep call list": "[f(a=" + "[" * 3000,
        "kimi unterminated calls": "<|tool_calls_section_begin|>"
        + "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{" * 5000,
        "harmony headers": "<|start|>assistant<|message|>" * 10_000,
        "mistral broken calls": "[TOOL_CALLS]f[ARGS]{" * 10_000,
        "qwen3 unterminated params": "<function=f>" + "<parameter=a>x" * 10_000,
        "glm unterminated values": "<tool_call>f" + "<arg_key>a</arg_key><arg_value>" * 10_000,
    }


def hostile_table() -> None:
    inputs = hostile_inputs()
    print()
    header = f"{'family':<14} {'worst ms':>9} {'worst input':<28} {'ms/MB there':>11}"
    print(header)
    print("-" * len(header))
    for family in sorted(LAYOUTS):
        parser = get_parser(LAYOUTS[family][0])
        worst = (0.0, "", 0.0)
        for name, text in inputs.items():
            t0 = time.perf_counter()
            parser.parse_detailed(text)
            sec = time.perf_counter() - t0
            if sec > worst[0]:
                worst = (sec, name, sec / (len(text.encode()) / 1e6))
        print(f"{family:<14} {worst[0] * 1e3:>9.1f} {worst[1]:<28} {worst[2] * 1e3:>11.1f}")


if __name__ == "__main__":
    main()
