"""Command lines of the training tools: every flag is a field of the tool's pydantic config.

`--name VALUE` per field (`positional` fields come first, in order); pydantic turns the strings
into typed values and unknown flags are errors, so the CLI and Python callers share one
validated config object.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, TypeVar

from pydantic import BaseModel, ValidationError

__all__ = ["parse_config", "run_or_report"]

C = TypeVar("C", bound=BaseModel)
R = TypeVar("R")


def parse_config(cls: type[C], argv: list[str] | None, prog: str, positional: tuple[str, ...] = ()) -> C:
    doc = (sys.modules[cls.__module__].__doc__ or "").strip()
    parser = argparse.ArgumentParser(
        prog=prog, description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for name, field in cls.model_fields.items():
        help_text = field.description or ""
        if name in positional:
            parser.add_argument(name, help=help_text)
            continue
        default = "" if field.is_required() else f" (default: {field.get_default(call_default_factory=True)})"
        parser.add_argument(
            f"--{name}", default=argparse.SUPPRESS, required=field.is_required(), help=help_text + default
        )
    values = vars(parser.parse_args(argv))
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"--{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        parser.error(problems)
        raise  # parser.error exits; this line is for type checkers


def run_or_report(
    tool: str, work: Callable[[], R], errors: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError)
) -> R | None:
    """`work()`, or None after one line on stderr saying what failed (`errors`: what a user can fix)."""
    try:
        return work()
    except errors as exc:
        print(f"{tool}: {exc}", file=sys.stderr)
        return None
