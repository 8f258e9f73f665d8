"""Build SWE-smith instance rows from a real mirror by running its tests, as SWE-smith's validation does.

    .venv/bin/python -m scripts.swe_smith_rows /work/.mirror/swesmith+jawah__charset_normalizer.1fdd6463/repo \\
        swesmith/jawah__charset_normalizer.1fdd6463 tests/swe_smith/data/real --count 5 --env-dir /tmp/envs

For the first `--count` task branches (sorted names): the environment `--env.deps.mode venv` prepares for the
repository (deps.py, from the profile in environments/data/swe_smith/profiles.json), then the repository's whole
test suite with the profile's pytest flags at the "Bug Patch" commit (the branch head's parent) and at main (the
original project). FAIL_TO_PASS: passed at main, failed, errored or absent at the bug; PASS_TO_PASS: passed at
both. Writes `<out>/<name>.jsonl` (rows in the hub's shape: instance_id, repo, patch = the bug's diff from main,
FAIL_TO_PASS, PASS_TO_PASS, created_at, image_name, base_commit = the branch head, problem_statement) and
`<out>/<name>.bundle` (main and those branches: all a test needs of the mirror). The problem statements are
written here from the failing tests (SWE-smith's are model-written from the bug; not downloaded).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from environments.swe_smith.deps import RepoEnvConfig, prepare_repo_env
from environments.swe_smith.instances import profile_for
from environments.verifier import parse_test_statuses

FLAGS = ["--disable-warnings", "--color=no", "--tb=no", "--verbose", "-p", "no:cacheprovider"]


def git(mirror: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={mirror}", *args], capture_output=True, text=True, check=True).stdout


def run_suite(mirror: Path, commit: str, python: str, source_root: str) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "repo"
        tree.mkdir()
        archive = subprocess.run(["git", f"--git-dir={mirror}", "archive", commit], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        env = {
            "PATH": os.environ["PATH"],
            "HOME": tmp,
            "LANG": "C.UTF-8",
            "PYTHONNOUSERSITE": "1",
            "PYTHONPATH": str(tree / source_root),
        }
        proc = subprocess.run(
            [python, "-m", "pytest", *FLAGS], cwd=tree, env=env, capture_output=True, text=True, check=False
        )
    statuses = parse_test_statuses(proc.stdout)
    if not statuses:
        raise SystemExit(f"no test statuses at {commit} (exit {proc.returncode}): {proc.stdout[-2000:]}{proc.stderr}")
    return statuses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mirror", type=Path, help="the mirror's bare git directory")
    ap.add_argument("repo", help="swesmith/<owner>__<name>.<sha8>")
    ap.add_argument("out", type=Path)
    ap.add_argument("--count", type=int, default=5)
    ap.add_argument("--env-dir", type=Path, default=Path(tempfile.gettempdir()) / "hermes-swe-envs")
    args = ap.parse_args()
    name = args.repo.split("/")[1]
    profile = profile_for(args.repo, {})
    env = prepare_repo_env(
        repo=args.repo,
        mirror=args.mirror,
        install_command="\n".join(profile["install_cmds"]),
        with_pytest=True,
        base_dir=args.env_dir,
        config=RepoEnvConfig(mode="venv"),
    )
    print(f"environment: {env.root}", file=sys.stderr)
    branches = sorted(b for b in git(args.mirror, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split())
    branches = [b for b in branches if b.startswith(f"{name}.")][: args.count]
    main_commit = git(args.mirror, "rev-parse", "main").strip()
    at_main = run_suite(args.mirror, main_commit, str(env.python), env.source_root)
    rows = []
    for branch in branches:
        head = git(args.mirror, "rev-parse", branch).strip()
        bug = git(args.mirror, "rev-parse", f"{branch}~1").strip()
        subjects = git(args.mirror, "log", "--format=%s", branch).splitlines()
        assert subjects[:2] == ["Remove F2P Tests", "Bug Patch"], (branch, subjects[:3])
        at_bug = run_suite(args.mirror, bug, str(env.python), env.source_root)
        passed = sorted(t for t, s in at_main.items() if s == "PASSED")
        f2p = [t for t in passed if at_bug.get(t, "MISSING") in ("FAILED", "ERROR", "MISSING")]
        p2p = [t for t in passed if at_bug.get(t) == "PASSED"]
        files = sorted({t.split("::")[0] for t in f2p})
        rows.append(
            {
                "instance_id": branch,
                "repo": args.repo,
                "patch": git(args.mirror, "diff", main_commit, bug),
                "FAIL_TO_PASS": f2p,
                "PASS_TO_PASS": p2p,
                "created_at": git(args.mirror, "log", "-1", "--format=%cI", bug).strip(),
                "image_name": profile["image_name"],
                "base_commit": head,
                "problem_statement": (
                    f"After a recent change, {len(f2p)} test(s) in {', '.join(files)} fail, e.g. {f2p[0]}. "
                    "Find the bug in the library and fix it; the tests themselves are correct."
                ),
            }
        )
        print(f"{branch}: {len(f2p)} FAIL_TO_PASS, {len(p2p)} PASS_TO_PASS", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    subprocess.run(
        [
            "git",
            f"--git-dir={args.mirror}",
            "bundle",
            "create",
            str((args.out / f"{name}.bundle").resolve()),
            "main",
            *branches,
        ],
        check=True,
        capture_output=True,
    )


if __name__ == "__main__":
    main()
