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

# Packages the local sandbox already provides (its interpreter has pytest); installing only
# these is dropped when replaying an environment locally. Anything else needs the image.
LOCAL_PACKAGES = frozenset(
    "python3 python3-pip python3-pytest python3-venv python-is-python3 pytest pip git tar gzip coreutils "
    "findutils grep sed gawk ca-certificates bash procps".split()
)
LOCAL_BASE_IMAGES = re.compile(r"^(docker://)?(python|ubuntu|debian|buildpack-deps)(:|$)|^\./ubuntu_[\d.]+\.sif$")
_INSTALL = re.compile(
    r"^\s*(sudo\s+)?(apt-get|apt|apk|yum|dnf|pip3?|python3?\s+-m\s+pip|uv\s+pip|npm|conda)\s+(install|add)\b(.*)$"
)
_INDEX_UPDATE = re.compile(
    r"^\s*(sudo\s+)?(apt-get|apt|apk|yum|dnf)\s+(update|upgrade|clean)\b|^\s*rm\s+-rf\s+/var/lib/apt/lists"
)
_USERS = re.compile(r"^\s*(sudo\s+)?(useradd|adduser|groupadd|usermod|chown)\b")
_NETWORK = re.compile(r"\b(curl|wget)\b")


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
    local_skip: str | None = Field(None, description="Why the local sandbox cannot reproduce this task (None: it can)")

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


def _copy_args(rest: str) -> list[str]:
    if rest.startswith("["):
        return [str(a) for a in json.loads(rest)]
    return [a for a in shlex.split(rest) if not a.startswith("--")]


def _parse_dockerfile(text: str) -> tuple[str | None, list[SetupStep], str | None]:
    """(base image, setup steps, why it cannot be replayed locally)."""
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
            args = _copy_args(rest)
            if len(args) < 2 or any(re.match(r"^[a-z]+://", a) for a in args):
                problems.append(f"{word} {rest}")
                continue
            dest = str(PurePosixPath(workdir) / args[-1]) + ("/" if args[-1].endswith("/") else "")
            for src in args[:-1]:
                steps.append(
                    SetupStep(kind="copy", source=src, target=dest if len(args) == 2 else dest.rstrip("/") + "/")
                )
        elif word == "RUN":
            if "<<" in rest and re.search(r"<<-?\s*['\"]?\w+['\"]?\s*$", rest):
                problems.append("RUN with a heredoc")
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
    return base, steps, "; ".join(problems) or None


def _local_commands(command: str, *, image_has_packages: bool = False) -> tuple[str | None, str | None]:
    """A build command as the sandbox workspace can replay it: (command or None if nothing is left, problem).

    With `image_has_packages` (the task's own image was built) every install is dropped;
    otherwise only installs of what the local sandbox already has are.
    """
    kept = []
    # Segments joined by && / ; on one logical line; heredoc bodies pass through untouched.
    for segment in re.split(r"\s*(?:&&|;)\s*(?=(?:[^'\"]|'[^']*'|\"[^\"]*\")*$)", command):
        if not segment.strip() or _INDEX_UPDATE.match(segment) or _USERS.match(segment):
            continue  # package indexes and user accounts do not exist in a one-user workspace
        install = _INSTALL.match(segment)
        if install:
            packages = [p for p in shlex.split(install.group(4)) if not p.startswith("-")]
            packages = [re.split(r"[=<>~!\[]", p)[0] for p in packages]
            missing = [p for p in packages if p not in LOCAL_PACKAGES]
            if missing and not image_has_packages:
                return None, f"installs {' '.join(missing)}"
            continue
        if _NETWORK.search(segment):
            if image_has_packages:
                continue
            return None, "downloads at build time"
        kept.append(segment)
    return (" && ".join(kept) if kept else None), None


def _outside_workdir(steps: list[SetupStep]) -> str | None:
    """Files copied outside the directory mapped onto the workspace land where the sandbox is read-only."""
    root = next((s.target for s in steps if s.kind == "workdir" and s.target), None)
    for step in steps:
        if step.kind == "copy" and step.target and root and not PurePosixPath(step.target).is_relative_to(root):
            return f"copies {step.source} to {step.target}, outside the working directory {root}"
    return None


