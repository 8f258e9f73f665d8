"""The env command line: `process`, `serve`, `evaluate` with `--env.*` / `--openai.*` flags and `--config`.

Same flags and YAML layout as atroposlib 0.4.0's CLI, but strict and quiet:
- unknown flags and YAML keys, at any depth (`env.runtime.sandbox.slots_per_sandbx`), and values of the
  wrong type stop the command with one line naming the key and the nearest valid one (exit 2);
- list flags take `a,b` (or YAML/JSON `[a, b]`); negative numbers need no `=`;
- the whole config, toolsets included, is checked before any server starts;
- the config dump appears only with `--verbose`, API keys redacted;
- SIGINT/SIGTERM stop the command cleanly: one line, exit 130/143, whole JSONL lines only.
A top-level `tinker:` YAML section belongs to tinker-atropos's trainer; the env ignores its
content and takes it to mean the trainer needs inference logprobs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from environments.cli_help import help_text
from environments.cli_parse import COMMANDS, CliError, Invocation, config_dump, install_secret_filter, parse_invocation
from environments.env_entry import EnvEntry
from environments.errors import HermesEnvError
from environments.model_server import preflight_model

__all__ = ["main"]


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# ---- running ------------------------------------------------------------------------------


async def _run_interruptible(coro_factory: Any) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def on_signal(signum: int) -> None:
        if received:  # a second signal: the user insists
            os._exit(128 + signum)
        received.append(signum)
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await coro_factory()
    except asyncio.CancelledError:
        if received:
            raise Interrupted(received[0]) from None
        raise
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)  # (restores SIG_DFL; ours again below)
        signal.signal(signal.SIGTERM, _raise_interrupted)


def _raise_interrupted(signum: int, _frame: Any) -> None:
    raise Interrupted(signum)


def main(env: Any, argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code. `env` is an env class, or an `EnvEntry` whose
    class is imported only once the command line has been parsed and checked."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:  # wherever it is: help, and nothing started
        print(help_text(env, argv[0] if argv and argv[0] in COMMANDS else None))
        return 0
    # Before the event loop runs, a signal still ends the command in one line.
    signal.signal(signal.SIGTERM, _raise_interrupted)
    instance = None
    try:
        try:
            inv = parse_invocation(env, argv)
        except CliError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        install_secret_filter([s.api_key or "" for s in inv.server_configs])
        if inv.verbose:
            logging.getLogger().setLevel(logging.INFO)
            print(config_dump(inv), file=sys.stderr)
        for server in inv.server_configs:  # a model the server does not serve: refused before anything starts
            if str(server.base_url).startswith(("http://", "https://")):
                asyncio.run(preflight_model(str(server.base_url), server.model_name, server.api_key))
        env_cls = env.load() if isinstance(env, EnvEntry) else env
        instance = env_cls(
            config=inv.env_config, server_configs=inv.server_configs, slurm=inv.slurm, testing=inv.testing
        )
        instance.check_config(inv.command)  # toolsets, token server, trainer needs: before any server starts
        if inv.command == "serve":
            from environments.trainer_boundary import check_trainer  # imports atroposlib's BaseEnv

            check_trainer(instance.config)  # the trainer's batch and sequence sizes, before anything starts
        if inv.command == "process":
            instance.process_mode = True
            instance.n_groups_to_process = inv.env_config.total_steps
            instance.group_size_to_process = inv.env_config.group_size
            entry = instance.process_manager
        elif inv.command == "serve":
            entry = instance.env_manager
        else:
            _save_evaluate_config(inv)
            entry = instance._run_evaluate
        asyncio.run(_run_interruptible(entry))
        return 0
    except HermesEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(f"[hermes-rl] stopped by {signal.Signals(signum).name}{_written(instance)}", file=sys.stderr)
        return 128 + signum


def _written(env: Any) -> str:
    path = getattr(getattr(env, "config", None), "data_path_to_save_groups", None)
    if env is None or not path or not Path(path).exists() or not getattr(env, "process_mode", False):
        return ""
    lines = sum(1 for _ in Path(path).open())
    return f"; {lines} complete groups in {Path(path).resolve()}"


def _save_evaluate_config(inv: Invocation) -> None:
    out = inv.env_config.data_dir_to_save_evals
    if out is None:
        return
    os.makedirs(out, exist_ok=True)
    Path(out, "evaluate_config.yaml").write_text(config_dump(inv))
