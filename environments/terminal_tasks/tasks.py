"""Terminal tasks in their published formats, loaded into one `TerminalTask` model.

Harbor / Terminal-Bench 2 (read from Harbor's `models/task/config.py` and its docs page
"Task Structure"): a directory with `instruction.md`, `task.toml` (`[metadata]` free-form;
`[verifier] timeout_sec, env`; `[agent] timeout_sec`; `[solution] env`; `[environment]
build_timeout_sec, docker_image, cpus, memory_mb, storage_mb, allow_internet`),
`environment/` (build context, usually a Dockerfile), `solution/solve.sh` and
`tests/test.sh`. The harness copies `tests/` to /tests only at verification time and
`solution/` to /solution for the oracle; test.sh writes /logs/verifier/reward.txt (a number)
or reward.json (numeric metrics), reward.txt read first.

Endless Terminals (read from kanishkg/endless-terminals `generate_tasks.py`,
`generator/env.py`, `train/prepare_endless.py`): a `task_*` directory with `task.json`
(`description`, `truth`, `name`), `test_initial_state.py`, `test_final_state.py` and an
Apptainer `container.def` whose `%post` builds the initial state under /home/user, the
agent's working directory; the final test is copied in afterwards and run with pytest, a
pass is the reward. The hub dataset rows (`prepare_endless.py`) carry `description` and
`task_dir`, pointing at such directories.

Our sandboxes expose one writable workspace at a fixed path, so a task's own absolute paths
(its working directory, Harbor's /tests, /solution and /logs) are mapped into it
(`PathMap`). The environment is replayed into the workspace where that reproduces it
(files copied, commands run there); what needs an image (system packages) is recorded as
`local_skip` and runs only on a backend given the task's image.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, Field

from environments.terminal_tasks.runnability import (
    OWNERSHIP_CHECK,
    Machine,
    Problem,
    sandbox_pytest_script,
    scan_script,
)

__all__ = [
    "TerminalTask",
    "SetupStep",
    "PathMap",
    "load_tasks_dir",
    "load_harbor_task",
    "load_endless_task",
    "load_endless_rows",
    "replay_command",
    "BUNDLED_TASKS",
    "ENDLESS_HOME",
]

BUNDLED_TASKS = Path(__file__).parent / "data"
ENDLESS_HOME = "/home/user"  # Endless Terminals' agent home and working directory (generator/env.py --pwd)
HARBOR_DEFAULT_WORKDIR = "/app"  # Terminal-Bench images' usual WORKDIR, when a Dockerfile names none
HARBOR_SPECIAL = ("/tests", "/solution", "/logs")

# Base images whose userland this machine stands in for (Debian/Ubuntu with python3); packages
# beyond that are checked against this machine itself (runnability.Machine).
LOCAL_BASE_IMAGES = re.compile(r"^(docker://)?(python|ubuntu|debian|buildpack-deps)(:|$)|^\./ubuntu_[\d.]+\.sif$")
# Variables the sandbox owns: its PATH leads to the interpreter the verifier runs, HOME is the verifier's own.
SANDBOX_ENV = frozenset({"PATH", "HOME"})
_SANDBOX_ENV_WHY = "kept as the sandbox sets them"
_COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


class SetupStep(BaseModel):
    """One step of building the initial state, in the task's own paths."""

    kind: Literal["workdir", "copy", "run", "env"]
    source: str | None = None  # copy: path in the build context
    target: str | None = None  # workdir/copy: task path
    command: str | None = None  # run
    name: str | None = None  # env
    value: str | None = None


