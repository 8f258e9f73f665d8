"""batch_runner's output: the exactly-once output file, one prompt's record, progress and statistics."""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from environments.agent_loop import AgentResult
from environments.batch.config import BatchError, Prompt
from environments.jsonl import jsonl_lines
from environments.models.token_mode.wiring import trace_items


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


def session_stats(progress: Progress, ran: int, wall_started: float) -> dict[str, Any]:
    """This invocation's part of stats.json (a --resume adds a session of its own)."""
    return {
        "wall_time_s": round(time.monotonic() - wall_started, 3),
        "ran": ran,
        "recorded": progress.done,
        "infra_failed": progress.failed,
        "retries": progress.retries,
    }
