"""`--help` on every env command prints every flag (type, default, description) by section and
starts nothing; an evaluation lost entirely to infrastructure says so instead of `accuracy 0.0`."""

from __future__ import annotations

import shutil

import pytest

from environments.gaia.env import GaiaAgentEnv
from environments.gsm8k.env import GSM8kAgentEnv
from environments.gsm8k_agent_env import ENTRY as GSM8K_ENTRY
from environments.swe_smith_oracle_env import ENTRY as SWE_SMITH_ENTRY
from environments.mhqa.env import MHQAEnv
from environments.swe_smith.env import SweSmithOracleEnv
from environments.tau.env import TauEnv
from environments.terminal_tasks import BUNDLED_TASKS, TerminalTasksEnv
from environments.video_qa.env import VideoQAEnv
from environments.upstream_config import unused_reason
from tests.support.cli import run_cli

ENVS = [
    TerminalTasksEnv,
    GSM8kAgentEnv,
    GSM8K_ENTRY,
    SWE_SMITH_ENTRY,
    GaiaAgentEnv,
    SweSmithOracleEnv,
    MHQAEnv,
    VideoQAEnv,
    TauEnv,
]


@pytest.mark.parametrize("command", ["evaluate", "process", "serve", None])
@pytest.mark.parametrize("env_cls", ENVS, ids=lambda e: e.name + ("" if isinstance(e, type) else "_entry"))
def test_help_lists_every_flag_and_starts_nothing(env_cls, command, tmp_path):
    groups, evals = tmp_path / "groups.jsonl", tmp_path / "evals"
    # Flags a run would act on at once (a scripted agent, one task, where output goes): --help wins.
    extra = ["--env.data_path_to_save_groups", str(groups), "--env.data_dir_to_save_evals", str(evals)]
    if env_cls is TerminalTasksEnv:
        extra += ["--env.agent", "noop", "--env.limit", "1"]
    argv = [command] if command else []
    proc = run_cli(env_cls, *argv, *extra, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert not groups.exists() and not evals.exists()  # no command ran
    assert "[hermes-rl]" not in proc.stderr and "eval/" not in out
    sections = ["global flags:", "env (--env.*):", "openai (--openai.*):"]
    assert all(s in out for s in sections), out[:2000]
    assert [out.index(s) for s in sections] == sorted(out.index(s) for s in sections)
    for name in env_cls.env_config_cls.model_fields:
        listed = f"--env.{name} " in out or f"--env.{name}." in out
        assert listed == (unused_reason(env_cls.env_config_cls, name) is None), name  # unused ones: refused, not listed
    for flag in ("--openai.base_url", "--openai.model_name", "--config", "--verbose", "--slurm", "--testing"):
        assert flag in out, flag
    # one line per flag: name, type, default, description
    (group_size,) = [line for line in out.splitlines() if line.strip().startswith("--env.group_size ")]
    assert "int" in group_size and "default" in group_size and "group" in group_size.lower()
    assert any(
        line.strip().startswith("--env.runtime.sandbox.backend.pool.slots_per_sandbox ") for line in out.splitlines()
    )


@pytest.mark.slow
def test_an_evaluation_lost_to_infrastructure_reports_that_not_accuracy_zero(tmp_path):
    # An Endless task whose built state fails its own test_initial_state.py: setup fails, every time.
    shutil.copytree(BUNDLED_TASKS / "endless" / "task_000003_d4f6b8c0", tmp_path / "tasks" / "t")
    definition = tmp_path / "tasks" / "t" / "container.def"
    definition.write_text(definition.read_text().replace("beach.jpeg", "beach.png"))  # no .jpeg left to rename
    proc = run_cli(
        TerminalTasksEnv,
        "evaluate",
        "--env.agent",
        "oracle",
        "--env.tasks_dir",
        str(tmp_path / "tasks"),
        "--env.data_dir_to_save_evals",
        str(tmp_path / "eval"),
        "--env.data_path_to_save_groups",
        str(tmp_path / "g.jsonl"),
    )
    assert "eval/accuracy" not in proc.stdout, proc.stdout
    assert proc.returncode != 0
    assert "lost to infrastructure" in proc.stderr and "1 of 1" in proc.stderr, proc.stderr[-2000:]
