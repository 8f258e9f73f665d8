"""A Harbor task in its own container (backends/task_container.py), run as Harbor runs it.

The container is the agent's machine: the task's image, root (the image's user), a writable filesystem,
commands from the Dockerfile's final WORKDIR, `/logs/agent` and `/logs/verifier` made before the agent.
The oracle runs solution/solve.sh there (agents.py). After the agent: the engine's diff of the container
against its image is checked (`integrity_problems`), `/logs/verifier` is emptied, tests/ is copied to
/tests and `bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1` runs as root from the workdir with
the task's [verifier] env, under its timeout; the reward is read from /logs/verifier (reward.json, else
reward.txt). A container whose interpreters or loader the agent changed scores 0 and is flagged.

An Endless Terminals task runs the same way in the image its container.def builds (apptainer.py), as its
harness runs it: every command from /home/user with HOME=/home/user and `%environment` sourced, as the user the
publisher's non-setuid Apptainer ran it as (`endless_user="invoking"`: uid/gid 1000 owning every file of the image,
test_initial_state.py checked as root in the build) or as root (`"root"`, the initial check in the container); after
the agent, test_final_state.py is copied to /tests and run with the image's pytest as that user (pass = 1, else 0).

Reward integrity (the agent was root in the verifier's container; see docs/security.md): the tests run the
image's bash, python3, pytest/uv and the dynamic loader; the agent could replace any of them (a `python3`
that prints PASSED, an /etc/ld.so.preload library, a sitecustomize.py, a planted `uvx`). The engine's diff
is computed by the engine from the container's writable layer, not by any program inside it, so the
agent cannot hide a change from it. Any change to the loader's configuration or to a file under a
program/library/site-packages directory that existed in the image, and any added program named as the
tests' tooling, or an added *.pth/sitecustomize/usercustomize, flags the trajectory. New files a package
install adds elsewhere (new libraries, programs with other names, dpkg's and apt's state, ld.so.cache) are
allowed, so an honest `apt-get install` still scores. Each flag then goes to genuine.py's review: a file
byte-identical to what its claimed package publishes (the .deb apt fetches in a pristine-image container, the
wheel PyPI serves the host) is cleared, provided what it can import is genuine too; the same review flags an
added library that shadows one of the image's sonames in the loader's cache.
"""

from __future__ import annotations

import logging
import re
import secrets
import shlex
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Unpack

from backends.task_container import TaskContainer, TaskContainers, TaskContainerSpec
from environments.terminal_tasks.apptainer import (
    APPTAINER_ENV_FILE,
    INITIAL_STATE_FILE,
    EndlessUser,
    INVOKING_UID,
    INVOKING_USER,
    endless_pytest_command,
    environment_prefix,
)
from environments.terminal_tasks.genuine import PY_HOOKS, GenuineCheck, review_flags
from environments.terminal_tasks.reach import TOOL_FLAG, above
from environments.terminal_tasks.reward import RewardError, read_rewards
from environments.terminal_tasks.tasks import TerminalTask
from environments.terminal_tasks.container_guard import (
    FREEZE_LEFTOVERS,
    GUARD,
    GUARD_FAILED,
    STOP_LEFTOVERS,
    changed_tests,
)
from tools.executor import ExecOptions, ExecResult, FileOpError

__all__ = [
    "TaskContainerExecutor",
    "command_prefix",
    "endless_pytest",
    "initial_state_from_build",
    "EndlessUser",
    "ContainerVerdict",
    "integrity_problems",
    "integrity_flags",
    "verify_in_container",
    "task_spec",
    "unresolved_hosts",
]

log = logging.getLogger(__name__)

VERIFIER_DIR = "/logs/verifier"
AGENT_LOG_DIR = "/logs/agent"

