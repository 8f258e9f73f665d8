"""Tool-call parser throughput per family: calls/s and MB/s on a fixed corpus.

The corpus is the same for every family: the same conversations' assistant turns (plain
answers, one call, parallel calls, long file-writing arguments with escapes) written in
each family's markup by `environments.tool_call_parsers.testing`. The baseline, measured
in the same run, is `json.loads` of every call's arguments and nothing else: the least
any parser must do. `x json` is how many times that floor a family costs. `vs 22ffc7b`
is each family's speed over the same family as of commit 22ffc7b, read from git and timed
in the same run, interleaved (above 1.00: faster than then).

    .venv/bin/python -m bench.parsers [--repeats 5] [--min-seconds 0.3] [--quick] [--families mistral,hermes] [--peer DIR]

`--peer DIR` adds a column `vs peer`: DIR holds another project's `environments/tool_call_parsers`
(hermes-agent's, say), timed on the same texts in a process of its own (its package has our
package's import name), one family at a time, alternating with ours. A family whose parser the
peer lacks, or that finds a different number of calls there, prints `-`.

A second table times hostile inputs (thousands of broken or unterminated blocks in one
long text): the worst case per family, with the plain-corpus time per MB for scale. A
parser that is quadratic somewhere shows up here as seconds instead of milliseconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Callable

from bench.machine import load_note
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
                body = "\n".join(
                    f'line {j}: it\'s "quoted" — naïve 日本語 \\ {{json}}' for j in range(rng.randrange(1, 40))
                )
                calls.append(("write_file", {"path": f"src/mod_{i}.py", "content": body}))
            else:
                calls.append(
                    ("configure", {"options": {"depth": i, "flags": [True, False, None]}, "count": i, "ratio": i / 7})
                )
        turns.append((prose, calls))
    return turns


BASELINE_COMMIT = "22ffc7b"
ROOT = Path(__file__).resolve().parent.parent


def baseline_package(commit: str = BASELINE_COMMIT) -> types.ModuleType:
    """environments/tool_call_parsers as of `commit`, imported under a name of its own."""
    where = "environments/tool_call_parsers"
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{commit}:{where}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    tmp = Path(tempfile.mkdtemp(prefix="parsers-baseline-"))
    for name in names:
        if name.endswith(".py"):
            source = subprocess.run(
                ["git", "show", f"{commit}:{where}/{name}"], cwd=ROOT, check=True, capture_output=True
            ).stdout
            (tmp / name).write_bytes(source)
    package = f"bench_baseline_parsers_{commit}"
    spec = importlib.util.spec_from_file_location(package, tmp / "__init__.py", submodule_search_locations=[str(tmp)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[package] = module  # its relative imports resolve through this name
    spec.loader.exec_module(module)
    return module


def timed(fn: Callable[[], object], repeats: int, min_seconds: float) -> float:
    """Median seconds of one fn() over `repeats` timings of at least `min_seconds` each."""
    loops = 1
    while True:
        t0 = time.process_time()
        for _ in range(loops):
            fn()
        if time.process_time() - t0 >= min_seconds:
            break
        loops *= 2
    samples = []
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(loops):
            fn()
        samples.append((time.process_time() - t0) / loops)
    return statistics.median(samples)


def timed_pair(
    fn: Callable[[], object], other: Callable[[], object], repeats: int, min_seconds: float
) -> tuple[float, float]:
    """`timed` of two functions, alternating per repeat so load changes hit both alike."""
    a, b = [], []
    for _ in range(repeats):
        a.append(timed(fn, 1, min_seconds))
        b.append(timed(other, 1, min_seconds))
    return statistics.median(a), statistics.median(b)


# Runs in the peer's tree (cwd DIR, so `environments` is the peer's): one JSON request per line,
# {"name", "texts", "min_seconds"}, answered with {"calls", "seconds"} (seconds null: no such parser).
PEER_WORKER = """
import json, sys, time
from environments.tool_call_parsers import get_parser
for line in sys.stdin:
    req = json.loads(line)
    try:
        parser = get_parser(req["name"])
    except Exception:
        print(json.dumps({"calls": 0, "seconds": None}), flush=True)
        continue
    texts = req["texts"]
    calls = sum(len(parser.parse(t)[1] or ()) for t in texts)
    loops = 1
    while True:
        t0 = time.process_time()
        for _ in range(loops):
            for t in texts:
                parser.parse(t)
        sec = time.process_time() - t0
        if sec >= req["min_seconds"]:
            break
        loops *= 2
    print(json.dumps({"calls": calls, "seconds": sec / loops}), flush=True)
