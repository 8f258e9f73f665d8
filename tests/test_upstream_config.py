"""The env config's own copy of atroposlib's settings: the same names and defaults as `BaseEnvConfig`,
the ones nothing reads refused in one line, and a command line that answers `--help` and refuses bad
input without importing atroposlib's BaseEnv, transformers or torch."""

from __future__ import annotations

import subprocess
import sys
from operator import attrgetter
from pathlib import Path

import pytest
from atroposlib.envs.base import BaseEnvConfig

from environments.agent_loop import AgentLoopConfig
from environments.gsm8k.env import GSM8kAgentEnv
from environments.gsm8k_agent_env import ENTRY
from environments.hermes_base_env import HermesAgentEnvConfig
from environments.gaia.env import GaiaAgentEnv
from environments.gaia_agent_env import ENTRY as GAIA_ENTRY
from environments.tau.env import TauEnv
from environments.tau_env import ENTRY as TAU_ENTRY
from environments.mhqa.env import MHQAEnv
from environments.mhqa_env import ENTRY as MHQA_ENTRY
from environments.video_qa.env import VideoQAEnv
from environments.video_qa_env import ENTRY as VIDEO_QA_ENTRY
from environments.swe_smith.env import SweSmithOracleEnv
from environments.swe_smith_oracle_env import ENTRY as SWE_ENTRY
from environments.runtime import RuntimeConfig
from environments.upstream_config import UpstreamEnvConfig, unused_reason
from tests.support.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
UNUSED = ["thinking_mode", "reasoning_effort", "max_reasoning_tokens", "custom_thinking_prompt", "max_eval_workers"]


def test_the_same_settings_and_defaults_as_atroposlib():
    ours, theirs = UpstreamEnvConfig.model_fields, BaseEnvConfig.model_fields
    assert sorted(ours) == sorted(theirs)
    for name, field in theirs.items():
        default = field.get_default(call_default_factory=True)
        mine = ours[name].get_default(call_default_factory=True)
        assert getattr(mine, "value", mine) == getattr(default, "value", default), name
    assert sorted(n for n in ours if unused_reason(UpstreamEnvConfig, n)) == sorted(UNUSED)


@pytest.mark.parametrize("name", UNUSED)
def test_a_setting_nothing_reads_is_refused_in_one_line(name, tmp_path):
    value = "high" if name == "reasoning_effort" else "2048" if name == "max_reasoning_tokens" else "1"
    out = tmp_path / "out"
    proc = run_cli(ENTRY, "process", f"--env.{name}", value, "--env.data_path_to_save_groups", str(out / "g.jsonl"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and f"--env.{name}" in proc.stderr and "does not use" in proc.stderr
    assert not out.exists()
    config = tmp_path / "c.yaml"
    config.write_text(f"env:\n  {name}: {value}\n")
    proc = run_cli(ENTRY, "process", "--config", str(config), "--env.data_path_to_save_groups", str(out / "g.jsonl"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and f"env.{name} in {config}" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "entry, env_cls, own",
    [
        (ENTRY, GSM8kAgentEnv, {"group_size": 4, "runtime.loop.max_turns": 4, "runtime.loop.max_tokens": 256}),
        (SWE_ENTRY, SweSmithOracleEnv, {"max_token_length": 8192}),
        (MHQA_ENTRY, MHQAEnv, {"runtime.loop.max_turns": 6}),
        (VIDEO_QA_ENTRY, VideoQAEnv, {"runtime.loop.max_turns": 5}),
        (TAU_ENTRY, TauEnv, {"runtime.loop.max_turns": 200, "runtime.loop.max_tokens": None}),
        (GAIA_ENTRY, GaiaAgentEnv, {"total_steps": 12, "runtime.loop.max_turns": 8}),
    ],
    ids=["gsm8k", "swe_smith", "mhqa", "video_qa", "tau", "gaia"],
)
def test_the_entry_gives_the_env_class_defaults(entry, env_cls, own):
    entry_config, entry_servers = entry.config_init()
    class_config, class_servers = env_cls.config_init()
    assert entry_config.model_dump() == class_config.model_dump()
    assert [s.model_dump() for s in entry_servers] == [s.model_dump() for s in class_servers]
    assert {k: attrgetter(k)(class_config) for k in own} == own  # the task's own defaults
    # a nested default changes its one value: the rest of the runtime keeps the base defaults
    base_loop = AgentLoopConfig().model_dump(exclude={"max_turns", "max_tokens"})
    assert class_config.runtime.loop.model_dump(exclude={"max_turns", "max_tokens"}) == base_loop
    assert class_config.runtime.model_dump(exclude={"loop"}) == RuntimeConfig().model_dump(exclude={"loop"})
    assert entry.load() is env_cls
    assert issubclass(env_cls.env_config_cls, HermesAgentEnvConfig)


HEAVY = ("atroposlib.envs.base", "transformers", "torch")
PROBE = """
import runpy, sys
sys.argv = ["gsm8k_agent_env", *sys.argv[1:]]
try:
    runpy.run_module("environments.gsm8k_agent_env", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print("EXIT", code, sorted(m for m in sys.modules if m in {heavy!r}))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["process", "--help"],
        ["process", "--env.group_sise", "2"],
        ["process", "--env.group_size", "two"],
        ["process", "--env.thinking_mode", "true"],
    ],
    ids=["help", "unknown-flag", "bad-value", "unused-setting"],
)
def test_help_and_config_refusals_import_no_model_stack(argv, tmp_path):
    out = tmp_path / "out"
    argv = [*argv, "--env.data_path_to_save_groups", str(out / "g.jsonl")]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=set(HEAVY)), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    last = proc.stdout.strip().splitlines()[-1]
    expected = 0 if "--help" in argv else 2
    assert last == f"EXIT {expected} []", (last, proc.stderr[-2000:])
    if expected == 2:
        assert proc.stderr.count("\n") == 1, proc.stderr
    assert not out.exists()