class TerminalTask(BaseModel):
    id: str
    format: Literal["harbor", "endless"]
    instruction: str
    path: Path = Field(..., description="The task's directory")
    workdir: str = Field(..., description="Working directory in the task's own filesystem")
    setup: list[SetupStep] = Field(default_factory=list)
    context_dir: Path | None = Field(None, description="Where COPY sources live (Harbor: environment/)")
    tests_dir: Path | None = Field(None, description="Harbor: tests/ (test.sh inside)")
    final_test: Path | None = Field(None, description="Endless Terminals: test_final_state.py")
    initial_test: Path | None = Field(None, description="Endless Terminals: test_initial_state.py")
    solution_dir: Path | None = None
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    verifier_env: dict[str, str] = Field(default_factory=dict)
    solution_env: dict[str, str] = Field(default_factory=dict)
    allow_internet: bool = False
    docker_image: str | None = Field(None, description="Prebuilt image named by the task")
    base_image: str | None = Field(None, description="FROM of its Dockerfile / Apptainer def")
    image_recipe: str | None = Field(None, description="Dockerfile or container.def text")
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    local_problems: list[Problem] = Field(
        default_factory=list, description="Every reason the local sandbox cannot reproduce this task"
    )
    local_skip: str | None = Field(None, description="Why the local sandbox cannot reproduce this task (None: it can)")
    unsupported: list[str] = Field(
        default_factory=list, description="Task fields the local backend does not honour, one line each"
    )
    solution_commands: list[str] | None = Field(
        None, description="Endless Terminals: the commands of a solved sampled solution (solutions/*summary.json)"
    )
    sandbox_pytest_test_script: str | None = Field(
        None, description="test.sh with its test-tool bootstrap replaced by the sandbox's pytest (opt-in)"
    )
    test_script: str | None = Field(None, description="Run instead of tests/test.sh when set (the opt-in)")

    @property
    def has_solution(self) -> bool:
        return self.solution_dir is not None or bool(self.solution_commands)

    @property
    def only_bootstrap_blocks(self) -> bool:
        """Runs locally once test.sh uses the sandbox's pytest instead of fetching its own."""
        return bool(self.local_problems) and all(p.bootstrap for p in self.local_problems)

    @property
    def workdir_root(self) -> str:
        """The directory mapped onto the workspace: the first WORKDIR (later ones nest inside it)."""
        return next((s.target for s in self.setup if s.kind == "workdir" and s.target), self.workdir)


# -- path mapping -------------------------------------------------------------------------------


class PathMap:
    """Rewrites a task's absolute paths to where they live in the sandbox workspace."""

    def __init__(self, mapping: dict[str, str]) -> None:
        # Longest prefix first, so /app/project wins over /app.
        clean = {k.rstrip("/"): v for k, v in mapping.items()}
        if "" in clean:
            raise ValueError("the filesystem root cannot be mapped onto the workspace")
        self.mapping = dict(sorted(clean.items(), key=lambda kv: -len(kv[0])))
        alternatives = "|".join(re.escape(p) for p in self.mapping)
        # A prefix counts only as a whole path: not inside a longer word or path (/application, /x/app).
        self._re = re.compile(rf"(?<![\w.\-/~$])({alternatives})(?=/|(?![\w.\-]))") if self.mapping else None

    @classmethod
    def for_task(
        cls, task: TerminalTask, workspace: str, *, verify_dir: str | None = None, solution_dir: str | None = None
    ) -> "PathMap":
        mapping = {task.workdir_root: workspace}
        if verify_dir:
            mapping["/tests"] = f"{verify_dir}/tests"
            mapping["/logs"] = f"{verify_dir}/logs"
        if solution_dir:
            mapping["/solution"] = solution_dir
        return cls(mapping)

    def __call__(self, text: str) -> str:
        if self._re is None:
            return text
        return self._re.sub(lambda m: self.mapping[m.group(1)], text)


# -- Harbor -------------------------------------------------------------------------------------


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


# Harbor task.toml fields (harbor models/task/config.py, schema 1.0 and 1.1) and what the local backend does
# with them; anything else is reported as unknown.
_HARBOR_TOP = {
    "version",
    "schema_version",
    "task",
    "metadata",
    "verifier",
    "agent",
    "environment",
    "solution",
    "source",
}
_HARBOR_ENV_HONOURED = {"docker_image", "env", "workdir"}


