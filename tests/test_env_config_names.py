"""The env config embeds the runtime's own RuntimeConfig (`--env.runtime.*`); the flat names of earlier
releases still work for one release, by flag and in YAML, each with a one-line notice naming the new place."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from environments.cli_parse import CliError, parse_invocation
from environments.env_config import ENV_RENAMED, HermesAgentEnvConfig
from environments.gsm8k.env import GSM8kAgentEnv
from environments.runtime import RuntimeConfig


def test_every_old_name_lands_on_a_runtime_field_and_none_is_left_on_the_env() -> None:
    fields = HermesAgentEnvConfig.model_fields
    assert fields["runtime"].annotation is RuntimeConfig
    for old, new in ENV_RENAMED.items():
        assert old not in fields, f"{old} is still a field of the env config"
        model: type = HermesAgentEnvConfig
        for part in new.split("."):
            assert part in model.model_fields, f"{old} -> {new}: no field {part}"
            model = model.model_fields[part].annotation  # type: ignore[assignment]


def test_old_flags_and_yaml_keys_work_with_one_notice_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "old.yaml"
    config.write_text(
        yaml.safe_dump({"env": {"sandbox": {"backend": {"kind": "local", "pool": {"max_sandboxes": 2}}}}})
    )
    inv = parse_invocation(
        GSM8kAgentEnv,
        ["process", "--config", str(config), "--env.max_agent_turns", "3", "--env.tool_timeout_s", "7"],
    )
    runtime = inv.env_config.runtime
    assert (runtime.loop.max_turns, runtime.tool_limits.default_timeout_s) == (3, 7.0)
    assert runtime.sandbox.backend.pool.max_sandboxes == 2
    assert runtime.loop.max_tokens == 256  # the rest of the loop keeps the env's own defaults (gsm8k: 256)
    notices = [line for line in capsys.readouterr().err.splitlines() if "is now" in line]
    assert notices == [
        "[hermes-rl] --env.max_agent_turns is now --env.runtime.loop.max_turns; the old name is removed in the next release",
        "[hermes-rl] --env.tool_timeout_s is now --env.runtime.tool_limits.default_timeout_s; the old name is removed in "
        "the next release",
        f"[hermes-rl] env.sandbox in {config} is now env.runtime.sandbox; the old name is removed in the next release",
    ]


def test_an_old_and_a_new_name_for_one_value_is_an_error() -> None:
    with pytest.raises(CliError, match="--env.runtime.loop.max_turns given twice"):
        parse_invocation(GSM8kAgentEnv, ["process", "--env.max_agent_turns", "3", "--env.runtime.loop.max_turns", "4"])
