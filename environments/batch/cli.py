"""Run the agent over a prompt file, for SFT (or token-level) data at scale.

batch_runner.py's command line: the env commands' grammar (environments/cli_parse.py) over one BatchConfig —
`--a.b value` flags over an optional `--config run.yaml` keyed by BatchConfig's own fields — and the run with
clean exits (2: a problem the user must fix; 130: interrupted; 1: prompts left without a result).
"""

from __future__ import annotations

import asyncio
import signal
import sys

from environments.batch.config import BATCH_RENAMED, BatchConfig, BatchError
from environments.batch.run import run_batch
from environments.cli_parse import CliError, parse_config
from environments.runtime import EMBEDDED

__all__ = ["help_text", "main", "parse_args"]

USAGE = (
    "usage: batch_runner.py --dataset_file FILE --run_name NAME [--config run.yaml] [--KEY VALUE ...]\n"
    "  e.g. --base_url http://127.0.0.1:8000/v1 --model M   --runtime.sandbox.backend.kind docker   "
    "--runtime.loop.max_turns 4   --ray.address local"
)


def _old_spellings(argv: list[str]) -> list[str]:
    """Old flag forms other than a plain rename (BATCH_RENAMED): repeated `--base_url`, `--max_attempts N`."""
    out: list[str] = []
    urls: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        if key in ("--base_url", "--max_attempts"):
            if not eq:
                value = argv[i + 1] if i + 1 < len(argv) else ""
                i += 1
            if key == "--base_url":
                urls.append(value)
            else:
                retries = str(int(value) - 1) if value.strip().isdigit() else value
                print(
                    f"[hermes-rl] --max_attempts {value} is now --rollout_infra_retries {retries}; "
                    "the old name is removed in the next release",
                    file=sys.stderr,
                )
                out += ["--rollout_infra_retries", retries]
        else:
            out.append(arg)
        i += 1
    if len(urls) > 1:
        print("[hermes-rl] repeating --base_url is now --base_url A,B; removed in the next release", file=sys.stderr)
    if urls:
        out += ["--base_url", ",".join(urls)]
    return out


def parse_args(argv: list[str] | None = None) -> BatchConfig:
    """The BatchConfig of a command line; CliError (one line) when it is wrong."""
    argv = _old_spellings(list(sys.argv[1:] if argv is None else argv))
    config: BatchConfig = parse_config(BatchConfig, argv, BATCH_RENAMED)
    if EMBEDDED in config.base_url and len(config.base_url) > 1:
        raise CliError("--base_url embedded starts the bundled model here; it cannot be mixed with other servers")
    if config.base_url != [EMBEDDED] and "model" not in config.model_fields_set:
        raise CliError("--model is required with --base_url (the name the server knows the model by)")
    return config


def help_text() -> str:
    from environments.cli_help import flag_rows  # the env's --help table, for BatchConfig's fields

    lines = [USAGE, "", (__doc__ or "").split("\n\n")[0], "", "flags (also keys of --config YAML):"]
    lines.append("  --config FILE  YAML of these keys (flags override it)")
    for flag, kind, default, description in flag_rows(BatchConfig, "--", {}):
        default_part = " (required)" if default == "PydanticUndefined" else f" (default {default})" if default else ""
        lines.append(f"  {flag} {kind}{default_part}  {description}".rstrip())
    lines += ["", "Negative booleans need `=` (--resume=False); list flags take a,b."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--help" in args or "-h" in args:
        print(help_text())
        return 0
    try:
        config = parse_args(args)
    except CliError as exc:
        print(f"batch_runner.py: error: {exc}", file=sys.stderr)
        return 2
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