def _harbor_fields(config: dict[str, Any], task_dir: Path) -> tuple[list[str], list[Problem]]:
    """(fields the local backend does not honour, one line each; fields that make the task unrunnable here)."""
    unsupported: list[str] = []
    problems: list[Problem] = []
    for key, value in config.items():
        if key == "artifacts":
            if value:
                unsupported.append(f"artifacts = {value!r} (not collected by this backend)")
        elif key not in _HARBOR_TOP:
            unsupported.append(f"{key} (unknown task.toml field, ignored)")
    for section in ("verifier", "agent"):
        for key, value in (config.get(section) or {}).items():
            if key in ("timeout_sec", "env"):
                continue
            if value not in (None, [], "", {}):
                unsupported.append(f"[{section}].{key} = {value!r} (not supported by this backend)")
    env_cfg = config.get("environment") or {}
    for key, value in env_cfg.items():
        if key in _HARBOR_ENV_HONOURED:
            continue
        if key == "gpus":
            if value:
                problems.append(Problem(text=f"task.toml [environment] gpus = {value}: no GPU in the local sandbox"))
        elif key == "mcp_servers":
            if value:
                names = ", ".join(str(s.get("name")) for s in value if isinstance(s, dict))
                problems.append(
                    Problem(text=f"task.toml [environment] mcp_servers ({names}): not started by this backend")
                )
        elif key == "allow_internet":
            if value:
                unsupported.append("[environment].allow_internet = true (the local sandbox gives no network)")
        elif key == "build_timeout_sec":
            unsupported.append(f"[environment].{key} = {value!r} (setup runs under --env.setup_timeout_s)")
        elif key in ("cpus", "memory_mb", "memory", "storage_mb", "storage"):
            unsupported.append(f"[environment].{key} = {value!r} (the local sandbox sets no per-task limit)")
        elif value not in (None, [], "", {}):
            unsupported.append(f"[environment].{key} = {value!r} (not supported by this backend)")
    env_vars = env_cfg.get("env") or {}
    kept_by_sandbox = [k for k in env_vars if k in SANDBOX_ENV]
    if kept_by_sandbox:
        unsupported.append(f"[environment.env] = {' '.join(kept_by_sandbox)} ({_SANDBOX_ENV_WHY})")
    env_vars = {k: v for k, v in env_vars.items() if k not in SANDBOX_ENV}
    templated = [k for k, v in env_vars.items() if "$" in str(v)]
    if templated:
        unsupported.append(
            f"[environment.env] = {' '.join(templated)} (templated on Harbor's host environment: not set)"
        )
    if len(templated) < len(env_vars):
        unsupported.append(
            f"[environment.env] = {' '.join(k for k in env_vars if k not in templated)} "
            "(set for setup, solution and tests, not in the agent's shell)"
        )
    for name in _COMPOSE_FILES:
        if (task_dir / "environment" / name).is_file():
            problems.append(Problem(text=f"environment/{name}: multi-container environment (needs docker compose)"))
    return unsupported, problems


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
        cpus=float(env_cfg.get("cpus", 1)),
        memory_mb=int(memory or 2048),
        storage_mb=int(storage or 10240),
        local_problems=problems,
        local_skip="; ".join(p.text for p in problems) or None,
        unsupported=unsupported,
        sandbox_pytest_test_script=sandbox_pytest_script(test_sh, machine)
        if any(p.bootstrap for p in problems)
        else None,
    )


# -- Endless Terminals ---------------------------------------------------------------------------


def _def_sections(text: str) -> tuple[dict[str, str], dict[str, list[str]], list[str]]:
    """Header keywords (Bootstrap, From), %sections (with their arguments) of an Apptainer definition file.

    As Apptainer reads it: a section starts with `%name` at the start of a line (arguments such as
    `%post -c /bin/bash` or `%files from stage` follow it); header lines are `Key: value`, `#` comments
    are ignored there; a section's body is everything up to the next section.
    """
    header: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    args: list[str] = []
    current = None
    for line in text.splitlines():
        m = re.match(r"^%(\w+)\b(.*)$", line.strip())
        if m and line.lstrip().startswith("%"):
            current = m.group(1).lower()
            sections.setdefault(current, [])
            if m.group(2).strip():
                args.append(f"%{current}{m.group(2)}")
        elif current is None:
            if line.strip().startswith("#"):
                continue
            key, sep, value = line.partition(":")
            if sep and key.strip():
                header[key.strip().lower()] = value.strip()
        else:
            sections[current].append(line)
    return header, sections, args


def _dedent_script(script: str) -> str:
    """%post bodies are indented in the def file; heredoc terminators must start their line."""
    lines = script.splitlines()
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    cut = min(indents) if indents else 0
    return "\n".join(line[cut:] if line[:cut].strip() == "" else line for line in lines)


