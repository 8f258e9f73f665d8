"""Harbor / Terminal-Bench 2 task directories (read from Harbor's `models/task/config.py` and its docs page
"Task Structure") loaded into a `TerminalTask`: task.toml's fields, the Dockerfile's steps replayed into the
workspace, and every reason the local sandbox cannot reproduce the task. The format: tasks.py's docstring."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

from environments.terminal_tasks.runnability import (
    OWNERSHIP_CHECK,
    Machine,
    Problem,
    sandbox_pytest_script,
    scan_script,
)
from environments.terminal_tasks.tasks import (
    LOCAL_BASE_IMAGES,
    SANDBOX_ENV,
    SANDBOX_ENV_WHY,
    SetupStep,
    TerminalTask,
)

__all__ = ["load_harbor_task", "HARBOR_DEFAULT_WORKDIR"]

HARBOR_DEFAULT_WORKDIR = "/app"  # Terminal-Bench images' usual WORKDIR, when a Dockerfile names none
HARBOR_SPECIAL = ("/tests", "/solution", "/logs")
_COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


def _dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    if buf.strip():
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _copy_args(rest: str) -> tuple[list[str], list[str]]:
    """(flags, sources + destination) of a COPY/ADD."""
    if rest.startswith("["):
        return [], [str(a) for a in json.loads(rest)]
    words = shlex.split(rest)
    return [a for a in words if a.startswith("--")], [a for a in words if not a.startswith("--")]


def _parse_dockerfile(text: str) -> tuple[str | None, list[SetupStep], list[str]]:
    """(base image, setup steps, what cannot be replayed locally)."""
    base, steps, workdir = None, [], HARBOR_DEFAULT_WORKDIR
    problems: list[str] = []
    for word, rest in _dockerfile_instructions(text):
        if word == "FROM":
            if base is not None:
                problems.append("multi-stage build")
            base = rest.split()[0] if rest else None
        elif word == "WORKDIR":
            workdir = str(PurePosixPath(workdir) / rest)
            steps.append(SetupStep(kind="workdir", target=workdir))
        elif word in ("COPY", "ADD"):
            flags, args = _copy_args(rest)
            if any(f.startswith("--from") for f in flags):
                # Files from another image or build stage: nothing in the build context to copy.
                problems.append(f"{word} {rest} copies from another image")
                continue
            if len(args) < 2 or any(re.match(r"^[a-z]+://", a) for a in args):
                problems.append(f"{word} {rest}")
                continue
            dest = str(PurePosixPath(workdir) / args[-1]) + ("/" if args[-1].endswith("/") else "")
            for src in args[:-1]:
                steps.append(
                    SetupStep(kind="copy", source=src, target=dest if len(args) == 2 else dest.rstrip("/") + "/")
                )
        elif word == "RUN":
            steps.append(SetupStep(kind="run", command=rest))
        elif word == "ENV":
            pairs = re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", rest) or ([tuple(rest.split(None, 1))] if " " in rest else [])
            for name, value in pairs:
                steps.append(SetupStep(kind="env", name=name, value=value.strip('"')))
        elif word in (
            "LABEL",
            "CMD",
            "ENTRYPOINT",
            "EXPOSE",
            "ARG",
            "USER",
            "SHELL",
            "STOPSIGNAL",
            "HEALTHCHECK",
            "VOLUME",
            "MAINTAINER",
            "ONBUILD",
        ):
            continue
        else:
            problems.append(f"unknown instruction {word}")
    return base, steps, problems


def _outside_workdir(steps: list[SetupStep]) -> str | None:
    """Files copied outside the directory mapped onto the workspace land where the sandbox is read-only."""
    root = next((s.target for s in steps if s.kind == "workdir" and s.target), None)
    for step in steps:
        if step.kind == "copy" and step.target and root and not PurePosixPath(step.target).is_relative_to(root):
            return f"copies {step.source} to {step.target}, outside the working directory {root}"
    return None


def _texts(root: Path, pattern: str = "*") -> list[tuple[Path, str]]:
    return (
        [
            (p, p.read_text(errors="replace"))
            for p in sorted(root.rglob(pattern))
            if p.is_file() and p.stat().st_size < 1_000_000
        ]
        if root.is_dir()
        else []
    )


def _script_problems(
    task_dir: Path, dirs: list[str], *, machine: Machine, roots: tuple[str, ...], ownership_checked: bool
) -> list[Problem]:
    """Problems of every shell script under `dirs` (test.sh, its helpers, solve.sh)."""
    found: list[Problem] = []
    for d in dirs:
        for path, text in _texts(task_dir / d):
            if path.suffix != ".sh" and not text.startswith("#!/bin/") and not text.startswith("#!/usr/bin/env bash"):
                continue
            rel = str(path.relative_to(task_dir))
            _, problems = scan_script(
                text,
                where=rel,
                machine=machine,
                roots=roots,
                ownership_checked=ownership_checked,
                test_script=rel == "tests/test.sh",
            )
            found += [p for p in problems if p not in found]
    return found


# Harbor's task.toml schema (harbor models/task/config.py `TaskConfig`, schema 1.0 through 1.4 / Harbor 0.21) and
# what this project does with each field: honoured (None), reported once per field as not honoured (REPORT), or
# making the task unrunnable (BLOCK). A field that is not here is reported as unknown.
_HONOURED, _REPORT, _BLOCK = None, "report", "block"
_WHY_LIMITS = "the local sandbox sets no per-task limit"
_HARBOR_SCHEMA: dict[str, dict[str, tuple[str | None, str]]] = {
    "": {
        "version": (_HONOURED, ""),
        "schema_version": (_HONOURED, ""),
        "task": (_HONOURED, ""),  # [task].name is the id; description, authors, keywords, version: metadata
        "metadata": (_HONOURED, ""),
        "source": (_HONOURED, ""),
        "verifier": (_HONOURED, ""),
        "agent": (_HONOURED, ""),
        "environment": (_HONOURED, ""),
        "solution": (_HONOURED, ""),
        "artifacts": (_REPORT, "not collected by this backend"),
        "steps": (_BLOCK, "multi-step tasks (a verifier per step) are not run by this backend"),
        "multi_step_reward_strategy": (_REPORT, "multi-step tasks are not run by this backend"),
    },
    "verifier": {
        "timeout_sec": (_HONOURED, ""),
        "env": (_HONOURED, ""),
        "user": (_REPORT, "the verifier runs as the image's root on container backends, the slot's user locally"),
        "network_mode": (_REPORT, "network follows allow_internet and --env.task_network"),
        "allowed_hosts": (_REPORT, "no per-host allowlist"),
        "environment_mode": (_BLOCK, "a separate verifier container is not run by this backend"),
        "environment": (_BLOCK, "a separate verifier container is not run by this backend"),
        "collect": (_REPORT, "collect hooks are not run by this backend"),
    },
    "agent": {
        "timeout_sec": (_HONOURED, ""),
        "user": (_REPORT, "the agent runs as the slot's user"),
        "network_mode": (_REPORT, "network follows allow_internet and --env.task_network"),
        "allowed_hosts": (_REPORT, "no per-host allowlist"),
    },
    "solution": {"env": (_HONOURED, "")},
    "environment": {
        "docker_image": (_HONOURED, ""),
        "env": (_HONOURED, ""),
        "workdir": (_HONOURED, ""),
        "allow_internet": (_HONOURED, ""),
        "build_timeout_sec": (_REPORT, "no image is built; setup runs under --env.setup_timeout_s"),
        "cpus": (_REPORT, _WHY_LIMITS),
        "memory_mb": (_REPORT, _WHY_LIMITS),
        "memory": (_REPORT, _WHY_LIMITS),
        "storage_mb": (_REPORT, _WHY_LIMITS),
        "storage": (_REPORT, _WHY_LIMITS),
        "gpus": (_BLOCK, "no GPU in the local sandbox"),
        "gpu_types": (_REPORT, "no GPU in the local sandbox"),
        "tpu": (_BLOCK, "no TPU here"),
        "os": (_BLOCK, "only Linux containers"),
        "mcp_servers": (_BLOCK, "not started by this backend"),
        "network_mode": (_REPORT, "network follows allow_internet and --env.task_network"),
        "allowed_hosts": (_REPORT, "no per-host allowlist"),
        "skills_dir": (_REPORT, "no skills directory is given to the agent"),
        "healthcheck": (_REPORT, "not run by this backend"),
    },
}


def _unset(value: Any) -> bool:
    return value in (None, [], "", {}, 0) or value is False


def _harbor_fields(config: dict[str, Any], task_dir: Path) -> tuple[list[str], list[Problem]]:
    """(fields not honoured, one line each naming the field and why; fields that make the task unrunnable here)."""
    unsupported: list[str] = []
    problems: list[Problem] = []
    sections = [("", config)] + [(name, config.get(name) or {}) for name in _HARBOR_SCHEMA if name]
    for section, values in sections:
        if not isinstance(values, dict):
            continue
        for key, value in values.items():
            field = f"[{section}].{key}" if section else key
            action, why = _HARBOR_SCHEMA[section].get(key, (_REPORT, "unknown task.toml field, ignored"))
            if action is _HONOURED or (key != "os" and _unset(value)) or (key == "os" and value == "linux"):
                continue
            if action == _BLOCK:
                problems.append(Problem(text=f"task.toml {field} = {_short(value)}: {why}"))
            else:
                unsupported.append(f"{field} = {_short(value)} ({why})")
    env_vars = (config.get("environment") or {}).get("env") or {}
    kept_by_sandbox = [k for k in env_vars if k in SANDBOX_ENV]
    if kept_by_sandbox:
        unsupported.append(f"[environment.env] = {' '.join(kept_by_sandbox)} ({SANDBOX_ENV_WHY})")
    templated = [k for k, v in env_vars.items() if k not in SANDBOX_ENV and "$" in str(v)]
    if templated:
        unsupported.append(
            f"[environment.env] = {' '.join(templated)} (templated on Harbor's host environment: not set)"
        )
    for name in _COMPOSE_FILES:
        if (task_dir / "environment" / name).is_file():
            problems.append(Problem(text=f"environment/{name}: multi-container environment (needs docker compose)"))
    return unsupported, problems


def _short(value: Any) -> str:
    """A field's value for a one-line report (MCP servers by name)."""
    if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        return "[" + ", ".join(str(v["name"]) for v in value) + "]"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _size_mb(value: Any) -> int | None:
    """Harbor's deprecated "2G"/"512M" sizes (EnvironmentConfig._parse_size_to_mb)."""
    if value is None:
        return None
    size = str(value).strip().upper()
    scale = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    if size[-1:] in scale:
        return int(float(size[:-1]) * scale[size[-1]])
    raise ValueError(f"size {value!r} is not like '2G' or '512M'")