# Where programs and the libraries they load live (any prefix: /usr, /usr/local, /opt/x, a pyenv's): a change
# to a file the image had there is a flag. Site-packages are the packages' own business (an honest `pip install
# -U` changes them), except the test runner's packages and the start-up hooks below.
# Not under the system's state and data trees (/var/lib/dpkg changes with every honest apt-get install).
_NOT_STATE = r"^(?!/(var|etc|tmp|run|srv|home|logs|tests|proc|dev|sys)/)"
_TOOL_DIRS = re.compile(_NOT_STATE + r"(.*/)?s?bin/[^/]+$")
_LIB_DIRS = re.compile(_NOT_STATE + r"(.*/)?lib(32|64|x32|exec)?/")
_SITE = re.compile(r"/(site|dist)-packages/")
# Programs the tests run by name: adding one (where the image had none) shadows or supplies the tests' own.
_TOOL_NAMES = re.compile(r"^(ba|da|z)?sh$|^python[\d.]*$|^pytest(-[\d.]+)?$|^py\.test$|^uvx?$|^pip[\d.]*$|^env$")
_LOADER = re.compile(r"^/etc/ld\.so\.(preload|conf)$|^/etc/ld\.so\.conf\.d/")
# Python's own module tree, any prefix (a planted `os.py`, or a `pluggy/` package, under lib/python3.X comes before
# every site directory, a uvx virtualenv's too): an added module there, at any depth, outside the site directories.
_PY_STDLIB = re.compile(r"^(?!.*/((site|dist)-packages|__pycache__)/).*/lib/python[\d.]+/.+\.(py|pyc|so)$")
# What decides sys.path before any module: the standard library's zip (first on it), a `._pth` beside an interpreter,
# a `pyvenv.cfg` that makes a prefix a virtualenv (one in a directory added with it is an honest new venv's).
_PY_PATH = re.compile(r"/lib/python\d+\.zip$|\._pth$")
# The test runner's own packages: one added to an earlier site directory shadows the image's.
_PY_RUNNER = re.compile(r"/(site|dist)-packages/(pytest|_pytest|pluggy|iniconfig|py|pip)(/|\.py$)")
# What every command of an Endless task sources before it runs (its %environment): the verifier's too.
_APPTAINER_ENV = re.compile("^" + re.escape(APPTAINER_ENV_FILE.rsplit("/", 2)[0]) + "(/|$)")


# What pytest reads before any test: a config file or conftest.py in the ancestors of /tests (the root; /tests itself
# is made afresh), which can add `--collect-only` or turn every report into a pass.
_RUNNER_CONFIG = re.compile(r"^/(\.?pytest\.(ini|toml)|pyproject\.toml|tox\.ini|setup\.cfg|setup\.py|conftest\.py)$")
# Where the tests look for programs on every image (root's login PATH, uv's installer and Pythons, its config): one
# the diff shows changed with nothing added or changed below it may now be a link to anywhere.
_SEARCHED = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin", "/root/.local/bin",
             "/root/.cargo/bin", "/root/.local/share/uv", "/root/.config/uv")  # fmt: skip
# Where the tests' `uvx -w pytest==...`/`pip install pytest` take packages from (uv's user and system config, pip's
# global, user, site and virtualenv files): a `find-links` to the agent's own wheels makes the runner the agent's.
_INSTALLER_CONFIG = re.compile(r"/(pip\.conf|pip\.ini|uv\.toml)$|^/etc/(uv|xdg/uv|xdg/pip)/|/\.config/(uv|pip)/")
# `python -m pytest` from the workdir (two published test.sh files) imports the runner from the workdir first.
_WORK_RUNNER = re.compile(r"^(pytest|_pytest|pluggy|iniconfig)(/|\.py$)|^py\.py$")
# ...and, for such a test.sh, any standard-library module pytest imports after `-m` put the workdir first (argparse,
# inspect, ...): a top-level module or package there named like one of the standard library's.
PYTHON_M_PYTEST = re.compile(r"\bpython[\d.]*(\s+-\S+)*\s+-m\s+pytest\b")
_TOP_MODULE = re.compile(r"^([A-Za-z_]\w*)(/|\.pyc?$|\..*\.so$|\.so$)")  # argparse.pyc alone is importable too

# What a login bash reads before its command (as root: HOME is /root).
_LOGIN_STARTUP = re.compile(
    r"^/etc/(profile|profile\.d/.*|bash\.bashrc)$|^/root/\.(bash_profile|bash_login|profile|bashrc)$"
)


def integrity_problems(changes: list[tuple[str, str]], workdir: str = "/app") -> list[str]:
    """What in the engine's diff (kind, path) could change what the tests' tools do, one line each (before the
    genuine-artefact review: `integrity_flags`)."""
    return [line for _, line in integrity_flags(changes, workdir)]