def _def_environment(lines: list[str]) -> dict[str, str]:
    """`export K=V` / `K=V` lines of %environment (comments and blank lines skipped)."""
    env: dict[str, str] = {}
    for line in lines:
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            words = words[1:]
        for word in words:
            name, sep, value = word.partition("=")
            if sep and re.fullmatch(r"[A-Za-z_]\w*", name):
                env[name] = value
    return env


_DONE = re.compile(r"<action>\s*done\s*</action>", re.I)
_COMMAND = re.compile(r"<command>\s*(.*?)\s*</command>", re.I | re.S)


def _sampled_solution(task_dir: Path) -> list[str] | None:
    """Commands of the first solved run in solutions/*summary.json (generate_solutions.py / sample_solutions.py).

    Each assistant turn ran its last <command>...</command> (sample_solutions._extract_action) until
    <action>done</action>; the runs' shell was one interactive session, so they replay in order.
    """
    for summary in sorted((task_dir / "solutions").glob("*summary.json")):
        data = json.loads(summary.read_text())
        for run in data.get("results") or []:
            if not run.get("success"):
                continue
            commands = []
            for message in run.get("messages") or []:
                if message.get("role") != "assistant":
                    continue
                content = message.get("content") or ""
                if _DONE.search(content):
                    break
                found = _COMMAND.findall(content)
                if found and found[-1].strip().lower() != "done":
                    commands.append(found[-1].strip())
            if commands:
                return commands
    return None


def load_endless_task(
    task_dir: Path, *, description: str | None = None, machine: Machine | None = None
) -> TerminalTask:
    machine = machine or Machine()
    task_dir = Path(task_dir).resolve()
    meta = json.loads((task_dir / "task.json").read_text())
    final = task_dir / "test_final_state.py"
    if not final.is_file():
        raise ValueError(f"{task_dir}: Endless Terminals tasks need test_final_state.py")
    recipe = (task_dir / "container.def").read_text() if (task_dir / "container.def").is_file() else None
    steps: list[SetupStep] = []
    problems: list[Problem] = []
    unsupported: list[str] = []
    base, env = None, {}
    tests_text = final.read_text() + (
        (task_dir / "test_initial_state.py").read_text() if (task_dir / "test_initial_state.py").is_file() else ""
    )
    if recipe is None:
        problems.append(Problem(text="no container.def"))
    else:
        header, sections, args = _def_sections(recipe)
        base = header.get("from")
        if not base and not any("".join(body).strip() for body in sections.values()):
            problems.append(Problem(text="container.def is empty: the initial state cannot be reproduced"))
        elif base and not LOCAL_BASE_IMAGES.match(base):
            problems.append(Problem(text=f"base image {base} is not reproduced by the local sandbox"))
        problems += [
            Problem(text=f"container.def {a}: not supported by the local sandbox")
            for a in args
            if not re.fullmatch(r"%post\s+-c\s+/bin/(ba)?sh", a)  # the shell %post runs in: bash here too
        ]
        for line in sections.get("files", []):
            parts = shlex.split(line, comments=True)
            if parts:
                steps.append(SetupStep(kind="copy", source=parts[0], target=parts[1] if len(parts) > 1 else parts[0]))
        env = _def_environment(sections.get("environment", []))
        post = _dedent_script("\n".join(sections.get("post", [])))
        if post.strip():
            steps.append(SetupStep(kind="run", command=post))
            _, found = scan_script(
                post,
                where="container.def %post",
                machine=machine,
                roots=(ENDLESS_HOME,),
                ownership_checked=bool(OWNERSHIP_CHECK.search(tests_text)),
            )
            problems += found
        for name in ("setup", "test", "startscript"):
            if "".join(line for line in sections.get(name, []) if not line.strip().startswith("#")).strip():
                problems.append(Problem(text=f"container.def %{name}: not run by the local sandbox"))
        kept_by_sandbox = [k for k in env if k in SANDBOX_ENV]
        if kept_by_sandbox:
            unsupported.append(f"container.def:%environment = {' '.join(kept_by_sandbox)} ({_SANDBOX_ENV_WHY})")
        env = {k: v for k, v in env.items() if k not in SANDBOX_ENV}
        if env:
            unsupported.append(
                f"container.def:%environment = {' '.join(env)} (set for tests and solution, not in the agent's shell)"
            )
    for step in steps:
        if step.kind == "copy" and step.target and not PurePosixPath(step.target).is_relative_to(ENDLESS_HOME):
            problems.append(
                Problem(text=f"container.def %files copies {step.source} to {step.target}, outside {ENDLESS_HOME}")
            )
    solution = task_dir / "solution" if (task_dir / "solution" / "solve.sh").is_file() else None
    return TerminalTask(
        id=meta.get("name") or task_dir.name,
        format="endless",
        instruction=description or meta.get("description") or "",
        path=task_dir,
        workdir=ENDLESS_HOME,
        setup=[SetupStep(kind="env", name=k, value=v) for k, v in env.items()] + steps,
        context_dir=task_dir,
        final_test=final,
        initial_test=task_dir / "test_initial_state.py" if (task_dir / "test_initial_state.py").is_file() else None,
        solution_dir=solution,
        solution_commands=None if solution else _sampled_solution(task_dir),
        # Endless Terminals' own harness defaults (generator/env.py, prepare_endless --max-time).
        agent_timeout_s=300.0,
        verifier_timeout_s=300.0,
        verifier_env=dict(env),
        solution_env=dict(env),
        base_image=base,
        image_recipe=recipe,
        local_problems=problems,
        local_skip="; ".join(p.text for p in problems) or None,
        unsupported=unsupported,
    )


