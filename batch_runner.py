"""Run the agent over a prompt file, for SFT (or token-level) data at scale.

    python batch_runner.py --dataset_file prompts.jsonl --run_name NAME       # the embedded model
    python batch_runner.py --dataset_file prompts.jsonl --run_name NAME \
        --model M --base_url http://127.0.0.1:8000/v1 [--concurrency 8] [--distribution default]
    python batch_runner.py ... --token_server auto       # token mode: exact ids, masks, logprobs
    python batch_runner.py ... --run_name NAME --resume          # continue a killed run

It is a loop over the same composition root as the envs (environments/runtime.py): same
model clients, tool backends, registry, retries and agent-loop defaults.

Each line of the dataset is `{"prompt": "...", "id": "...", "toolsets": [...]}` (`id` and
`toolsets` optional; without an id a prompt is known by its line number). Toolsets per
prompt are sampled from a named distribution, seeded by the run seed and the prompt id,
so a resumed run offers a prompt the same tools. Tools run in a fresh local workspace per
prompt, or in a sandbox slot with `--tool_backend sandbox`.

Output, in runs/NAME/: `trajectories.jsonl` (one line per prompt, written as it finishes),
`stats.json` (per-tool call counts and error rates, turns, tokens, wall time),
`run_config.json`, and `infra_failures.jsonl` (prompts whose model server or workspace
failed on every attempt; they are not in the output, so `--resume` runs them again).

Exactly once: a line is appended with a single write() and ends in a newline; `--resume`
cuts a torn last line (a kill in the middle of a write), skips every prompt already in
the output and runs the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from collections.abc import Callable
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, SecretStr

from environments.agent_loop import AgentLoopConfig, AgentResult
from environments.gc_tuning import GCConfig, collector
from environments.jsonl import jsonl_lines
from environments.models.base import ChatModel
from environments.models.chat_mode import PLACEHOLDER_API_KEY
from environments.models.token_mode.wiring import TokenServerChoice, trace_items
from environments.runtime import (
    EMBEDDED,
    EMBEDDED_MODEL_NAME,
    AgentRuntime,
    HermesEnvError,
    ModelServer,
    Rollout,
    RuntimeConfig,
)
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.tool_backend import LocalToolBackendConfig
from tools.context import ToolLimits
from tools.web import WebConfig

__all__ = ["BatchConfig", "DISTRIBUTIONS", "sample_toolsets", "load_prompts", "run_batch", "main"]

# Probability that each toolset is offered to a prompt. Names are public API (--distribution).
DISTRIBUTIONS: MappingProxyType[str, MappingProxyType[str, float]] = MappingProxyType(
    {
        name: MappingProxyType(dist)
        for name, dist in {
            "default": {"terminal": 1.0, "file": 1.0, "python": 1.0, "web": 1.0},
            "research": {"web": 1.0, "python": 0.6, "file": 0.4},
            "coding": {"terminal": 1.0, "file": 1.0, "python": 0.8},
            "math": {"python": 1.0},
            "mixed": {"terminal": 0.5, "file": 0.5, "python": 0.5, "web": 0.5},
        }.items()
    }
)

_LOOP = AgentLoopConfig()

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant that can use tools. Call a tool when it helps; when you are done, "
    "answer the user directly."
)


class BatchConfig(BaseModel):
    dataset_file: Path
    run_name: str = Field(min_length=1)
    model: str = EMBEDDED_MODEL_NAME
    base_url: str = Field(EMBEDDED, description="OpenAI-compatible base URL, or 'embedded' for the bundled model")
    token_server: TokenServerChoice = Field(
        "off", description="token mode on request: the server's token protocol (auto: llamacpp for the embedded model)"
    )
    api_key: SecretStr | None = Field(
        None, description="Model server key (default: $OPENAI_API_KEY, else a placeholder)"
    )
    output_dir: Path = Path("runs")
    resume: bool = False
    concurrency: int = Field(8, ge=1)
    distribution: str = "default"
    seed: int = 0
    # The agent loop's defaults, shared with the envs.
    max_turns: int = Field(_LOOP.max_turns, ge=1)
    max_tokens: int | None = Field(_LOOP.max_tokens, ge=1)
    temperature: float = Field(_LOOP.temperature, ge=0)
    time_budget_s: float = Field(_LOOP.time_budget_s, gt=0)
    max_attempts: int = Field(3, ge=1, description="Tries per prompt when the infrastructure fails")
    retry_backoff_s: float = Field(1.0, ge=0)
    max_consecutive_failures: int = Field(
        10, ge=1, description="Prompts in a row lost to infrastructure errors before the run stops (server down)"
    )
    request_timeout_s: float = Field(120.0, gt=0)
    request_retries: int = Field(2, ge=0, description="Retries of one HTTP request inside the client")
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tool_call_parser: str | None = "hermes"
    extra_body: dict[str, Any] = Field(default_factory=dict)
    tool_limits: ToolLimits = Field(default_factory=ToolLimits)
    tool_backend: Literal["local", "sandbox"] = Field(
        "local", description="Where tools run: local processes or sandbox slots"
    )
    workspace: LocalToolBackendConfig = Field(default_factory=LocalToolBackendConfig)
    sandbox: SandboxToolBackendConfig = Field(default_factory=SandboxToolBackendConfig)
    web: WebConfig = Field(default_factory=WebConfig)
    gc: GCConfig = Field(default_factory=GCConfig, description="Collector settings while the prompts run")
    progress_interval_s: float = Field(0.5, gt=0)

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.run_name

    def resolved_api_key(self) -> str:
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        return os.environ.get("OPENAI_API_KEY") or PLACEHOLDER_API_KEY

    def runtime_config(self) -> RuntimeConfig:
        server = ModelServer(
            base_url=self.base_url, model=self.model, api_key=self.resolved_api_key(), timeout_s=self.request_timeout_s
        )
        loop = AgentLoopConfig(
            max_turns=self.max_turns,
            time_budget_s=self.time_budget_s,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
        )
        return RuntimeConfig(
            servers=[server],
            token_server=self.token_server,
            tool_call_parser=self.tool_call_parser,
            extra_body=self.extra_body,
            model_max_retries=self.request_retries,
            loop=loop,
            tool_limits=self.tool_limits,
            tool_backend=self.tool_backend,
            workspace=self.workspace,
            sandbox=self.sandbox,
            web=self.web,
        )


class BatchError(RuntimeError):
    """A problem the user must fix; printed without a traceback."""


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    toolsets: list[str] | None
    extra: dict[str, Any]


def load_prompts(path: Path) -> list[Prompt]:
    if not path.is_file():
        raise BatchError(f"--dataset_file {str(path)!r} does not exist")
    prompts, seen = [], set()
    for n, line in jsonl_lines(path.read_text(encoding="utf-8")):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BatchError(
                f"{path}:{n} is not JSON ({exc.msg}); each line must be an object with a 'prompt'"
            ) from exc
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise BatchError(f"{path}:{n} has no non-empty string 'prompt'")
        pid = str(row.get("id", f"line-{n}"))
        if pid in seen:
            raise BatchError(f"{path}:{n} repeats id {pid!r}; ids must be unique for --resume to work")
        seen.add(pid)
        toolsets = row.get("toolsets")
        if toolsets is not None and not (isinstance(toolsets, list) and all(isinstance(t, str) for t in toolsets)):
            raise BatchError(f"{path}:{n}: 'toolsets' must be a list of toolset names")
        extra = {k: v for k, v in row.items() if k not in ("prompt", "id", "toolsets")}
        prompts.append(Prompt(pid, row["prompt"], toolsets, extra))
    return prompts


def sample_toolsets(distribution: str, prompt_id: str, seed: int) -> list[str]:
    """Each toolset independently with its probability; never none (the likeliest is kept)."""
    dist = DISTRIBUTIONS.get(distribution)
    if dist is None:
        raise BatchError(f"unknown --distribution {distribution!r}; known: {sorted(DISTRIBUTIONS)}")
    rng = random.Random(f"{seed}:{prompt_id}")
    chosen = [name for name, p in sorted(dist.items()) if rng.random() < p]
    return chosen or [max(dist, key=dist.__getitem__)]


# ---- the output file ---------------------------------------------------------------------


def recover_output(path: Path) -> set[str]:
    """Ids already recorded; a torn last line (killed mid-write) is cut off."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep != len(data):
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    done: set[str] = set()
    for n, line in enumerate(data[:keep].split(b"\n")[:-1], 1):  # "\n" only: see environments/jsonl.py
        try:
            pid = json.loads(line)["prompt_id"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise BatchError(
                f"{path}:{n} is not a result line ({exc}); move the file away or pick another --run_name"
            ) from exc
        if pid in done:
            raise BatchError(f"{path}:{n} records {pid!r} twice; the output was edited by hand")
        done.add(pid)
    return done


class LineWriter:
    """Appends whole lines: one write() of one complete line on an O_APPEND descriptor."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        written = os.write(self._fd, data)
        while written < len(data):  # regular files write fully; this is for the odd filesystem
            written += os.write(self._fd, data[written:])

    def close(self) -> None:
        os.fsync(self._fd)
        os.close(self._fd)


# ---- one prompt ----------------------------------------------------------------------------


def result_record(
    prompt: Prompt,
    toolsets: list[str],
    tools: list[dict[str, Any]],
    result: AgentResult,
    attempts: int,
    model: str,
    token_trace: Any = None,
) -> dict[str, Any]:
    usage: Counter[str] = Counter()
    for turn in result.turns:
        for key, value in (turn.usage or {}).items():
            usage[key] += value
    calls = Counter(name for turn in result.turns for name in turn.tool_calls)
    return {
        "prompt_id": prompt.id,
        "prompt": prompt.text,
        "toolsets": toolsets,
        "tools": tools,
        "messages": result.messages,
        "final_response": result.final_response,
        "stop_reason": result.stop_reason,
        "completed": result.finished_naturally,
        "turns": result.turns_used,
        "tool_calls": dict(calls),
        "tool_errors": [{"turn": e.turn, "tool": e.tool, "error": e.error} for e in result.tool_errors],
        "format_errors": sum(len(t.parse_errors) for t in result.turns),
        "usage": dict(usage),
        "duration_s": round(result.duration_s, 3),
        "attempts": attempts,
        "model": model,
        "metadata": prompt.extra,
        # Token mode: the exact ids the model saw and sampled, masks (-100: not trained) and logprobs.
        **(
            {"token_sequences": [{"tokens": t, "masks": m, "logprobs": lp} for t, m, lp in trace_items(token_trace)]}
            if token_trace is not None
            else {}
        ),
    }


@dataclass
class Progress:
    total: int
    already: int
    done: int = 0
    failed: int = 0
    retries: int = 0
    consecutive_failures: int = 0
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = self.total - self.already - self.done - self.failed
        eta = f"{left / rate:.0f}s" if rate > 0 else "?"
        return (
            f"[{self.already + self.done}/{self.total}] done {self.done} failed {self.failed} "
            f"retries {self.retries} | {rate:.2f}/s | ETA {eta}"
        )


class Runner:
    """One prompt at a time through the shared runtime; infrastructure failures are retried there."""

    def __init__(self, config: BatchConfig, runtime: AgentRuntime) -> None:
        self.config = config
        self.runtime = runtime

    async def run_prompt(self, prompt: Prompt, progress: Progress) -> tuple[dict[str, Any] | None, str | None, int]:
        """(record, None, attempts) on an outcome of the model's; (None, error, attempts) when infrastructure failed every try."""
        c = self.config
        toolsets = (
            prompt.toolsets if prompt.toolsets is not None else sample_toolsets(c.distribution, prompt.id, c.seed)
        )
        tools = self.runtime.tool_schemas(toolsets)
        messages = [{"role": "system", "content": c.system_prompt}, {"role": "user", "content": prompt.text}]
        rollout: Rollout = await self.runtime.rollout(
            messages, tools, item=prompt, task_id=prompt.id, attempts=c.max_attempts, backoff_s=c.retry_backoff_s
        )
        progress.retries += rollout.attempts - 1
        if rollout.infrastructure_failure or rollout.result is None:
            return None, rollout.error or "infrastructure failure", rollout.attempts
        record = result_record(
            prompt, toolsets, tools, rollout.result, rollout.attempts, c.model, rollout.extras.get("token_trace")
        )
        return record, None, rollout.attempts


async def _progress_loop(progress: Progress, interval: float, stream: Any) -> None:
    """A live line on a terminal; in a log, a line when something finished (or every 60 s)."""
    tty = stream.isatty()
    last_time, last_counts = time.monotonic(), (0, 0)
    while True:
        await asyncio.sleep(interval)
        if tty:
            stream.write("\r" + progress.line() + "\x1b[K")
            stream.flush()
            continue
        counts = (progress.done, progress.failed)
        if counts != last_counts or time.monotonic() - last_time >= 60:
            last_time, last_counts = time.monotonic(), counts
            print(progress.line(), file=stream, flush=True)


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
    run_dir.mkdir(parents=True, exist_ok=True)
    done_ids = recover_output(out_path)
    known = {p.id for p in prompts}
    if done_ids - known:
        raise BatchError(
            f"{out_path} has results for {len(done_ids - known)} ids not in {config.dataset_file}; "
            "is this the same dataset?"
        )
    (run_dir / "run_config.json").write_text(config.model_dump_json(indent=2, exclude={"api_key"}))
    pending = [p for p in prompts if p.id not in done_ids]
    runtime = AgentRuntime(config.runtime_config(), model=model)
    registry = runtime.registry
    for p in pending:  # unknown distributions / toolsets fail now, not in a worker
        ts = p.toolsets if p.toolsets is not None else sample_toolsets(config.distribution, p.id, config.seed)
        unknown = set(ts) - registry.toolsets
        if unknown:
            raise BatchError(
                f"prompt {p.id!r} asks for unknown toolsets {sorted(unknown)}; known: {sorted(registry.toolsets)}"
            )

    progress = Progress(total=len(prompts), already=len(done_ids))
    wall_started = time.monotonic()
    writer = LineWriter(out_path)
    failures = LineWriter(run_dir / "infra_failures.jsonl")
    queue: asyncio.Queue[Prompt] = asyncio.Queue()
    for p in pending:
        queue.put_nowait(p)
    last_error: list[str] = []
    try:
        await runtime.__aenter__()  # model server(s), web and tool backends; fails fast naming the URL
    except HermesEnvError as exc:
        writer.close()
        failures.close()
        flags = str(exc).replace("--openai.base_url", "--base_url").replace("--openai.api_key", "--api_key")
        raise BatchError(flags) from exc
    ticker = asyncio.create_task(_progress_loop(progress, config.progress_interval_s, stream))
    try:
        runner = Runner(config, runtime)

        async def worker() -> None:
            while not queue.empty() and progress.consecutive_failures < config.max_consecutive_failures:
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
        if stream.isatty():
            stream.write("\n")
        print(progress.line(), file=stream, flush=True)
    stats = compute_stats(out_path, total_prompts=len(prompts))
    stats["session"] = {
        "wall_time_s": round(time.monotonic() - wall_started, 3),
        "ran": len(pending),
        "recorded": progress.done,
        "infra_failed": progress.failed,
        "retries": progress.retries,
    }
    (run_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    if progress.consecutive_failures >= config.max_consecutive_failures and not queue.empty():
        raise BatchError(
            f"stopped after {progress.consecutive_failures} prompts in a row failed on infrastructure errors "
            f"(last: {last_error[0] if last_error else '?'}); fix the server, then rerun with --resume"
        )
    return stats


def compute_stats(out_path: Path, total_prompts: int) -> dict[str, Any]:
    """Statistics over every recorded trajectory of the run (all sessions)."""
    text = out_path.read_text(encoding="utf-8") if out_path.exists() else ""
    records = [json.loads(line) for _, line in jsonl_lines(text)]
    calls: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    stops: Counter[str] = Counter()
    toolsets: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    turns = []
    durations = []
    for r in records:
        calls.update(r["tool_calls"])
        errors.update(e["tool"] for e in r["tool_errors"])
        stops[r["stop_reason"]] += 1
        toolsets.update(r["toolsets"])
        tokens.update(r.get("usage") or {})
        turns.append(r["turns"])
        durations.append(r["duration_s"])
    n = len(records)
    return {
        "prompts": total_prompts,
        "recorded": n,
        "missing": total_prompts - n,
        "completed": sum(1 for r in records if r["completed"]),
        "stop_reasons": dict(stops),
        "tools": {
            name: {
                "calls": calls[name],
                "errors": errors[name],
                "error_rate": round(errors[name] / calls[name], 4) if calls[name] else 0.0,
            }
            for name in sorted(calls | errors)
        },
        "toolsets_offered": dict(toolsets),
        "turns": {"total": sum(turns), "mean": round(sum(turns) / n, 3) if n else 0.0, "max": max(turns, default=0)},
        "tokens": {**dict(tokens), "mean_completion": round(tokens["completion_tokens"] / n, 1) if n else 0.0},
        "trajectory_time_s": {
            "total": round(math.fsum(durations), 3),
            "mean": round(math.fsum(durations) / n, 3) if n else 0.0,
        },
        "format_errors": sum(r.get("format_errors", 0) for r in records),
    }


def parse_args(argv: list[str] | None = None) -> BatchConfig:
    p = argparse.ArgumentParser(prog="batch_runner.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset_file", type=Path, required=True)
    p.add_argument("--run_name", required=True)
    p.add_argument(
        "--model", default=None, help=f"model name (required with --base_url; default: {EMBEDDED_MODEL_NAME})"
    )
    p.add_argument(
        "--base_url",
        default=EMBEDDED,
        help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (default: the embedded model)",
    )
    p.add_argument(
        "--token_server",
        default="off",
        choices=list(get_args(TokenServerChoice)),
        help="token mode: record exact token ids, masks and logprobs through the server's token protocol "
        "(auto: llamacpp for the embedded model, else from vllm/sglang); off: chat mode",
    )
    p.add_argument("--api_key", default=None, help="default: $OPENAI_API_KEY")
    p.add_argument("--output_dir", type=Path, default=Path("runs"))
    p.add_argument(
        "--resume", action="store_true", help="continue a killed run: run only prompts not yet in the output"
    )
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--distribution", default="default", help=f"toolset distribution: {', '.join(DISTRIBUTIONS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max_turns", type=int, default=_LOOP.max_turns)
    p.add_argument("--max_tokens", type=int, default=_LOOP.max_tokens)
    p.add_argument("--temperature", type=float, default=_LOOP.temperature)
    p.add_argument("--time_budget_s", type=float, default=_LOOP.time_budget_s)
    p.add_argument("--max_attempts", type=int, default=3, help="tries per prompt when the server/workspace fails")
    p.add_argument("--retry_backoff_s", type=float, default=1.0)
    p.add_argument("--request_retries", type=int, default=2)
    p.add_argument("--system_prompt", default=DEFAULT_SYSTEM_PROMPT)
    p.add_argument(
        "--tool_call_parser", default="hermes", help="parser for tool calls returned as text ('none' disables)"
    )
    p.add_argument("--extra_body", default="{}", help="JSON object merged into every chat request")
    p.add_argument("--web_backend", choices=["auto", "offline", "tavily"], default="auto")
    p.add_argument(
        "--tool_backend",
        choices=["local", "sandbox"],
        default="local",
        help="sandbox: each prompt's tools run in an isolated sandbox slot (bubblewrap locally)",
    )
    p.add_argument(
        "--gc_profile",
        choices=["scaled", "cpython", "throughput"],
        default="scaled",
        help="collector settings while the prompts run (environments/gc_tuning.py); cpython: CPython's own",
    )
    a = p.parse_args(argv)
    if a.model is None:
        if a.base_url != EMBEDDED:
            p.error("--model is required with --base_url (the name the server knows the model by)")
        a.model = EMBEDDED_MODEL_NAME
    try:
        extra_body = json.loads(a.extra_body)
    except json.JSONDecodeError as exc:
        p.error(f"--extra_body is not JSON: {exc}")
    values = {
        k: v for k, v in vars(a).items() if k not in ("extra_body", "web_backend", "tool_call_parser", "gc_profile")
    }
    try:
        return BatchConfig(
            **values,
            extra_body=extra_body,
            web=WebConfig(backend=a.web_backend),
            gc=GCConfig(profile=a.gc_profile),
            tool_call_parser=None if a.tool_call_parser == "none" else a.tool_call_parser,
        )
    except ValueError as exc:
        p.error(str(exc))
        raise  # unreachable: p.error exits


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    loop = asyncio.new_event_loop()
    task = loop.create_task(run_batch(config))
    for sig in (signal.SIGINT, signal.SIGTERM):  # stop cleanly: workspaces removed, lines whole
        loop.add_signal_handler(sig, task.cancel)
    try:
        stats = loop.run_until_complete(task)
    except BatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except asyncio.CancelledError:
        print(f"interrupted; continue with --resume --run_name {config.run_name}", file=sys.stderr)
        return 130
    finally:
        loop.close()
    print(f"wrote {config.run_dir / 'trajectories.jsonl'} and {config.run_dir / 'stats.json'}")
    if stats["missing"]:
        print(
            f"{stats['missing']} prompts have no result (infrastructure failures, see infra_failures.jsonl); "
            f"rerun with --resume to retry them",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