def integrity_flags(
    changes: list[tuple[str, str]], workdir: str = "/app", python_m_pytest: bool = False
) -> list[tuple[str, str]]:
    """(path, line) of what in the engine's diff could change what the tests' tools do.

    Programs and libraries under the task's working directory are the agent's work, not the tests' tools, except
    what `python -m pytest` run from there imports (`python_m_pytest`: test.sh runs the tests so).
    """
    paths = {p for _, p in changes}
    # The agent's work is not the tests' tools; a workdir of / would make everything the agent's work.
    work = workdir.rstrip("/") + "/" if workdir.strip("/") else "\0"
    # A Python tree apt brings where the image had none (Debian's /usr/lib/python3.X, /usr/lib/python3): a
    # new interpreter's own files, read by no interpreter of the image (a new user site dir is not exempt).
    new_trees = tuple(
        p + "/" for kind, p in changes if kind == "added" and re.fullmatch(r"/usr/lib/python3(\.\d+)?", p)
    )
    # A "modified" entry that has changed entries below it is a directory whose listing changed.
    dirs = {str(p).rsplit("/", 1)[0] for p in paths}
    added_dirs = {p for kind, p in changes if kind == "added"}
    filled = {a for kind, p in changes if kind != "deleted" for a in above(p.rsplit("/", 1)[0])}
    found = [
        (a, f"changed {a} (a directory the tests search, with nothing added or changed below it: it may be a link)")
        for a in sorted({a for d in _SEARCHED for a in above(d)} & paths - filled)
    ]
    for kind, path in changes:
        name = path.rsplit("/", 1)[-1]
        if new_trees and path.startswith(new_trees):
            continue
        if _LOADER.search(path):
            found.append((path, f"{kind} {path} (the dynamic loader's configuration)"))
        elif _APPTAINER_ENV.search(path) and path not in dirs:
            found.append((path, f"{kind} {path} (the environment every test command sources)"))
        elif PY_HOOKS.search(path):
            found.append((path, f"{kind} {path} (runs at every Python start)"))
        elif _PY_RUNNER.search(path) and path not in dirs and not path.endswith(".pyc"):
            found.append((path, f"{kind} {path} (the test runner's own package)"))
        elif kind != "deleted" and (
            _PY_PATH.search(path) or (path.endswith("/pyvenv.cfg") and path.rsplit("/", 1)[0] not in added_dirs)
        ):
            found.append((path, f"{kind} {path} (sets Python's module path before any module runs)"))
        elif _RUNNER_CONFIG.search(path):
            found.append((path, f"{kind} {path} (pytest reads it before the tests)"))
        elif _INSTALLER_CONFIG.search(path) and path not in dirs:
            found.append((path, f"{kind} {path} (where the tests' installers take pytest from)"))
        elif path.startswith(work) and _WORK_RUNNER.search(path[len(work) :]) and not path.endswith(".pyc"):
            found.append((path, f"{kind} {path} (the test runner, as `python -m pytest` from the workdir imports it)"))
        elif python_m_pytest and path.startswith(work) and _stdlib_named(path[len(work) :]) and kind != "deleted":
            found.append(
                (path, f"{kind} {path} (named like a standard module `python -m pytest` from the workdir imports)")
            )
        elif _SITE.search(path) or (path + "/").startswith(work):
            continue
        elif kind != "added" and path not in dirs and (_TOOL_DIRS.search(path) or _LIB_DIRS.search(path)):
            if not path.endswith(".pyc"):
                found.append((path, f"{kind} {path} (a program or library of the image)"))
        elif kind == "added" and _TOOL_DIRS.search(path) and _TOOL_NAMES.match(name):
            found.append((path, f"added {path} {TOOL_FLAG}"))
        elif kind == "added" and _PY_STDLIB.search(path):
            found.append((path, f"added {path} (a module in Python's own tree, before every site directory)"))
    return found


@dataclass
class ContainerVerdict:
    reward: float | None  # None: Harbor's trial error (no, empty or unreadable reward file)
    reason: str
    flags: list[str] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)
    log: str = ""

    @classmethod
    def flagged(cls, why: str, log: str) -> ContainerVerdict:
        """No reward, whatever the reward files say: the verifier could not trust the run (`why`)."""
        return cls(0.0, f"flagged: {why}", [why], log=log)


