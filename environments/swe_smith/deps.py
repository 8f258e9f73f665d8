"""A repository's Python dependencies on one machine, without the instance's image.

SWE-smith gives every repository a Docker image built by running its profile's install commands in a
checkout of the mirror. Where no image runs (the local backend), `prepare_repo_env` builds the same
thing once per repository in this machine's cache:

    {dir}/{owner}__{name}.{sha8}-{key}/
        checkout/        the mirror's main branch (the original project), where the install ran
        venv/            `python -m venv` (no system site-packages) holding what the install put there
        install.log
        hermes-env.json  written last: the environment is complete

The install command runs on the host with the venv first on PATH, before any rollout; this is the only
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

__all__ = ["DEFAULT_INSTALL", "PreparedRepoEnv", "RepoEnvConfig", "RepoEnvError", "prepare_repo_env"]

DEFAULT_INSTALL = "python -m pip install -e ."  # SWE-smith's PythonProfile default


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
        "pytest", description="Installed too when the test command runs pytest and the install did not bring it"
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
    *,
    repo: str,
    mirror: Path,
    install_command: str,
    pytest_requirement: str | None,
    base_dir: Path,
    timeout_s: float,
) -> PreparedRepoEnv:
    """The prepared environment of `repo` (swesmith/<owner>__<name>.<sha8>), built from `mirror` if absent.

    Blocking (runs pip); call it from a worker thread. Safe across processes: a lock file per
    environment, and a half-built one (no hermes-env.json) is removed and built again.
    """
    key = hashlib.sha1(json.dumps([repo, install_command, pytest_requirement, sys.version]).encode()).hexdigest()
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", repo.split("/")[-1])
    base_dir.mkdir(parents=True, exist_ok=True)
    root = base_dir.resolve() / f"{name}-{key[:12]}"
    manifest = root / "hermes-env.json"
    with open(base_dir / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not manifest.exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            _build(root, mirror, install_command, pytest_requirement, timeout_s)
        saved = json.loads(manifest.read_text())
    return PreparedRepoEnv(root, Path(saved["python"]), saved["source_root"])


def _build(root: Path, mirror: Path, install_command: str, pytest_requirement: str | None, timeout_s: float) -> None:
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
    if pytest_requirement:
        has_pytest = subprocess.run([str(python), "-c", "import pytest"], capture_output=True, env=env, check=False)
        if has_pytest.returncode != 0:
            run([str(python), "-m", "pip", "install", pytest_requirement], f"installing {pytest_requirement}", env=env)
    src = checkout / "src"
    src_layout = src.is_dir() and any((p / "__init__.py").exists() or p.suffix == ".py" for p in src.iterdir())
    manifest = {"python": str(python), "source_root": "src" if src_layout else ".", "install_command": install_command}
    (root / "hermes-env.json").write_text(json.dumps(manifest) + "\n")
