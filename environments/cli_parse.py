"""The env command line's grammar: flags and `--config` YAML into a checked Invocation, and secrets kept out of logs.

Strict where atroposlib 0.4.0's CLI is lenient: unknown flags and YAML keys at any depth, and values of
the wrong type, raise CliError naming the key and the nearest valid one; list flags take `a,b`.
Used by environments/cli.py (running a command) and environments/cli_help.py (--help).
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from pydantic import BaseModel, ValidationError

from environments.upstream_config import unused_reason


__all__ = [
    "CliError",
    "Invocation",
    "config_dump",
    "install_secret_filter",
    "parse_config",
    "parse_invocation",
    "redact",
]

logger = logging.getLogger(__name__)

COMMANDS = ("process", "serve", "evaluate")
GLOBAL_FLAGS = ("config", "verbose", "slurm", "testing", "help")
YAML_SECTIONS = ("env", "openai", "slurm", "testing", "tinker")
SECRET_KEYS = ("api_key", "token", "secret", "password")
REDACTED = "***"


class CliError(Exception):
    """A bad command line or config file: printed as one line, exit 2."""


@dataclass
class Invocation:
    command: str
    env_config: Any  # the env's config class
    server_configs: list[APIServerConfig]
    verbose: bool = False
    slurm: bool = False
    testing: bool = False
    tinker: dict[str, Any] | None = None
    total_steps_given: bool = False


# ---- parsing ------------------------------------------------------------------------------


def _unknown(what: str, key: str, choices: list[str], where: str = "", suffix: str = "") -> CliError:
    match = difflib.get_close_matches(key, choices, n=1, cutoff=0.0)
    hint = f"; did you mean {where}{match[0]}?" if match else ""
    return CliError(f"unknown {what} {where}{key}{suffix}{hint}")


def split_flags(argv: list[str]) -> dict[str, Any]:
    """`--key=value`, `--key value` (a value may be negative: `-1`), `--flag` (True)."""
    flags: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            raise CliError(f"unexpected argument {arg!r}; flags look like --env.group_size 4")
        key, eq, text = arg[2:].partition("=")
        value: str | bool = text
        if eq:
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 2
        else:
            value, i = True, i + 1
        if key in flags:
            raise CliError(f"--{key} given twice")
        flags[key] = value
    return flags


def _model_of(annotation: Any, value: Any = None) -> type[BaseModel] | None:
    """The pydantic model inside `Model`, `Model | None`, or a union tagged by `kind` (the
    member whose `kind` the value names, else the first)."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        kind = value.get("kind") if isinstance(value, dict) else None
        for member in members:
            field = member.model_fields.get("kind")
            if kind is not None and field is not None and field.default == kind:
                return member
        return members[0] if members else None
    return None


def _is_list(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_list(a) for a in typing.get_args(annotation))
    return typing.get_origin(annotation) in (list, tuple, set) or annotation in (list, tuple, set)


def _is_dict(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_dict(a) for a in typing.get_args(annotation))
    return typing.get_origin(annotation) is dict or annotation is dict


