"""A repository's Python dependencies on one machine, without the instance's image.

SWE-smith gives every repository a Docker image built by running its profile's install commands in a
checkout of the mirror. Where no image runs (the local backend), `prepare_repo_env` builds the same
thing once per repository in this machine's cache:

    {dir}/{owner}__{name}.{sha8}-{key}/
        checkout/        the mirror's main branch (the original project), where the install ran
        venv/            `python -m venv` (no system site-packages) holding what the install put there
        install.log
        hermes-env.json  written last: the environment is complete

The install is the profile's install command, then one pip resolve of the repository's own test and
development pins (`repo_pins` in pins.py: dev/test requirement files, pyproject's test/dev extras and
dependency groups, setup.cfg's extras, tox's unconditional deps) with the pytest requirement (SWE-smith's
images predate pytest 9). It runs on the host with the venv first on PATH, before any rollout; this is the only
step with network. Slots see the directory read-only (the env adds it to the local backend's
`extra_ro_paths`), the agent and the verifier use the same interpreter, and nothing is installed
while a rollout runs.

The code under test is the per-run checkout, never the copy the install left: the interpreter is
started with PYTHONPATH at the checkout's source root (`src/` for a src layout, else the checkout
itself). PYTHONPATH comes before site-packages and before the paths an editable install adds, so the
installed project is shadowed while its metadata (`importlib.metadata.version`) still answers.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from environments.swe_smith.pins import repo_pins

__all__ = ["DEFAULT_INSTALL", "PreparedRepoEnv", "RepoEnvConfig", "RepoEnvError", "prepare_repo_env"]

DEFAULT_INSTALL = "python -m pip install -e ."  # SWE-smith's PythonProfile default
_PLAN = 2  # how an environment is built; a change rebuilds the environments built before it


class RepoEnvConfig(BaseModel):
    """Where a repository's dependencies come from when its image does not run."""

    mode: Literal["off", "venv"] = Field(
        "off",
        description="off: the sandbox's own interpreter; venv: a per-repository venv prepared once on this machine "
        "from the profile's install command (local backends)",
    )
    install_command: str | None = Field(
        None,
        description="Shell command run in a checkout of the repository's main branch with the venv on PATH "
        f"(default: the profile's install_cmds, else {DEFAULT_INSTALL!r})",
    )
    pytest_requirement: str = Field(
        "pytest<9",
        description="Resolved with the repository's pins when the test command runs pytest (SWE-smith's images, "
        "built in 2025, have pytest 8: pytest 9 shortens long parametrised ids, so published ids would not match)",
    )
    repo_pins: bool = Field(
        True,
        description="Also install the repository's own test/development pins (dev/test requirement files, "
        "pyproject's test/dev extras and dependency groups, setup.cfg's extras, tox's unconditional deps)",
    )
    dir: str | None = Field(None, description="Where prepared environments live (default: {cache_dir}/envs)")
    timeout_s: float = Field(1800.0, gt=0, description="Preparing one repository's environment")


class RepoEnvError(RuntimeError):
    """Preparing a repository's environment failed; the message says which step and where the log is."""


@dataclass(frozen=True)
class PreparedRepoEnv:
    root: Path
    python: Path  # the venv's interpreter
    source_root: str  # relative to a checkout: "src" or "."

    def interpreter(self) -> str:
        """Shell words starting the venv's Python with the current directory's checkout importable first."""
        here = '"$PWD"' if self.source_root == "." else f'"$PWD"/{shlex.quote(self.source_root)}'
        return f"PYTHONPATH={here} {shlex.quote(str(self.python))}"


def prepare_repo_env(
    *, repo: str, mirror: Path, install_command: str, with_pytest: bool, base_dir: Path, config: RepoEnvConfig
) -> PreparedRepoEnv:
    """The prepared environment of `repo` (swesmith/<owner>__<name>.<sha8>), built from `mirror` if absent.

    `with_pytest`: the test command runs pytest (config.pytest_requirement is resolved with the pins).
    Blocking (runs pip); call it from a worker thread. Safe across processes: a lock file per
    environment, and a half-built one (no hermes-env.json) is removed and built again.
    """
    pytest_requirement = config.pytest_requirement if with_pytest else None
    plan = [repo, install_command, pytest_requirement, config.repo_pins, sys.version, _PLAN]
    key = hashlib.sha1(json.dumps(plan).encode()).hexdigest()
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", repo.split("/")[-1])
    base_dir.mkdir(parents=True, exist_ok=True)
    root = base_dir.resolve() / f"{name}-{key[:12]}"
    manifest = root / "hermes-env.json"
    with open(base_dir / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not manifest.exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            _build(root, mirror, install_command, pytest_requirement, config.repo_pins, config.timeout_s)
        saved = json.loads(manifest.read_text())
    return PreparedRepoEnv(root, Path(saved["python"]), saved["source_root"])


def _build(
    root: Path, mirror: Path, install_command: str, pytest_requirement: str | None, with_pins: bool, timeout_s: float
) -> None:
    log = root / "install.log"
    checkout, venv = root / "checkout", root / "venv"

    def run(argv: list[str], what: str, **kwargs) -> None:
        with log.open("a") as out:
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            try:
                proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, **kwargs)
            except subprocess.TimeoutExpired:
                raise RepoEnvError(f"{what} took over {timeout_s:.0f}s; see {log}") from None
        if proc.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
            raise RepoEnvError(f"{what} failed (exit {proc.returncode}): {tail[0][:300]}; see {log}")

    git_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(root)}
    run(["git", "clone", "-q", "--no-checkout", str(mirror), str(checkout)], f"cloning {mirror}", env=git_env)
    # main: the original project on a SWE-smith mirror (whatever the bare repository's HEAD names)
    pick = "git checkout -q main 2>/dev/null || git checkout -q origin/HEAD"
    run(["bash", "-c", pick], f"checking out main of {mirror}", cwd=checkout, env=git_env)
    run([sys.executable, "-m", "venv", str(venv)], "creating the venv")
    bin_dir = venv / "bin"
    env = {
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "VIRTUAL_ENV": str(venv),
        "HOME": str(root),  # pip's cache and config stay with the environment
        "LANG": "C.UTF-8",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONNOUSERSITE": "1",
    }
    run(["bash", "-c", install_command], f"the install command {install_command!r}", cwd=checkout, env=env)
    python = bin_dir / "python"
    # One resolve of the repository's own pins with the pytest requirement (pip intersects their specifiers).
    pins = repo_pins(checkout) if with_pins else []
    wanted = [*pins, *([pytest_requirement] if pytest_requirement else [])]
    if wanted:
        what = "the repository's pins and " * bool(pins) + (pytest_requirement or "")
        run(
            [str(python), "-m", "pip", "install", *wanted],
            f"installing {what.removesuffix(' and ')}",
            cwd=checkout,
            env=env,
        )
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, env=env, check=False)
    src = checkout / "src"
    src_layout = src.is_dir() and any((p / "__init__.py").exists() or p.suffix == ".py" for p in src.iterdir())
    manifest = {
        "python": str(python),
        "source_root": "src" if src_layout else ".",
        "install_command": install_command,
        "pins": wanted,
        "installed": freeze.stdout.split(),
    }
    (root / "hermes-env.json").write_text(json.dumps(manifest) + "\n")
