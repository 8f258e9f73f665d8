"""A dataset that cannot be read stops the command in one line, exit 2, before any model server
starts and before any file is written; so does a bad toolset."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from environments.gsm8k.env import GSM8kAgentEnv
from environments.mhqa.env import MHQAEnv
from environments.video_qa.env import VideoQAEnv
from tests.support.cli import run_cli

ENVS = {"gsm8k": (GSM8kAgentEnv, ".jsonl"), "mhqa": (MHQAEnv, ".jsonl"), "video_qa": (VideoQAEnv, ".jsonl")}


def error_lines(stderr: str) -> list[str]:
    # transformers announces at import that torch is absent; everything else must be our one line.
    return [line for line in stderr.splitlines() if line.strip() and "PyTorch was not found" not in line]


def bad_dataset(tmp_path: Path, kind: str, suffix: str) -> tuple[Path, str]:
    path = tmp_path / f"rows{suffix}"
    if kind == "missing":
        return path, "no such file|no such rows file|nor an existing JSONL file"
    if kind == "empty":
        path.write_text("\n")
        return path, "no rows|has no problems"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n')
    return path, f"{path}:2 is not JSON"


@pytest.mark.parametrize("kind", ["missing", "empty", "unparsable"])
@pytest.mark.parametrize("env", sorted(ENVS))
def test_an_unreadable_dataset_stops_the_command_before_anything_starts(env, kind, tmp_path):
    env_cls, suffix = ENVS[env]
    path, expected = bad_dataset(tmp_path, kind, suffix)
    groups = tmp_path / "out" / "groups.jsonl"
    run = run_cli(env_cls, "process", "--env.dataset", str(path), "--env.data_path_to_save_groups", str(groups))
    lines = error_lines(run.stderr)
    assert run.returncode == 2, run.stderr
    assert len(lines) == 1 and lines[0].startswith("error: --env.dataset"), lines
    assert any(e in lines[0] for e in expected.split("|")) and lines[0].count("--env.dataset") == 1, lines
    assert "embedded model server" not in run.stderr  # nothing started before the check
    assert not groups.parent.exists()


def test_a_missing_dataset_as_a_user_runs_it(tmp_path):
    # The CLI as a process, default (embedded) model server: refused before that server starts.
    groups = tmp_path / "groups.jsonl"
    argv = [sys.executable, "-m", "environments.mhqa_env", "process", "--env.dataset", str(tmp_path / "nope.json")]
    proc = subprocess.run(
        [*argv, "--env.data_path_to_save_groups", str(groups)], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    assert error_lines(proc.stderr) == [
        f"error: --env.dataset {str(tmp_path / 'nope.json')!r}: no such file or directory"
    ]
    assert list(tmp_path.iterdir()) == []  # no groups file, nothing else


def test_a_bad_toolset_leaves_no_file(tmp_path):
    groups = tmp_path / "groups.jsonl"
    argv = [sys.executable, "-m", "environments.gsm8k_agent_env", "process", "--env.enabled_toolsets", "python,nope"]
    proc = subprocess.run(
        [*argv, "--env.data_path_to_save_groups", str(groups)], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert line.startswith("error:") and "unknown toolset(s) ['nope']" in line
    assert list(tmp_path.iterdir()) == []