def _admits_str(annotation: Any) -> bool:
    """A union with a str or string Literal member (a flag may then name a value or give a mapping)."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return False
    for member in typing.get_args(annotation):
        if member is str or (
            typing.get_origin(member) is typing.Literal and all(isinstance(a, str) for a in typing.get_args(member))
        ):
            return True
    return False


def _honoured(model: type[BaseModel]) -> list[str]:
    return [name for name in model.model_fields if unused_reason(model, name) is None]


def check_keys(model: type[BaseModel], data: dict[str, Any], where: str, suffix: str = "") -> None:
    """Every key must name a field, at every depth of nested config models."""
    fields = model.model_fields
    what = "flag" if where.startswith("--") else "key"
    for key, value in data.items():
        if key not in fields:
            raise _unknown(what, str(key), _honoured(model), where, suffix)
        why = unused_reason(model, key)
        if why is not None:
            raise CliError(f"{what} {where}{key}{suffix} is an atroposlib setting hermes-rl does not use: {why}")
        sub = _model_of(fields[key].annotation, value)
        if sub is not None and isinstance(value, dict):
            check_keys(sub, value, f"{where}{key}.", suffix)


def _flag_value(model: type[BaseModel], path: list[str], value: Any, prefix: str) -> Any:
    """Flags arrive as strings: lists may be `a,b`, dicts YAML, `None` means None."""
    annotation: Any = None
    current: type[BaseModel] | None = model
    for part in path:
        if current is None or part not in current.model_fields:
            return value  # reported by check_keys
        annotation = current.model_fields[part].annotation
        current = _model_of(annotation)
    if not isinstance(value, str):
        return value
    if value == "None":
        return None
    if _is_list(annotation):
        if value.startswith("["):
            return yaml.safe_load(value)
        return [v.strip() for v in value.split(",") if v.strip()]
    if _admits_str(annotation) and not value.lstrip().startswith("{"):
        return value  # e.g. tool_choice: `required`, or a mapping `{type: function, ...}`
    if _is_dict(annotation) or current is not None:
        loaded = yaml.safe_load(value)
        if not isinstance(loaded, dict):
            raise CliError(f"--{prefix}{'.'.join(path)} takes a mapping, e.g. '{{key: value}}'; got {value!r}")
        return loaded
    return value


def _nest(model: type[BaseModel], flags: dict[str, Any], prefix: str) -> dict[str, Any]:
    """`--env.runtime.sandbox.slots_per_sandbox 4` -> {"runtime": {"sandbox": {"slots_per_sandbox": 4}}}."""
    out: dict[str, Any] = {}
    for key, value in flags.items():
        path = key.split(".")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise CliError(f"--{prefix}{key} conflicts with another flag")
        node[path[-1]] = _flag_value(model, path, value, prefix)
    return out


def _merge(base: dict[str, Any], *updates: dict[str, Any]) -> dict[str, Any]:
    result = dict(base)
    for update in updates:
        for key, value in update.items():
            if isinstance(result.get(key), dict) and isinstance(value, dict) and key != "extra_body":
                result[key] = _merge(result[key], value)
            else:
                result[key] = value
    return result


def _validate(model: type[BaseModel], data: dict[str, Any], prefix: str, flags: dict[str, Any], source: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        dotted = ".".join(_field_path(model, err["loc"]))
        from_flag = any(dotted == k or dotted.startswith(k + ".") for k in flags)
        origin = f"--{prefix}{dotted}" if from_flag else f"{prefix}{dotted} in {source}"
        shown = err.get("input")
        shown = REDACTED if any(s in dotted for s in SECRET_KEYS) else repr(shown)
        raise CliError(f"{origin}: {err['msg']} (got {shown})") from None


def _field_path(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """A validation error's location as the user spells it: without pydantic's union tags."""
    out: list[str] = []
    annotation: Any = None
    for part in loc:
        current = _model_of(annotation, {"kind": part}) if annotation is not None else model
        if current is not None and isinstance(part, str) and part not in current.model_fields:
            continue  # a discriminator tag (e.g. `local`), not a key the user wrote
        out.append(str(part))
        annotation = (
            current.model_fields[part].annotation if current is not None and part in current.model_fields else None
        )
    return out


def _load_yaml(path: str, sections: tuple[str, ...] | None = YAML_SECTIONS) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read --config {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise CliError(f"--config {path} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        kind = f"with sections {', '.join(sections)}" if sections else "of settings"
        raise CliError(f"--config {path} must be a mapping {kind}")
    for key in data:
        if sections is not None and key not in sections:
            raise _unknown("section", str(key), list(sections), suffix=f" in {path}")
    return data


# ---- old names --------------------------------------------------------------------------


def _new_name(renamed: Mapping[str, str], key: str, value: Any) -> str:
    head, dot, rest = key.partition(".")
    new = renamed.get(head)
    if new is None:
        return key
    if new.startswith(head + "."):  # a value moved into its own section (`--ray local` -> ray.address)
        return new if not dot and not isinstance(value, dict) else key
    return new + dot + rest


def _notice(old: str, new: str) -> None:
    print(f"[hermes-rl] {old} is now {new}; the old name is removed in the next release", file=sys.stderr)


def renamed_flags(renamed: Mapping[str, str], flags: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Old flag names, accepted for one release with a one-line notice: `--{prefix}old[.sub]` -> `new[.sub]`."""
    out: dict[str, Any] = {}
    for key, value in flags.items():
        new = _new_name(renamed, key, value)
        if new != key:
            _notice(f"--{prefix}{key}", f"--{prefix}{new}")
        if new in out:
            raise CliError(f"--{prefix}{new} given twice (once under its old name)")
        out[new] = value
    return out