def _scripts_problem(task_dir: Path, names: list[str]) -> str | None:
    for name in names:
        path = task_dir / name
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if _INSTALL.match(line) or (_NETWORK.search(line) and not line.lstrip().startswith("#")):
                return f"{name} installs or downloads at run time ({line.strip()[:60]})"
    return None


def load_harbor_task(task_dir: Path) -> TerminalTask:
    task_dir = Path(task_dir).resolve()
    config = tomllib.loads((task_dir / "task.toml").read_text())
    if not (task_dir / "tests" / "test.sh").is_file():
        raise ValueError(f"{task_dir}: Harbor tasks need tests/test.sh")
    env_cfg = config.get("environment", {})
    dockerfile = task_dir / "environment" / "Dockerfile"
    recipe = dockerfile.read_text() if dockerfile.is_file() else None
    base, steps, problem = _parse_dockerfile(recipe) if recipe else (None, [], None)
    workdir = (
        next((s.target for s in reversed(steps) if s.kind == "workdir" and s.target), None) or HARBOR_DEFAULT_WORKDIR
    )
    skip = None
    if recipe is None:
        skip = f"no environment/Dockerfile (prebuilt image {env_cfg.get('docker_image')!r} only)"
    elif problem:
        skip = f"environment/Dockerfile: {problem}"
    elif base and not LOCAL_BASE_IMAGES.match(base):
        skip = f"base image {base} is not reproduced by the local sandbox"
    else:
        for step in steps:
            if step.kind == "run":
                _, why = _local_commands(step.command or "")
                if why:
                    skip = f"environment/Dockerfile RUN {why}"
                    break
    first_workdir = next((s.target for s in steps if s.kind == "workdir" and s.target), None) or workdir
    if PurePosixPath(first_workdir) == PurePosixPath("/"):
        skip = skip or "WORKDIR / cannot be mapped onto the workspace"
    skip = skip or _outside_workdir(steps) or _scripts_problem(task_dir, ["tests/test.sh", "solution/solve.sh"])
    memory = env_cfg.get("memory_mb")
    if memory is None and isinstance(env_cfg.get("memory"), str):  # deprecated "2G" form
        size = env_cfg["memory"].strip().upper()
        memory = int(float(size[:-1]) * (1024 if size.endswith("G") else 1))
    return TerminalTask(
        id=(config.get("task") or {}).get("name") or task_dir.name,
        format="harbor",
        instruction=(task_dir / "instruction.md").read_text(),
        path=task_dir,
        workdir=workdir,
        setup=steps,
        context_dir=task_dir / "environment",
        tests_dir=task_dir / "tests",
        solution_dir=task_dir / "solution" if (task_dir / "solution" / "solve.sh").is_file() else None,
        agent_timeout_s=float((config.get("agent") or {}).get("timeout_sec") or 600.0),
        verifier_timeout_s=float((config.get("verifier") or {}).get("timeout_sec", 600.0)),
        verifier_env={k: str(v) for k, v in ((config.get("verifier") or {}).get("env") or {}).items()},
        solution_env={k: str(v) for k, v in ((config.get("solution") or {}).get("env") or {}).items()},
        allow_internet=bool(env_cfg.get("allow_internet", True)),
        docker_image=env_cfg.get("docker_image"),
        base_image=base,
        image_recipe=recipe,
        cpus=float(env_cfg.get("cpus", 1)),
        memory_mb=int(memory or 2048),
        local_skip=skip,
    )


# -- Endless Terminals ---------------------------------------------------------------------------


