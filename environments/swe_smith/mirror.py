"""SWE-smith's published mirror layout on this machine: building one from plain project directories and
bug patches (the offline set), and the pinned-identity git calls every mirror and snapshot step runs."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from environments.hermes_base_env import HermesEnvError

__all__ = ["BUG_COMMIT", "REMOVE_TESTS_COMMIT", "build_mirror", "git_async", "git_ok"]

# The commit subjects of a published task branch: Initial commit -> BUG_COMMIT -> REMOVE_TESTS_COMMIT (head).
BUG_COMMIT = "Bug Patch"
REMOVE_TESTS_COMMIT = "Remove F2P Tests"
FIXED_GIT_ENV = {
    "GIT_AUTHOR_NAME": "hermes-rl",
    "GIT_AUTHOR_EMAIL": "hermes-rl@localhost",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "hermes-rl",
    "GIT_COMMITTER_EMAIL": "hermes-rl@localhost",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
}


def _git(args: list[str], cwd: Path | None = None, stdin: str | None = None) -> str:
    import subprocess

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **FIXED_GIT_ENV}
    proc = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise HermesEnvError(f"git {' '.join(args[:2])} failed in {cwd}: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def build_mirror(
    repos: Mapping[str, Path], bugs: list[dict[str, Any]], out_dir: Path, owner: str = "hermes-rl"
) -> list[dict[str, Any]]:
    """A mirror in SWE-smith's published shape from plain project directories and bug patches.

    `repos`: project name -> directory; `bugs`: rows with `name` (a key of repos), `bug_id`, `patch` and
    the published fields. Writes `out_dir/swesmith/<owner>__<name>.<sha8>.git` (main = the original; one
    branch per instance: "Bug Patch", then "Remove F2P Tests" deleting the FAIL_TO_PASS test files) and
    returns the rows with `instance_id`, `repo` and `base_commit` (the branch head) filled in. Commits use
    a fixed identity and date, so the result is reproducible.
    """
    work = out_dir / ".work"
    rows = []
    mirrors: dict[str, tuple[Path, str]] = {}
    for name, src in repos.items():
        tree = work / name
        _git(["init", "-q", "-b", "main", str(tree)])
        for path in sorted(src.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                target = tree / path.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(path.read_bytes())
        _git(["add", "-A"], tree)
        _git(["commit", "-q", "-m", "Initial commit"], tree)
        sha8 = _git(["rev-parse", "HEAD"], tree)[:8]
        mirror = out_dir / "swesmith" / f"{owner}__{name}.{sha8}.git"
        mirrors[name] = (tree, f"swesmith/{owner}__{name}.{sha8}")
        if not mirror.exists():
            _git(["init", "-q", "--bare", str(mirror)])
    for bug in bugs:
        tree, repo = mirrors[bug["name"]]
        instance_id = f"{repo.split('/')[1]}.{bug['bug_id']}"
        _git(["checkout", "-q", "-b", instance_id, "main"], tree)
        _git(["apply", "-"], tree, stdin=bug["patch"])
        _git(["commit", "-q", "-am", BUG_COMMIT], tree)
        # As SWE-smith publishes: a second commit deletes the FAIL_TO_PASS test files; the head is the start.
        hidden = sorted({t.split("::")[0] for t in bug["FAIL_TO_PASS"]} & set(_git(["ls-files"], tree).splitlines()))
        if hidden:
            _git(["rm", "-q", "--", *hidden], tree)
            _git(["commit", "-q", "-m", REMOVE_TESTS_COMMIT], tree)
        row = {k: v for k, v in bug.items() if k not in ("name", "bug_id")}
        rows.append(row | {"instance_id": instance_id, "repo": repo, "base_commit": _git(["rev-parse", "HEAD"], tree)})
        _git(["checkout", "-q", "main"], tree)
    for tree, repo in mirrors.values():
        _git(["push", "-q", "--mirror", str(out_dir / f"{repo}.git")], tree)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return rows


async def git_async(args: list[str], timeout: float) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **FIXED_GIT_ENV}
    proc = await asyncio.create_subprocess_exec(
        "git",
        "-c",
        "core.hooksPath=/dev/null",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"git {' '.join(args[:3])} took over {timeout:.0f}s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} failed: {err.decode(errors='replace').strip()[-800:]}")
    return out.decode().strip()


async def git_ok(args: list[str]) -> bool:
    try:
        await git_async(args, 60)
    except RuntimeError:
        return False
    return True