"""

# Our family names where the peer registered the same parser under another name.
PEER_NAMES = {"llama3_json": "llama3_json", "deepseek_v31": "deepseek_v3_1"}


class Peer:
    """The peer's parser package in a process of its own, asked one family at a time."""

    def __init__(self, root: Path) -> None:
        if not (root / "environments" / "tool_call_parsers" / "__init__.py").is_file():
            raise SystemExit(
                f"--peer {root}: no environments/tool_call_parsers/__init__.py there; pass the tree's root"
            )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PEER_WORKER], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def seconds(self, name: str, texts: list[str], min_seconds: float) -> tuple[int, float | None]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"name": PEER_NAMES.get(name, name), "texts": texts, "min_seconds": min_seconds}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("the peer's parser process ended; its error is above")
        answer = json.loads(line)
        return answer["calls"], answer["seconds"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=0.3)
    ap.add_argument("--quick", action="store_true", help="3 repeats of at least 0.1 s, no hostile table")
    ap.add_argument("--families", default=None, help="comma-separated families to time (default: all)")
    ap.add_argument("--peer", type=Path, default=None, help="a tree with another environments/tool_call_parsers")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.min_seconds = 3, 0.1
    old = baseline_package()
    peer = Peer(args.peer.resolve()) if args.peer else None
    print(load_note())

    turns = corpus_calls()
    n_calls = sum(len(c) for _, c in turns)
    arg_texts = [json.dumps(a, ensure_ascii=False) for _, calls in turns for _, a in calls]

    def baseline() -> None:
        for t in arg_texts:
            json.loads(t)

    base = timed(baseline, args.repeats, args.min_seconds)
    print(
        f"corpus: {len(turns)} turns, {n_calls} calls; baseline json.loads of the arguments: {n_calls / base:,.0f} calls/s"
    )
    print()
    header = (
        f"{'family':<14} {'MB':>6} {'calls/s':>11} {'MB/s':>7} {'us/turn':>8} {'x json':>7} {'vs ' + BASELINE_COMMIT:>11}"
        + (f" {'vs peer':>8}" if peer else "")
    )
    print(header)
    print("-" * len(header))
    # qwen: our hermes parser under the name the peer registers for Qwen2.5's (same markup).
    layouts = {**LAYOUTS, "qwen": ("qwen", LAYOUTS["hermes"][1])}
    for family in sorted(layouts) if args.families is None else args.families.split(","):
        name, write = layouts[family]
        texts = [
            (prose + "\n" if prose and calls else prose) + (write(calls) if calls else "") for prose, calls in turns
        ]
        parser = get_parser(name)
        # Correctness first: a fast parser that drops calls would be a meaningless row.
        got = sum(len(parser.parse(t)[1]) for t in texts)
        if got != n_calls:
            raise SystemExit(f"{family}: parsed {got} calls from a corpus of {n_calls}")
        size_mb = sum(len(t.encode()) for t in texts) / 1e6

        old_parser = old.get_parser(name)

        def run(parser=parser, texts=texts) -> None:
            for t in texts:
                parser.parse(t)

        def run_old(parser=old_parser, texts=texts) -> None:
            for t in texts:
                parser.parse(t)

        sec, old_sec = timed_pair(run, run_old, args.repeats, args.min_seconds)
        vs_peer = ""
        if peer:
            ours, theirs = [], []
            for _ in range(args.repeats):  # alternating, so load changes hit both alike
                ours.append(timed(run, 1, args.min_seconds))
                calls, peer_sec = peer.seconds(name, texts, args.min_seconds)
                if peer_sec is None or calls != n_calls:
                    break
                theirs.append(peer_sec)
            vs_peer = f" {statistics.median(theirs) / statistics.median(ours):>7.2f}x" if theirs else f" {'-':>8}"
        print(
            f"{family:<14} {size_mb:>6.2f} {n_calls / sec:>11,.0f} {size_mb / sec:>7.1f} "
            f"{sec / len(texts) * 1e6:>8.1f} {sec / base:>7.1f} {old_sec / sec:>10.2f}x{vs_peer}",
            flush=True,
        )
    if peer:
        peer.close()
    print(load_note())
    if not args.quick:
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
            t0 = time.process_time()
            parser.parse_detailed(text)
            sec = time.process_time() - t0
            if sec > worst[0]:
                worst = (sec, name, sec / (len(text.encode()) / 1e6))
        print(f"{family:<14} {worst[0] * 1e3:>9.1f} {worst[1]:<28} {worst[2] * 1e3:>11.1f}")


if __name__ == "__main__":
    main()