def _def_sections(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """Header keywords (Bootstrap, From) and %sections of an Apptainer definition file."""
    header: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^%(\w+)\s*$", line.strip()) if line.startswith("%") else None
        if m:
            current = m.group(1).lower()
            sections.setdefault(current, [])
        elif current is None:
            key, sep, value = line.partition(":")
            if sep and key.strip():
                header[key.strip().lower()] = value.strip()
        else:
            sections[current].append(line)
    return header, {k: "\n".join(v) for k, v in sections.items()}


def _dedent_script(script: str) -> str:
    """%post bodies are indented in the def file; heredoc terminators must start their line."""
    lines = script.splitlines()
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    cut = min(indents) if indents else 0
    return "\n".join(line[cut:] if line[:cut].strip() == "" else line for line in lines)


def load_endless_task(task_dir: Path, *, description: str | None = None) -> TerminalTask:
    task_dir = Path(task_dir).resolve()
    meta = json.loads((task_dir / "task.json").read_text())
    final = task_dir / "test_final_state.py"
    if not final.is_file():
        raise ValueError(f"{task_dir}: Endless Terminals tasks need test_final_state.py")
    recipe = (task_dir / "container.def").read_text() if (task_dir / "container.def").is_file() else None
    steps: list[SetupStep] = []
    skip, base = None, None
    if recipe is None:
        skip = "no container.def"
    else:
        header, sections = _def_sections(recipe)
        base = header.get("from")
        if base and not LOCAL_BASE_IMAGES.match(base):
            skip = f"base image {base} is not reproduced by the local sandbox"
        for line in sections.get("files", "").splitlines():
            parts = line.split()
            if len(parts) >= 1:
                steps.append(SetupStep(kind="copy", source=parts[0], target=parts[-1] if len(parts) > 1 else parts[0]))
        post = _dedent_script(sections.get("post", ""))
        if post.strip():
            steps.append(SetupStep(kind="run", command=post))
            kept, why = _local_script(post)
            if why:
                skip = skip or f"container.def %post {why}"
    return TerminalTask(
        id=meta.get("name") or task_dir.name,
        format="endless",
        instruction=description or meta.get("description") or "",
        path=task_dir,
        workdir=ENDLESS_HOME,
        setup=steps,
        context_dir=task_dir,
        final_test=final,
        initial_test=task_dir / "test_initial_state.py" if (task_dir / "test_initial_state.py").is_file() else None,
        solution_dir=task_dir / "solution" if (task_dir / "solution" / "solve.sh").is_file() else None,
        # Endless Terminals' own harness defaults (generator/env.py, prepare_endless --max-time).
        agent_timeout_s=300.0,
        verifier_timeout_s=300.0,
        base_image=base,
        image_recipe=recipe,
        local_skip=skip,
    )


def _local_script(script: str, *, image_has_packages: bool = False) -> tuple[str, str | None]:
    """A multi-line build script as the workspace replays it (line by line, heredoc bodies kept)."""
    out, heredoc_end = [], None
    for line in script.splitlines():
        if heredoc_end is not None:
            out.append(line)
            if line.strip() == heredoc_end:
                heredoc_end = None
            continue
        m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?\s*$", line)
        kept, why = _local_commands(line, image_has_packages=image_has_packages) if not m else (line, None)
        if why:
            return "", why
        if m:
            heredoc_end = m.group(1)
        if kept:
            out.append(kept)
    return "\n".join(out), None


def replay_command(step: SetupStep, *, image_has_packages: bool) -> str:
    """A RUN step as the workspace replays it (installs dropped: satisfied locally or by the image)."""
    assert step.kind == "run" and step.command is not None
    if "\n" in step.command:
        return _local_script(step.command, image_has_packages=image_has_packages)[0]
    return _local_commands(step.command, image_has_packages=image_has_packages)[0] or ""


# -- directories and the hub dataset --------------------------------------------------------------


def load_tasks_dir(root: Path) -> list[TerminalTask]:
    """Every Harbor (task.toml) and Endless Terminals (task.json) task at or under `root` (two levels)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"--env.tasks_dir {root} is not a directory")
    candidates = [root] + sorted(p for p in root.iterdir() if p.is_dir())
    candidates += sorted(q for p in candidates[1:] for q in p.iterdir() if q.is_dir())
    tasks = []
    for d in candidates:
        if (d / "task.toml").is_file() and (d / "instruction.md").is_file():
            tasks.append(load_harbor_task(d))
        elif (d / "task.json").is_file():
            tasks.append(load_endless_task(d))
    return tasks


def load_endless_rows(rows: Any, tasks_dir: Path | None) -> list[TerminalTask]:
    """Rows of the Endless Terminals hub dataset (`description`, `task_dir` or `extra_info.task_dir`).

    `task_dir` names the generated task directory; its last component is looked up under
    `tasks_dir` when given (the dataset's paths are those of the machine that built it).
    """
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
        if not (path / "task.json").is_file():
            raise ValueError(
                f"task directory {path} not found; pass --env.tasks_dir holding the generated task_* folders"
            )
        tasks.append(load_endless_task(path, description=row.get("description")))
    return tasks