def load_harbor_task(task_dir: Path, *, machine: Machine | None = None) -> TerminalTask:
    machine = machine or Machine()
    task_dir = Path(task_dir).resolve()
    config = tomllib.loads((task_dir / "task.toml").read_text())
    if not (task_dir / "tests" / "test.sh").is_file():
        raise ValueError(f"{task_dir}: Harbor tasks need tests/test.sh")
    env_cfg = config.get("environment") or {}
    dockerfile = task_dir / "environment" / "Dockerfile"
    recipe = dockerfile.read_text() if dockerfile.is_file() else None
    base, steps, docker_problems = _parse_dockerfile(recipe) if recipe else (None, [], [])
    workdir = env_cfg.get("workdir") or (
        next((s.target for s in reversed(steps) if s.kind == "workdir" and s.target), None) or HARBOR_DEFAULT_WORKDIR
    )
    problems = [Problem(text=f"environment/Dockerfile: {p}") for p in docker_problems]
    if recipe is None:
        problems.append(
            Problem(text=f"no environment/Dockerfile (prebuilt image {env_cfg.get('docker_image')!r} only)")
        )
    elif base and not LOCAL_BASE_IMAGES.match(base):
        problems.append(Problem(text=f"base image {base} is not reproduced by the local sandbox"))
    first_workdir = next((s.target for s in steps if s.kind == "workdir" and s.target), None) or workdir
    if PurePosixPath(first_workdir) == PurePosixPath("/"):
        problems.append(Problem(text="WORKDIR / cannot be mapped onto the workspace"))
    outside = _outside_workdir(steps)
    if outside:
        problems.append(Problem(text=outside))
    tests_text = "\n".join(text for _, text in _texts(task_dir / "tests"))
    owners = bool(OWNERSHIP_CHECK.search(tests_text))
    for step in steps:
        if step.kind == "run" and step.command:
            _, found = scan_script(
                step.command,
                where="environment/Dockerfile RUN",
                machine=machine,
                roots=(first_workdir,),
                ownership_checked=owners,
            )
            problems += [p for p in found if p not in problems]
    roots = (first_workdir, *HARBOR_SPECIAL)
    run_text = "\n".join(s.command or "" for s in steps if s.kind == "run")
    for path, text in _texts(task_dir / "environment", "*.sh"):
        if path.name in run_text:  # a helper the Dockerfile runs: its commands are build commands
            _, found = scan_script(
                text,
                where=str(path.relative_to(task_dir)),
                machine=machine,
                roots=(first_workdir,),
                ownership_checked=owners,
            )
            problems += [p for p in found if p not in problems]
    problems += [
        p
        for p in _script_problems(
            task_dir, ["tests", "solution"], machine=machine, roots=roots, ownership_checked=owners
        )
        if p not in problems
    ]
    unsupported, field_problems = _harbor_fields(config, task_dir)
    problems += field_problems
    test_sh = (task_dir / "tests" / "test.sh").read_text()
    # Values templated on Harbor's host environment (${VAR}, ${VAR:-default}) are not resolved here (reported above).
    extra_env = {k: str(v) for k, v in (env_cfg.get("env") or {}).items() if "$" not in str(v) and k not in SANDBOX_ENV}
    memory = env_cfg.get("memory_mb") or _size_mb(env_cfg.get("memory"))
    storage = env_cfg.get("storage_mb") or _size_mb(env_cfg.get("storage"))
    return TerminalTask(
        id=(config.get("task") or {}).get("name") or task_dir.name,
        format="harbor",
        instruction=(task_dir / "instruction.md").read_text(),
        path=task_dir,
        workdir=workdir,
        setup=[SetupStep(kind="env", name=k, value=v) for k, v in extra_env.items()] + steps,
        context_dir=task_dir / "environment",
        tests_dir=task_dir / "tests",
        solution_dir=task_dir / "solution" if (task_dir / "solution" / "solve.sh").is_file() else None,
        agent_timeout_s=float((config.get("agent") or {}).get("timeout_sec") or 600.0),
        verifier_timeout_s=float((config.get("verifier") or {}).get("timeout_sec", 600.0)),
        verifier_env=extra_env | {k: str(v) for k, v in ((config.get("verifier") or {}).get("env") or {}).items()},
        solution_env=extra_env | {k: str(v) for k, v in ((config.get("solution") or {}).get("env") or {}).items()},
        allow_internet=bool(env_cfg.get("allow_internet", True)),
        docker_image=env_cfg.get("docker_image"),
        base_image=base,
        image_recipe=recipe,
        build_timeout_s=float(env_cfg.get("build_timeout_sec") or 600.0),
        cpus=float(env_cfg.get("cpus", 1)),
        memory_mb=int(memory or 2048),
        storage_mb=int(storage or 10240),
        local_problems=problems,
        local_skip="; ".join(p.text for p in problems) or None,
        unsupported=unsupported,
        # Fields no backend here runs (multi-step, a separate verifier, GPUs, MCP servers, compose, Windows).
        image_skip="; ".join(p.text for p in field_problems) or None,
        sandbox_pytest_test_script=sandbox_pytest_script(test_sh, machine)
        if any(p.bootstrap for p in problems)
        else None,
    )