class TaskContainerExecutor:
    """The `ToolExecutor` over one task container: the agent's tools run here as the image's user."""

    def __init__(self, box: TaskContainer, prefix: str = "") -> None:
        self.box = box
        self.prefix = prefix  # shell text before every command (an Endless task's %environment and home)
        self.verdicts: list[ContainerVerdict] = []

    @property
    def workspace(self) -> str:
        return self.box.spec.workdir

    @property
    def python(self) -> str:
        return "python3 -"

    async def exec(self, command: str, **options: Unpack[ExecOptions]) -> ExecResult:
        timeout, max_output_bytes, stdin = options["timeout"], options["max_output_bytes"], options.get("stdin")
        # The container's network is the task's (allow_internet), fixed when it was made.
        if stdin is not None:
            name = await self._stage(stdin.encode())
            command = f"exec < {name}; rm -f {name}\n{command}"
        return await self.box.exec(self.prefix + command, timeout=timeout, max_output_bytes=max_output_bytes)

    @property
    def _uid(self) -> int:
        return INVOKING_UID if self.box.spec.user == INVOKING_USER else 0

    async def _stage(self, data: bytes) -> str:
        """`data` in a private file of /tmp owned by the commands' user (they read and remove it)."""
        name = f"/tmp/.hermes-stdin-{secrets.token_hex(8)}"
        await self.box.put_files("/tmp", {name.rsplit("/", 1)[1]: (data, 0o600)}, owner=self._uid)
        return name

    async def read_file(self, path: str) -> bytes:
        return await self.box.read_file(path)

    async def write_file(self, path: str, data: bytes) -> None:
        if self._uid == 0:
            await self.box.write_file(path, data)
            return
        # As the user: a file where it may write, owned by it (the engine's archive API would write as root).
        p = path if path.startswith("/") else f"{self.workspace}/{path}"
        staged = await self._stage(data)
        q = shlex.quote(p)
        run = await self.box.exec(
            f'mkdir -p -- "$(dirname -- {q})" && cat {staged} > {q}; rc=$?; rm -f {staged}; exit $rc',
            timeout=120,
            login=False,
        )
        if run.exit_code != 0:
            raise FileOpError(f"cannot write {p}: {run.output.strip()[-300:]}")


def task_spec(
    task: TerminalTask,
    image: str,
    *,
    network: bool,
    env: dict[str, str] | None = None,
    endless_user: EndlessUser = "invoking",
) -> TaskContainerSpec:
    """The container a task's trajectory runs in (a Harbor task's limits and network from task.toml; an Endless
    task's as its harness gives it: the invoking user (or root) in /home/user, HOME there, its %environment sourced
    by each command; `endless_user` must match how its image was built, sandboxes.endless_recipe)."""
    if task.format == "endless":
        user = INVOKING_USER if endless_user == "invoking" else "root"
        # The keep-alive as root: a root exec in a container made for another user has no capabilities (chown /).
        return TaskContainerSpec(
            image=image,
            workdir=task.workdir,
            user=user,
            keepalive_user="root",
            env={"HOME": task.workdir},
            network=network,
        )
    return TaskContainerSpec(
        image=image,
        workdir=task.workdir,
        user=None,  # the image's own USER (root unless its Dockerfile names another), as Harbor's exec
        env=env if env is not None else task.environment,
        cpus=task.cpus,
        memory_mb=task.memory_mb,
        storage_mb=task.storage_mb,
        network=network,
    )


@asynccontextmanager
async def task_container(
    engines: TaskContainers, spec: TaskContainerSpec, owner: str, prefix: str = ""
) -> AsyncIterator[TaskContainerExecutor]:
    """A started task container with Harbor's log directories, as the trajectory's executor (`prefix`: shell
    text before each of its commands, `command_prefix(task)`)."""
    # The image's root directory is the engine's (root's, whatever a build chowned): the invoking user owns it too.
    own_root = f" && chown {INVOKING_USER} /" if spec.user == INVOKING_USER else ""
    async with engines.container(spec, owner) as box:
        made = await box.exec(
            f"mkdir -p {AGENT_LOG_DIR} {VERIFIER_DIR} && chmod 777 {AGENT_LOG_DIR} {VERIFIER_DIR}{own_root}",
            timeout=60,
            user="root",
            workdir="/",
        )
        if made.exit_code != 0:
            raise RuntimeError(f"{owner}: cannot make /logs in its container: {made.output[-500:]}")
        yield TaskContainerExecutor(box, prefix)


def command_prefix(task: TerminalTask) -> str:
    """What runs before each command of `task`'s trajectory: an Endless task's %environment and home."""
    return environment_prefix(task.workdir) if task.format == "endless" else ""


def _files(task: TerminalTask) -> dict[str, tuple[bytes, int]]:
    assert task.tests_dir is not None
    return {
        str(p.relative_to(task.tests_dir)): (p.read_bytes(), p.stat().st_mode & 0o777)
        for p in sorted(task.tests_dir.rglob("*"))
        if p.is_file()
    }


