"""Endless Terminals task directories (read from kanishkg/endless-terminals `generate_tasks.py`,
`generator/env.py`): task.json, the Apptainer container.def (read by apptainer.py) with its %post and
%environment replayed into the workspace on the local backend (on docker the image is built from the definition
as Apptainer builds it: sandboxes.endless_recipe), and a solved sampled solution when the directory holds one.
The format: tasks.py's docstring."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path, PurePosixPath

from environments.terminal_tasks.apptainer import Unreproducible, def_dockerfile, parse_def
from environments.terminal_tasks.runnability import OWNERSHIP_CHECK, Machine, Problem, scan_script
from environments.terminal_tasks.tasks import (
    LOCAL_BASE_IMAGES,
    SANDBOX_ENV,
    SANDBOX_ENV_WHY,
    SetupStep,
    TerminalTask,
)

__all__ = ["load_endless_task", "ENDLESS_HOME"]

ENDLESS_HOME = "/home/user"  # Endless Terminals' agent home and working directory (generator/env.py --pwd)


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
        parsed = parse_def(recipe)
        header = parsed.header
        sections = {name: parsed.body(name).splitlines() for name in parsed.sections}
        args = [f"%{name} {s.args}" for name, bodies in parsed.sections.items() for s in bodies if s.args]
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
            unsupported.append(f"container.def:%environment = {' '.join(kept_by_sandbox)} ({SANDBOX_ENV_WHY})")
        env = {k: v for k, v in env.items() if k not in SANDBOX_ENV}
    for step in steps:
        if step.kind == "copy" and step.target and not PurePosixPath(step.target).is_relative_to(ENDLESS_HOME):
            problems.append(
                Problem(text=f"container.def %files copies {step.source} to {step.target}, outside {ENDLESS_HOME}")
            )
    image_skip = None
    try:
        def_dockerfile(meta.get("name") or task_dir.name, recipe or "", task_dir)
    except Unreproducible as exc:
        image_skip = str(exc)
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
        image_skip=image_skip,
    )
