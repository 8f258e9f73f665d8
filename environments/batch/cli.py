"""Run the agent over a prompt file, for SFT (or token-level) data at scale.

batch_runner.py's command line: its flags into a BatchConfig, and the run with clean exits
(2: a problem the user must fix; 130: interrupted; 1: prompts left without a result).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any, get_args

from environments.batch.config import _LOOP, DEFAULT_SYSTEM_PROMPT, DISTRIBUTIONS, BatchConfig, BatchError, RayConfig
from environments.batch.run import run_batch
from environments.gc_tuning import GCConfig
from environments.models.token_mode.wiring import TokenServerChoice
from environments.runtime import EMBEDDED, EMBEDDED_MODEL_NAME
from tools.web import WebConfig

__all__ = ["main", "parse_args"]


def _tool_choice(value: str) -> Any:
    """`required`, or `{"type": "function", "function": {"name": "python"}}` (checked by BatchConfig)."""
    return json.loads(value) if value.lstrip().startswith("{") else value


def parse_args(argv: list[str] | None = None) -> BatchConfig:
    p = argparse.ArgumentParser(prog="batch_runner.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset_file", type=Path, required=True)
    p.add_argument("--run_name", required=True)
    p.add_argument(
        "--model", default=None, help=f"model name (required with --base_url; default: {EMBEDDED_MODEL_NAME})"
    )
    p.add_argument(
        "--base_url",
        action="append",
        default=None,
        help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (default: the embedded model); repeat it "
        "for several servers serving the same model: each prompt goes to a healthy one with the fewest in flight",
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
    for flag, what in (("--tool_choice", "every turn"), ("--first_turn_tool_choice", "the first turn")):
        p.add_argument(
            flag,
            type=_tool_choice,
            default=None,
            help=f"tool_choice of {what}: auto | none | required | a JSON object naming a function "
            "(first turn default: required on the embedded model in token mode; docs/environments.md)",
        )
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
        default="sandbox",
        help="sandbox: each prompt's tools run in an isolated sandbox slot (bubblewrap locally); local needs "
        "--unconfined_tools",
    )
    p.add_argument(
        "--unconfined_tools",
        action="store_true",
        help="run model code as this user with this machine's files and network where it cannot be confined "
        "(docs/security.md)",
    )
    p.add_argument(
        "--agent",
        choices=["tools", "codeact"],
        default="tools",
        help="codeact: smolagents' CodeAgent writes Python actions (needs the codeact extra; docs/code_actions.md)",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run on a Ray cluster: 'local' starts one here, else HOST:PORT of `ray start --head` (docs/scale_out.md)",
    )
    p.add_argument("--workers", type=int, default=None, help="with --ray: rollout worker actors (default 2)")
    p.add_argument("--worker_cpus", type=float, default=None, help="with --ray: CPUs Ray reserves per worker")
    p.add_argument(
        "--gc_profile",
        choices=["scaled", "cpython", "throughput"],
        default="scaled",
        help="collector settings while the prompts run (environments/gc_tuning.py); cpython: CPython's own",
    )
    a = p.parse_args(argv)
    a.base_url = a.base_url or [EMBEDDED]
    if EMBEDDED in a.base_url and len(a.base_url) > 1:
        p.error("--base_url embedded starts the bundled model here; it cannot be mixed with other servers")
    if a.model is None:
        if a.base_url != [EMBEDDED]:
            p.error("--model is required with --base_url (the name the server knows the model by)")
        a.model = EMBEDDED_MODEL_NAME
    try:
        extra_body = json.loads(a.extra_body)
    except json.JSONDecodeError as exc:
        p.error(f"--extra_body is not JSON: {exc}")
    if a.ray is None and (a.workers is not None or a.worker_cpus is not None):
        p.error("--workers and --worker_cpus need --ray ADDRESS (or --ray local)")
    ray_flags = {k: v for k, v in {"workers": a.workers, "worker_cpus": a.worker_cpus}.items() if v is not None}
    skip = ("extra_body", "web_backend", "tool_call_parser", "gc_profile", "ray", "workers", "worker_cpus")
    values = {k: v for k, v in vars(a).items() if k not in skip and not (k == "tool_choice" and v is None)}
    try:
        return BatchConfig(
            **values,
            extra_body=extra_body,
            web=WebConfig(backend=a.web_backend),
            gc=GCConfig(profile=a.gc_profile),
            ray=RayConfig(address=a.ray, **ray_flags) if a.ray is not None else None,
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