async def _reward_file(box: TaskContainer, name: str) -> bytes | None:
    try:
        return await box.read_file(f"{VERIFIER_DIR}/{name}")
    except FileNotFoundError:
        return None


async def verify_in_container(
    executor: TaskContainerExecutor, task: TerminalTask, genuine: GenuineCheck | None = None
) -> ContainerVerdict:
    """Harbor's verifier in the trajectory's own container, after the integrity check."""
    box = executor.box
    # An Endless final test checks the state the agent left, not its processes: they end before the engine's diff,
    # so none can change what the test runs afterwards (an Endless image's files are all the agent's). A Harbor
    # task's tests may query a server the agent left: those processes are only stopped until the guard starts.
    stop = STOP_LEFTOVERS if task.format == "endless" else FREEZE_LEFTOVERS
    stopped = await box.exec(stop, timeout=120, user="root", workdir="/", login=False)
    if stopped.exit_code != 0:
        why = f"the processes the agent left running could not all be stopped (exit {stopped.exit_code})"
        verdict = ContainerVerdict.flagged(why, stopped.output)
        executor.verdicts.append(verdict)
        return verdict
    changes = await box.changes()
    # What the verifier copies to /tests (Harbor), read once: test.sh finds programs on its PATH and where these
    # files say. An Endless task's check stays strict.
    files: dict[str, tuple[bytes, int]] = {}
    if task.format != "endless":
        files = _files(task)
        if task.test_script is not None:  # --env.bootstrap_tests_with_sandbox_pytest: the image's own pytest
            files["test.sh"] = (task.test_script.encode(), 0o755)
    tests_text = None if task.format == "endless" else "\n".join(d.decode(errors="replace") for d, _ in files.values())
    env = {**box.spec.env, **task.verifier_env}
    test_sh = files.get("test.sh", (b"", 0))[0].decode(errors="replace")
    flagged = integrity_flags(changes, box.spec.workdir, bool(PYTHON_M_PYTEST.search(test_sh)))
    flags = await review_flags(
        box, changes, flagged, box.spec.workdir, genuine, env=env, tests_text=tests_text, test_sh=test_sh
    )
    if flags:
        verdict = ContainerVerdict(0.0, "flagged: the agent changed what the tests run: " + "; ".join(flags[:5]), flags)
        executor.verdicts.append(verdict)
        return verdict
    if task.format == "endless":
        assert task.final_test is not None
        verdict = await endless_pytest(executor, task, task.final_test)
        executor.verdicts.append(verdict)
        return verdict
    reset = f"rm -rf {VERIFIER_DIR} /tests && mkdir -p {VERIFIER_DIR} && chmod 777 {VERIFIER_DIR}"
    await box.exec(reset, timeout=120, user="root", workdir="/", login=False)
    await box.put_files("/tests", files)
    # Harbor's login shell runs the profiles first: where the agent changed one, it could act before test.sh
    # (write the reward, exit), so test.sh then runs without them. An honest edit still scores.
    startup = sorted({p for _, p in changes if _LOGIN_STARTUP.search(p)})
    run = await box.exec(
        f"bash -c {shlex.quote(GUARD)} /tests/test.sh > {VERIFIER_DIR}/test-stdout.txt 2>&1",
        timeout=task.verifier_timeout_s,
        user="root",
        env=task.verifier_env,
        login=not startup,
    )
    without = f"; no login shell: the agent changed {', '.join(startup[:3])}" if startup else ""
    try:
        out = (await box.read_file(f"{VERIFIER_DIR}/test-stdout.txt")).decode(errors="replace")
    except FileNotFoundError:
        out = run.output
    changed = await changed_tests(box, files)
    if run.timed_out:  # scored 0, as a hang the agent caused must not escape its score
        verdict = ContainerVerdict(0.0, f"tests/test.sh ran over timeout_sec = {task.verifier_timeout_s:g}", log=out)
    elif changed:  # the tests' files are not what was copied in
        verdict = ContainerVerdict.flagged(f"the tests' files changed while they ran ({', '.join(changed[:3])})", out)
    elif run.exit_code == GUARD_FAILED:  # the guard could not stop what the agent left running
        verdict = ContainerVerdict.flagged("processes left running could not all be stopped", out)
    elif run.exit_code is not None and run.exit_code > 128:  # the guard never finished: its shell was killed
        verdict = ContainerVerdict.flagged(f"test.sh's shell was killed by signal {run.exit_code - 128}", out)
    else:
        try:  # Harbor's rules, one implementation for both paths (reward.py)
            read = read_rewards(await _reward_file(box, "reward.json"), await _reward_file(box, "reward.txt"))
        except RewardError as exc:  # Harbor's trial error: no score, the rollout is lost to the verifier
            verdict = ContainerVerdict(None, f"{exc} (test.sh exit {run.exit_code})", log=out)
        else:
            reason = f"{read.source} (test.sh exit {run.exit_code}{without})"
            verdict = ContainerVerdict(read.reward, reason, rewards=read.metrics, log=out)
    executor.verdicts.append(verdict)
    return verdict