def renamed_keys(renamed: Mapping[str, str], data: dict[str, Any], where: str, source: str) -> dict[str, Any]:
    """Old top-level YAML keys, accepted like old flags: moved to their new (nested) place."""
    out = dict(data)
    for old in [k for k in data if isinstance(k, str)]:
        new = _new_name(renamed, old, data[old])
        if new == old:
            continue
        value = out.pop(old)
        _notice(f"{where}{old} in {source}", f"{where}{new}")
        *parents, last = new.split(".")
        node = out
        for part in parents:
            node[part] = dict(node.get(part) or {})
            node = node[part]
        if last in node:
            raise CliError(f"{where}{new} given twice in {source} (once under its old name)")
        node[last] = value
    return out


def parse_config(model: type[BaseModel], argv: list[str], renamed: Mapping[str, str] | None = None) -> Any:
    """One config model from `--a.b value` flags over `--config FILE` (YAML keyed by the model's own fields):
    the env commands' grammar, for a command whose whole config is one model (batch_runner)."""
    renamed = renamed or {}
    flags = renamed_flags(renamed, split_flags(argv), "")
    path = flags.pop("config", None)
    if path is not None and not isinstance(path, str):
        raise CliError("--config takes a YAML file: --config run.yaml")
    source = path or "the command line"
    data = renamed_keys(renamed, _load_yaml(path, None), "", source) if path else {}
    from_flags = _nest(model, flags, "")
    check_keys(model, data, "", f" in {source}")
    check_keys(model, from_flags, "--")
    # Nested sections start from their defaults (as an env's config does), so a partial one keeps its `kind`.
    sections = {
        name: default.model_dump()
        for name, field in model.model_fields.items()
        if isinstance(default := field.get_default(call_default_factory=True), BaseModel)
    }
    merged = _merge(sections, data, from_flags)
    missing = [name for name, field in model.model_fields.items() if field.is_required() and name not in merged]
    if missing:
        raise CliError(f"--{missing[0]} is required (a flag, or a key of --config)")
    return _validate(model, merged, "", flags, source)


