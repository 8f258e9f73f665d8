"""The env command line: strict about flags and YAML keys at every depth, quiet, and secret-safe."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from environments.cli_parse import CliError, config_dump, parse_invocation, redact
from environments.gsm8k.env import GSM8kAgentEnv
from tests.support.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]


def error_lines(stderr: str) -> list[str]:
    # transformers announces at import that torch is absent; everything else must be our one line.
    return [line for line in stderr.splitlines() if line.strip() and "PyTorch was not found" not in line]


def write_yaml(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--env.group_sise", "4"], "unknown flag --env.group_sise; did you mean --env.group_size?"),
        (
            ["--env.runtime.sandbox.backend.pool.slots_per_sandbx", "4"],
            "did you mean --env.runtime.sandbox.backend.pool.slots_per_sandbox?",
        ),
        (["--openai.api_kye", "k"], "unknown flag --openai.api_kye; did you mean --openai.api_key?"),
        (["--verbos"], "unknown flag --verbos; did you mean --verbose?"),
        (["--env.group_size", "many"], "--env.group_size: Input should be a valid integer"),
        (
            ["--env.runtime.sandbox.backend.pool.slots_per_sandbox", "lots"],
            "--env.runtime.sandbox.backend.pool.slots_per_sandbox: Input should be a valid integer",
        ),
        (["--env.enabled_toolsets", "python,nope"], "unknown toolset(s) ['nope']"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args, expected):
    proc = run_cli(GSM8kAgentEnv, "process", *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = error_lines(proc.stderr)
    assert line.startswith("error: ") and expected in line
    assert "starting the embedded model server" not in proc.stderr  # checked before any server starts


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"env": {"group_sise": 4}}, "unknown key env.group_sise in"),
        (
            {"env": {"runtime": {"sandbox": {"backend": {"kind": "local", "pool": {"slots_per_sandbx": 8}}}}}},
            "did you mean env.runtime.sandbox.backend.pool.slots_per_sandbox?",
        ),
        ({"envv": {}}, "unknown section envv in"),
        ({"openai": {"base_ulr": "http://x/v1"}}, "did you mean openai.base_url?"),
        ({"env": {"runtime": {"loop": {"max_turns": "few"}}}}, "env.runtime.loop.max_turns in"),
        (
            {"env": {"runtime": {"sandbox": {"backend": {"kind": "local", "pool": {"slots_per_sandbox": "x"}}}}}},
            "env.runtime.sandbox.backend.pool.slots_per_sandbox in",
        ),
    ],
)
def test_bad_yaml_exits_2_with_one_line(tmp_path, config, expected):
    proc = run_cli(GSM8kAgentEnv, "process", "--config", write_yaml(tmp_path, config))
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = error_lines(proc.stderr)
    assert line.startswith("error: ") and expected in line


@pytest.mark.parametrize(
    "module",
    [
        "environments.gsm8k_agent_env",
        "environments.swe_smith_oracle_env",
        "environments.gaia_agent_env",
        "environments.terminal_tasks_env",
        "environments.mhqa_env",
        "environments.video_qa_env",
        "environments.tau_env",
        "environments.examples.count_files",
    ],
)
def test_each_entry_module_runs_as_a_command_and_prints_one_line(module):
    """As a user runs it: a new interpreter, so anything printed while importing would show here
    (the other command tests call the same `main` in-process)."""
    proc = subprocess.run(
        [sys.executable, "-m", module, "process", "--env.group_sise", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = error_lines(proc.stderr)
    assert line == "error: unknown flag --env.group_sise; did you mean --env.group_size?"


def test_list_flags_take_commas_and_yaml_lists():
    inv = parse_invocation(GSM8kAgentEnv, ["process", "--env.enabled_toolsets", "python,terminal"])
    assert inv.env_config.enabled_toolsets == ["python", "terminal"]
    inv = parse_invocation(GSM8kAgentEnv, ["process", "--env.disabled_toolsets=[file]"])
    assert inv.env_config.disabled_toolsets == ["file"]


def test_negative_numbers_need_no_equals_sign():
    inv = parse_invocation(GSM8kAgentEnv, ["serve", "--env.total_steps", "-1", "--env.seed", "-3"])
    assert inv.env_config.total_steps == -1 and inv.env_config.seed == -3


def test_serve_defaults_come_from_the_env_and_the_trainer():
    inv = parse_invocation(GSM8kAgentEnv, ["serve"])
    assert inv.env_config.wandb_name == "gsm8k_agent"  # run-api answers 422 without it
    assert inv.env_config.total_steps == -1  # the trainer's num_steps, read at registration
    inv = parse_invocation(GSM8kAgentEnv, ["serve", "--env.total_steps", "5"])
    assert inv.env_config.total_steps == 5


def test_a_tinker_section_is_the_trainers_and_means_logprobs_are_required(tmp_path):
    config = write_yaml(tmp_path, {"env": {"group_size": 4}, "tinker": {"lora_rank": 32, "learning_rate": 4e-5}})
    inv = parse_invocation(GSM8kAgentEnv, ["serve", "--config", config])
    assert inv.env_config.require_inference_logprobs and inv.tinker == {"lora_rank": 32, "learning_rate": 4e-5}


def test_keys_are_redacted_in_the_dump_and_only_shown_with_verbose(tmp_path):
    secret = "sk-test-0123456789"
    inv = parse_invocation(GSM8kAgentEnv, ["process", "--openai.api_key", secret])
    assert inv.server_configs[0].api_key == secret
    dump = config_dump(inv)
    assert secret not in dump and "api_key: '***'" in dump
    assert redact({"a": {"tavily_api_key": "x", "n": [{"token": "t"}]}}) == {
        "a": {"tavily_api_key": "***", "n": [{"token": "***"}]}
    }
    # --verbose prints the dump (redacted), then the bad toolset stops the command before any server.
    quiet = run_cli(GSM8kAgentEnv, "process", "--openai.api_key", secret, "--env.enabled_toolsets", "nope")
    loud = run_cli(GSM8kAgentEnv, "process", "--verbose", "--openai.api_key", secret, "--env.enabled_toolsets", "nope")
    assert "group_size" not in quiet.stderr and "group_size" in loud.stderr
    assert secret not in loud.stderr + loud.stdout and "***" in loud.stderr


def test_unknown_command_and_stray_argument():
    with pytest.raises(CliError, match="unknown command 'procss'"):
        parse_invocation(GSM8kAgentEnv, ["procss"])
    with pytest.raises(CliError, match="unexpected argument 'x'"):
        parse_invocation(GSM8kAgentEnv, ["process", "x"])
