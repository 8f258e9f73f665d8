"""`--help` for the env commands: every flag of every section with its type, default and description."""

from __future__ import annotations

import sys
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from pydantic import BaseModel


from environments.cli_parse import COMMANDS, REDACTED, SECRET_KEYS, _admits_str, _model_of
from environments.env_entry import EnvEntry
from environments.upstream_config import unused_reason

__all__ = ["flag_rows", "help_text"]


COMMAND_HELP = {
    "process": "run --env.total_steps groups and write them to --env.data_path_to_save_groups (JSONL)",
    "serve": "send groups to a trainer through atroposlib's run-api (--env.rollout_server_url)",
    "evaluate": "score every eval item once at temperature 0; metrics and samples to --env.data_dir_to_save_evals",
}
GLOBAL_HELP = [
    ("--config", "FILE", None, "YAML with env: and openai: sections (flags override it)"),
    ("--verbose", "", None, "print the resolved config (keys redacted) before running"),
    ("--slurm", "bool", False, "atroposlib's slurm switch"),
    ("--testing", "bool", False, "atroposlib's testing switch"),
    ("--help", "", None, "print this help and exit"),
]


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "|".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " | ".join(names + (["None"] if type(None) in args else []))
    if origin in (list, tuple, set):
        return f"list[{_type_name(args[0])}]" if args else "list"
    if origin is dict:
        return "dict"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "|".join(str(member.value) for member in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _default_text(name: str, value: Any) -> str:
    if value and any(name.lower() == k or name.lower().endswith("_" + k) for k in SECRET_KEYS):
        return REDACTED
    text = repr(value.value if hasattr(value, "value") and not isinstance(value, BaseModel) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def flag_rows(model: type[BaseModel], prefix: str, values: Any, note: str = "") -> list[tuple[str, str, str, str]]:
    """(flag, type, default, description) for every field, nested models flattened; a union of
    models tagged by `kind` lists each member's own fields, marked with the kind they belong to."""
    rows: list[tuple[str, str, str, str]] = []
    for name, field in model.model_fields.items():
        if unused_reason(model, name) is not None:  # refused if set (environments/upstream_config.py)
            continue
        value = (
            values.get(name)
            if isinstance(values, dict) and name in values
            else field.get_default(call_default_factory=True)
        )
        if isinstance(value, BaseModel):
            value = value.model_dump()
        annotation = field.annotation
        inner = annotation
        if typing.get_origin(inner) in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(inner) if isinstance(a, type) and issubclass(a, BaseModel)]
        else:
            members = [inner] if isinstance(inner, type) and issubclass(inner, BaseModel) else []
        if not members or _admits_str(annotation):  # a value or a mapping (tool_choice): one row
            rows.append(
                (
                    f"{prefix}{name}",
                    _type_name(annotation),
                    _default_text(name, value),
                    (field.description or "") + note,
                )
            )
            continue
        chosen = _model_of(annotation, value) or members[0]
        kinds = [str(m.model_fields["kind"].default) for m in members if "kind" in m.model_fields]
        listed = {row[0] for row in rows}
        for member in [chosen, *(m for m in members if m is not chosen)]:
            kind = member.model_fields.get("kind")
            tag = f" [{name}.kind={kind.default}]" if member is not chosen and kind is not None else ""
            for row in flag_rows(member, f"{prefix}{name}.", value if member is chosen else None, note + tag):
                if row[0] == f"{prefix}{name}.kind" and len(kinds) > 1:
                    row = (
                        row[0],
                        "|".join(kinds),
                        row[2],
                        row[3] or f"which {name} (each kind's own flags are marked)",
                    )
                if row[0] not in listed:
                    rows.append(row)
                    listed.add(row[0])
    return rows


def help_text(env_cls: Any, command: str | None) -> str:
    """Every flag of every section with its type, default and description."""
    config_cls = env_cls.env_config_cls
    try:
        default_env, default_servers = env_cls.config_init()
        env_values: Any = default_env.model_dump()
        servers = default_servers if isinstance(default_servers, list) else [default_servers]
        server_values: Any = servers[0].model_dump() if servers else {}
    except Exception:  # the field defaults say enough when the env's own defaults cannot be built here
        env_values, server_values = {}, {}
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "env"
    lines = [
        f"usage: {prog} {{{','.join(COMMANDS)}}} [--config FILE] [--verbose] [--env.KEY VALUE ...] [--openai.KEY VALUE ...]",
        "",
    ]
    doc = ((env_cls.summary if isinstance(env_cls, EnvEntry) else env_cls.__doc__) or "").strip().splitlines()
    if doc:
        lines += [doc[0], ""]
    lines.append("commands:")
    lines += [f"  {c:<9} {COMMAND_HELP[c]}" + ("   <- this one" if c == command else "") for c in COMMANDS]
    sections = [
        ("global flags:", [(f, t, "" if d is None else repr(d), h) for f, t, d, h in GLOBAL_HELP]),
        ("env (--env.*):", flag_rows(config_cls, "--env.", env_values)),
        (
            "openai (--openai.*): one model server; a YAML `openai:` list gives several",
            flag_rows(APIServerConfig, "--openai.", server_values),
        ),
    ]
    for title, rows in sections:
        lines += ["", title]
        for flag, kind, default, description in rows:
            left = f"  {flag} {kind}".rstrip()
            default_part = f" (default {default})" if default else ""
            lines.append(f"{left}{default_part}  {description}".rstrip())
    lines += ["", "Negative booleans need `=` (--env.use_wandb=False); list flags take a,b."]
    return "\n".join(lines)
