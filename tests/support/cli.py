"""An env's command line run inside the test process: the same `environments.cli.main` that
`python -m environments.<env>` calls, without a new interpreter importing atroposlib,
transformers and torch first (about 5 s per run on these machines).

For the paths that stop before any server starts (bad flags, bad YAML, refused settings). One
test per entry module still runs it as a process, for what only a process shows (import noise).
"""

from __future__ import annotations

import io
import logging
import signal
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from typing import Any

from environments.cli import main


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str


def run_cli(env_cls: Any, *argv: str) -> CliRun:
    """`main(env_cls, argv)` with stdout/stderr captured; the process-wide state it sets (the SIGTERM
    handler, the root logger's level and secret filters) is put back afterwards."""
    out, err = io.StringIO(), io.StringIO()
    sigterm = signal.getsignal(signal.SIGTERM)
    root = logging.getLogger()
    level, filters = root.level, list(root.filters)
    handler_filters = [(handler, list(handler.filters)) for handler in root.handlers]
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(env_cls, list(argv))
    finally:
        signal.signal(signal.SIGTERM, sigterm)
        root.setLevel(level)
        root.filters[:] = filters
        for handler, saved in handler_filters:
            handler.filters[:] = saved
    return CliRun(code, out.getvalue(), err.getvalue())