def _stdlib_named(rel: str) -> bool:
    """A workdir entry (relative path) that is, or is inside, a top-level module named like a standard one."""
    top = _TOP_MODULE.match(rel)
    # `test` (the standard library's own test suite, which no runner imports) is also a repository's tests directory.
    return top is not None and top.group(1) in sys.stdlib_module_names - {"test"}


async def endless_pytest(
    executor: TaskContainerExecutor, task: TerminalTask, test_file: Path, *, user: str | None = None
) -> ContainerVerdict:
    """An Endless task's test file (test_final_state.py after the agent; test_initial_state.py before it) copied
    to /tests and run with the image's pytest, as Endless' harness does, as `user` (default: the agent's, as the
    harness runs the final test in the agent's shell); /tests removed afterwards.

    The agent owned every file here (root, or the invoking user), so nothing it can leave outside the engine's diff
    steers the run: no login shell (profiles), a clean environment as Apptainer's --cleanenv (then %environment,
    checked by the diff), `python3 -I` (no cwd, PYTHON* or user site on sys.path), our own pytest.ini in /tests (no
    ini file or conftest.py above it), no auto-loaded plugins."""
    box = executor.box
    await box.exec("rm -rf /tests", timeout=120, user="root", workdir="/", login=False)
    test = test_file.name
    await box.put_files("/tests", {test: (test_file.read_bytes(), 0o644), "pytest.ini": (b"[pytest]\n", 0o644)})
    clean = "/usr/bin/env -i PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 /bin/bash --noprofile --norc -c "
    run = await box.exec(
        clean + shlex.quote(executor.prefix + endless_pytest_command(test)),
        timeout=task.verifier_timeout_s,
        user=user or box.spec.user or "root",
        max_output_bytes=200_000,
        login=False,
    )
    await box.exec("rm -rf /tests", timeout=120, user="root", workdir="/", login=False)
    if run.timed_out:
        return ContainerVerdict(0.0, f"{test} ran over {task.verifier_timeout_s:g} s", log=run.output)
    return ContainerVerdict(1.0 if run.exit_code == 0 else 0.0, f"{test}: pytest exit {run.exit_code}", log=run.output)


async def initial_state_from_build(executor: TaskContainerExecutor) -> ContainerVerdict | None:
    """test_initial_state.py's verdict from the build (an `invoking` image checks it as root before the chown),
    removed from the container before the agent; None where the image holds none (a `root` image)."""
    box = executor.box
    try:
        data = (await box.read_file(INITIAL_STATE_FILE)).decode(errors="replace")
    except FileNotFoundError:
        return None
    await box.exec(f"rm -f {INITIAL_STATE_FILE}", timeout=60, user="root", workdir="/", login=False)
    code, _, out = data.partition("\n")
    ok = code.strip() == "0"
    return ContainerVerdict(1.0 if ok else 0.0, f"test_initial_state.py at build: pytest exit {code.strip()}", log=out)


_URL_HOST = re.compile(r"https?://([A-Za-z0-9.-]+\.[A-Za-z]{2,})")


def unresolved_hosts(task_dir: Path) -> list[str]:
    """Hosts named in URLs of a task's files (Dockerfile, scripts, tests) that this machine cannot resolve.

    Found before the run, so a step that downloads from one is known to fail for the machine's sake.
    Blocking (DNS): call it in a thread.
    """
    hosts: set[str] = set()
    for p in task_dir.rglob("*"):
        if (
            p.is_file()
            and p.stat().st_size < 1_000_000
            and (p.suffix in ("", ".sh", ".py", ".toml") or p.name == "Dockerfile")
        ):
            hosts.update(_URL_HOST.findall(p.read_text(errors="replace")))
    missing = []
    for host in sorted(hosts):
        try:
            socket.getaddrinfo(host, 443)
        except OSError:
            missing.append(host)
    return missing
