"""scripts/tb2_table.py's export of the published tasks from a mirror that lacks a blob.

The mirror of yujianll/skill-usage here lacks some blobs (train-fasttext's tests/private_test.tar.gz): `git archive`
of that task fails and writes nothing, and the task vanished from the table without a row.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from scripts.tb2_table import export_tasks


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def _mirror_missing_a_blob(tmp_path: Path) -> Path:
    repo = tmp_path / "mirror"
    for task in ("fine-task", "train-fasttext"):
        (repo / "terminal-bench-2" / task / "tests").mkdir(parents=True)
        (repo / "terminal-bench-2" / task / "task.toml").write_text('version = "1.0"\n')
        (repo / "terminal-bench-2" / task / "tests" / "test.sh").write_text("#!/bin/bash\n")
    (repo / "terminal-bench-2" / "train-fasttext" / "tests" / "private_test.tar.gz").write_bytes(b"only in upstream")
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tasks")
    blob = _git(repo, "rev-parse", "HEAD:terminal-bench-2/train-fasttext/tests/private_test.tar.gz")
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    return repo


def test_a_task_whose_blob_the_mirror_lacks_is_named_not_dropped(tmp_path: Path) -> None:
    dest = tmp_path / "export"
    dest.mkdir()
    root, broken = export_tasks(dest, mirror=_mirror_missing_a_blob(tmp_path))
    assert (root / "fine-task" / "task.toml").is_file()
    assert list(broken) == ["train-fasttext"]
    assert broken["train-fasttext"] == "tests/private_test.tar.gz not in the mirror"