def parse_invocation(env_cls: Any, argv: list[str]) -> Invocation:
    if not argv or argv[0] not in COMMANDS:
        got = f" {argv[0]!r}" if argv else ""
        raise CliError(f"unknown command{got}; use one of: {', '.join(COMMANDS)} (e.g. `process --env.total_steps 2`)")
    command, flags = argv[0], split_flags(argv[1:])
    env_flags = {k[4:]: v for k, v in flags.items() if k.startswith("env.")}
    oai_flags = {k[7:]: v for k, v in flags.items() if k.startswith("openai.")}
    config_cls = env_cls.env_config_cls
    for key in flags:
        if key.startswith(("env.", "openai.")) or key in GLOBAL_FLAGS:
            continue
        choices = [
            *GLOBAL_FLAGS,
            *(f"env.{f}" for f in _honoured(config_cls)),
            *(f"openai.{f}" for f in APIServerConfig.model_fields),
        ]
        raise _unknown("flag", key, choices, "--")
    source = str(flags.get("config")) if isinstance(flags.get("config"), str) else "the config file"
    yaml_config = _load_yaml(flags["config"]) if isinstance(flags.get("config"), str) else {}

    env_yaml = yaml_config.get("env") or {}
    if not isinstance(env_yaml, dict):
        raise CliError(f"the env section of {source} must be a mapping")
    renamed = getattr(config_cls, "renamed", {})  # old names, for one release
    env_flags = renamed_flags(renamed, env_flags, "env.")
    env_from_flags = _nest(config_cls, env_flags, "env.")
    env_yaml = renamed_keys(renamed, env_yaml, "env.", source)
    check_keys(config_cls, env_yaml, "env.", f" in {source}")
    check_keys(config_cls, env_from_flags, "--env.")

    default_env, default_servers = env_cls.config_init()
    base = default_env.model_dump()
    given = {**env_yaml, **env_from_flags}
    if command == "process":
        # atroposlib's process keeps every group and their messages.
        base.update(ensure_scores_are_not_same=False, include_messages=True)
        if base.get("data_path_to_save_groups") is None:
            base["data_path_to_save_groups"] = f"data/{env_cls.name or 'groups'}.jsonl"
    if command == "serve":
        if "total_steps" not in given:
            base["total_steps"] = -1  # the trainer's run length, from run-api
        if not base.get("wandb_name"):
            base["wandb_name"] = env_cls.name
    tinker = yaml_config.get("tinker")
    if tinker is not None and "require_inference_logprobs" in config_cls.model_fields:
        base["require_inference_logprobs"] = True
    env_config = _validate(config_cls, _merge(base, env_yaml, env_from_flags), "env.", env_flags, source)

    oai_yaml = yaml_config.get("openai")
    servers_default = default_servers if isinstance(default_servers, list) else [default_servers]
    if isinstance(oai_yaml, list) and len(oai_yaml) >= 2:
        if oai_flags:
            raise CliError("--openai.* flags cannot change a multi-server `openai:` list; edit the YAML instead")
        for i, entry in enumerate(oai_yaml):
            if not isinstance(entry, dict):
                raise CliError(f"openai[{i}] in {source} must be a mapping")
            check_keys(APIServerConfig, entry, f"openai[{i}].", f" in {source}")
        servers = [_validate(APIServerConfig, e, f"openai[{i}].", {}, source) for i, e in enumerate(oai_yaml)]
    else:
        single = oai_yaml[0] if isinstance(oai_yaml, list) and oai_yaml else (oai_yaml or {})
        if not isinstance(single, dict):
            raise CliError(f"the openai section of {source} must be a mapping or a list of mappings")
        check_keys(APIServerConfig, single, "openai.", f" in {source}")
        oai_from_flags = _nest(APIServerConfig, oai_flags, "openai.")
        check_keys(APIServerConfig, oai_from_flags, "--openai.")
        if len(servers_default) >= 2 and not (single or oai_from_flags):
            servers = [APIServerConfig.model_validate(s.model_dump()) for s in servers_default]
        else:
            merged = _merge(servers_default[0].model_dump(), single, oai_from_flags)
            servers = [_validate(APIServerConfig, merged, "openai.", oai_flags, source)]
    for server in servers:
        if not server.api_key:
            server.api_key = read_api_key()
    return Invocation(
        command=command,
        env_config=env_config,
        server_configs=servers,
        verbose=bool(flags.get("verbose")),
        slurm=_as_bool(flags.get("slurm", yaml_config.get("slurm", False)), "slurm"),
        testing=_as_bool(flags.get("testing", yaml_config.get("testing", False)), "testing"),
        tinker=tinker if isinstance(tinker, dict) else None,
        total_steps_given="total_steps" in given,
    )


def _as_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise CliError(f"--{name} takes true or false; got {value!r}")


def read_api_key() -> str | None:
    """The one place a model-server key is read from the environment (never logged)."""
    return os.environ.get("OPENAI_API_KEY") or None


# ---- secrets ------------------------------------------------------------------------------


def redact(data: Any) -> Any:
    """A copy with the values of key/token/secret fields replaced, at any depth."""
    if isinstance(data, dict):
        return {
            k: (REDACTED if v and isinstance(k, str) and any(s in k.lower() for s in SECRET_KEYS) else redact(v))
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [redact(v) for v in data]
    return data


class _SecretFilter(logging.Filter):
    """Masks known secret values in every log record, whatever formatted them."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s and len(s) >= 4]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(s in message for s in self.secrets):
            for s in self.secrets:
                message = message.replace(s, REDACTED)
            record.msg, record.args = message, None
        return True


def install_secret_filter(secrets: list[str]) -> None:
    log_filter = _SecretFilter(secrets)
    root = logging.getLogger()
    root.addFilter(log_filter)
    for handler in root.handlers:
        handler.addFilter(log_filter)


def config_dump(inv: Invocation) -> str:
    payload = {
        "env": redact(inv.env_config.model_dump(mode="json")),
        "openai": [redact(s.model_dump(mode="json")) for s in inv.server_configs],
    }
    return yaml.safe_dump(payload, sort_keys=False)