def replay_command(step: SetupStep, *, image_has_packages: bool) -> str:
    """A RUN step as the workspace replays it: installs, downloads and account changes dropped.

    Locally those are satisfied by this machine or the task was skipped; on an image backend the image did them.
    """
    assert step.kind == "run" and step.command is not None
    kept, _ = scan_script(step.command, where="", machine=None, roots=("/",), ownership_checked=False)
    return "\n".join(kept)


# -- directories and the hub dataset --------------------------------------------------------------


def load_tasks_dir(root: Path, *, errors: list[str] | None = None) -> list[TerminalTask]:
    """Every Harbor (task.toml) and Endless Terminals (task.json) task at or under `root` (two levels).

    With `errors`, a task that cannot be read is reported there ("name: why") and the rest still load.
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"--env.tasks_dir {root} is not a directory")
    candidates = [root] + sorted(p for p in root.iterdir() if p.is_dir())
    candidates += sorted(q for p in candidates[1:] for q in p.iterdir() if q.is_dir())
    machine = Machine()
    tasks = []
    for d in candidates:
        try:
            if (d / "task.toml").is_file() and (d / "instruction.md").is_file():
                tasks.append(load_harbor_task(d, machine=machine))
            elif (d / "task.json").is_file():
                tasks.append(load_endless_task(d, machine=machine))
        except (ValueError, OSError, KeyError, TypeError, tomllib.TOMLDecodeError) as exc:
            if errors is None:
                raise
            errors.append(f"{d.name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return tasks


def load_endless_rows(rows: Any, tasks_dir: Path | None, *, errors: list[str] | None = None) -> list[TerminalTask]:
    """Rows of the Endless Terminals hub dataset (`description`, `task_dir` or `extra_info.task_dir`).

    `task_dir` names the generated task directory; its last component is looked up under
    `tasks_dir` when given (the dataset's paths are those of the machine that built it).
    With `errors`, a row whose task cannot be read is reported there and the rest still load.
    """
    machine = Machine()
    tasks = []
    for row in rows:
        ref = (
            row.get("task_dir")
            or (row.get("extra_info") or {}).get("task_dir")
            or (row.get("reward_spec") or {}).get("ground_truth")
        )
        if not ref:
            raise ValueError(f"dataset row without task_dir: {sorted(row)}")
        path = Path(ref)
        if tasks_dir is not None:
            path = Path(tasks_dir) / path.name
        try:
            if not (path / "task.json").is_file():
                raise ValueError(
                    f"task directory {path} not found; pass --env.tasks_dir holding the generated task_* folders"
                )
            tasks.append(load_endless_task(path, description=row.get("description"), machine=machine))
        except (ValueError, OSError, KeyError, TypeError) as exc:
            if errors is None:
                raise
            errors.append(f"{path.name}: {type(exc).__name__}: {exc}")
    return tasks
