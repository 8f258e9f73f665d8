"""A SWE-smith mirror in the published shape, built with plain git (not the env's own builder).

Per repository a bare repo `swesmith/<owner>__<name>.<sha8>.git` whose `main` is the original project
("Initial commit"); per instance a branch named after `instance_id`: "Bug Patch" (the bug), then "Remove
F2P Tests" (the FAIL_TO_PASS test files deleted), and `base_commit` = that head, as SWE-smith's
harness/gather.py publishes them (the real mirror swesmith/marshmallow-code__apispec.8b421526 has this
history on every one of its 301 task branches).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.docker_fixtures import docker_engine, docker_test_id  # noqa: F401  (test_docker_*.py)

ROOT = Path(__file__).resolve().parents[2]
GIT_ENV = {
    "PATH": os.environ["PATH"],
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "swesmith",
    "GIT_AUTHOR_EMAIL": "swesmith@swesmith.ai",
    "GIT_COMMITTER_NAME": "swesmith",
    "GIT_COMMITTER_EMAIL": "swesmith@swesmith.ai",
}

RINGBUF = {
    "ringbuf/__init__.py": (
        "class RingBuffer:\n"
        "    def __init__(self, size):\n        self.size = size\n        self.items = []\n\n"
        "    def push(self, item):\n        self.items.append(item)\n"
        "        if len(self.items) > self.size:\n            self.items.pop(0)\n\n"
        "    def __len__(self):\n        return len(self.items)\n\n"
        "    def newest(self):\n        return self.items[-1]\n"
    ),
    "tests/__init__.py": "",
    "tests/test_ringbuf.py": (
        "import unittest\n\nfrom ringbuf import RingBuffer\n\n\n"
        "class RingBufferTest(unittest.TestCase):\n"
        "    def test_evicts_oldest(self):\n        b = RingBuffer(2)\n        for i in range(3):\n            b.push(i)\n"
        "        self.assertEqual(b.items, [1, 2])\n\n"
        "    def test_len(self):\n        b = RingBuffer(2)\n        b.push(1)\n        self.assertEqual(len(b), 1)\n\n"
        "    def test_newest(self):\n        b = RingBuffer(3)\n        b.push(1)\n        b.push(2)\n        self.assertEqual(b.newest(), 2)\n"
    ),
}
RINGBUF_BUG = ("            self.items.pop(0)\n", "            self.items.pop()\n")


def git(*args: str, cwd: Path | None = None, stdin: str | None = None) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, input=stdin, capture_output=True, text=True, env=GIT_ENV, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def publish(
    work: Path, owner: str, mirrors: Path, bugs: dict[str, tuple[str, str, str, str]]
) -> tuple[str, dict[str, tuple[str, str]]]:
    """Commit `work` as main and one branch per bug (id -> (path, old, new, F2P test file)), push to `mirrors`.

    -> (repo, {instance_id: (base_commit, patch)})."""
    git("init", "-q", "-b", "main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "Initial commit", cwd=work)
    repo_name = f"{owner}__{work.name}.{git('rev-parse', 'HEAD', cwd=work)[:8]}"
    out = {}
    for bug_id, (path, old, new, f2p_file) in bugs.items():
        instance_id = f"{repo_name}.{bug_id}"
        git("checkout", "-q", "-b", instance_id, "main", cwd=work)
        target = work / path
        target.write_text(target.read_text().replace(old, new, 1))
        patch = git("diff", cwd=work) + "\n"
        git("commit", "-q", "-am", "Bug Patch", cwd=work)
        git("rm", "-q", f2p_file, cwd=work)
        git("commit", "-q", "-m", "Remove F2P Tests", cwd=work)
        out[instance_id] = (git("rev-parse", "HEAD", cwd=work), patch)
        git("checkout", "-q", "main", cwd=work)
    bare = mirrors / "swesmith" / f"{repo_name}.git"
    git("init", "-q", "--bare", str(bare))
    git("push", "-q", "--mirror", str(bare), cwd=work)
    return f"swesmith/{repo_name}", out


@pytest.fixture
def published(tmp_path) -> dict:
    """mirror dir, instances.jsonl, profiles.json; rows: 2 pytest bugs (one names an image), 1 unittest bug
    with an image and a non-pytest command, 1 row with an empty problem statement, 1 without a mirror."""
    mirrors = tmp_path / "mirrors"
    calc = tmp_path / "work" / "tinycalc"
    calc.parent.mkdir(parents=True)
    subprocess.run(["cp", "-r", str(ROOT / "environments/data/swe_smith/repos/tinycalc"), str(calc)], check=True)
    div = ("tinycalc/__init__.py", "return a / b", "return a // b", "tests/test_calc.py")
    mean = (
        "tinycalc/__init__.py",
        "return sum(values) / len(values)",
        "return sum(values) / max(1, len(values) - 1)",
        "tests/test_calc.py",
    )
    calc_repo, calc_bugs = publish(
        calc,
        "hermes",
        mirrors,
        {"func_pm_op_change__div1": div, "func_pm_op_change__mean1": mean, "func_pm_empty__x": div},
    )
    ring = tmp_path / "work" / "ringbuf"
    for rel, text in RINGBUF.items():
        (ring / rel).parent.mkdir(parents=True, exist_ok=True)
        (ring / rel).write_text(text)
    ring_repo, ring_bugs = publish(
        ring,
        "hermes",
        mirrors,
        {"func_pm_remove_arg__pop": ("ringbuf/__init__.py", *RINGBUF_BUG, "tests/test_ringbuf.py")},
    )
    ring_patch = next(iter(ring_bugs.values()))[1]
    ids = list(calc_bugs)
    rows = [
        {
            "instance_id": ids[0],
            "repo": calc_repo,
            "patch": calc_bugs[ids[0]][1],
            "base_commit": calc_bugs[ids[0]][0],
            "FAIL_TO_PASS": ["tests/test_calc.py::test_div"],
            "PASS_TO_PASS": ["tests/test_calc.py::test_add", "tests/test_calc.py::test_div_by_zero"],
            "problem_statement": "div(7, 2) returns 3 instead of 3.5.",
            "image_name": None,
            "created_at": "2025-01-01T00:00:00",
        },
        {
            "instance_id": ids[1],
            "repo": calc_repo,
            "patch": calc_bugs[ids[1]][1],
            "base_commit": calc_bugs[ids[1]][0],
            # the hub stores the test lists as JSON text
            "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_mean"]),
            "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_mean_empty"]),
            "problem_statement": "mean([1, 2, 3, 4]) is wrong.",
            "image_name": "swebench/swesmith.x86_64.hermes_1776_tinycalc.00000000",
        },
        {
            "instance_id": ids[2],
            "repo": calc_repo,
            "patch": calc_bugs[ids[2]][1],
            "base_commit": calc_bugs[ids[2]][0],
            "FAIL_TO_PASS": ["tests/test_calc.py::test_div"],
            "PASS_TO_PASS": [],
            "problem_statement": "  ",
            "image_name": None,
        },
        {
            "instance_id": next(iter(ring_bugs)),
            "repo": ring_repo,
            "patch": ring_patch,
            "base_commit": next(iter(ring_bugs.values()))[0],
            "FAIL_TO_PASS": ["tests.test_ringbuf.RingBufferTest.test_evicts_oldest"],
            "PASS_TO_PASS": [
                "tests.test_ringbuf.RingBufferTest.test_len",
                "tests.test_ringbuf.RingBufferTest.test_newest",
            ],
            "problem_statement": "RingBuffer drops the newest item instead of the oldest.",
            "image_name": "swebench/swesmith.x86_64.hermes_1776_ringbuf.00000000",
        },
        {
            "instance_id": "hermes__gone.12345678.bug",
            "repo": "swesmith/hermes__gone.12345678",
            "patch": ring_patch,
            "FAIL_TO_PASS": ["tests/test_x.py::test_x"],
            "PASS_TO_PASS": [],
            "problem_statement": "No mirror for this one.",
            "base_commit": "0" * 40,
        },
    ]
    dataset = tmp_path / "instances.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps({ring_repo: {"test_cmd": "python -m unittest -v", "language": "python"}}))
    return {
        "mirrors": mirrors,
        "dataset": dataset,
        "profiles": profiles,
        "rows": rows,
        "calc_repo": calc_repo,
        "ring_repo": ring_repo,
    }
