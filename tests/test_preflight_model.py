"""A model the server does not serve, or whose tokenizer is not on this machine, stops the command in
one line, exit 2, before anything starts and before any file is written (no wrong tokenizer, no
minute of hub retries)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from atroposlib.envs.server_handling.server_baseline import APIServerConfig

from environments.errors import HermesEnvError
from environments.gsm8k_agent_env import ENTRY
from tests.support.cli import run_cli
from tests.support.embedded import embedded_tokenizer
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread
from tests.support.tiny_env import WriteWordEnv


def error_lines(stderr: str) -> list[str]:
    # transformers announces at import that torch is absent; everything else must be our one line.
    return [line for line in stderr.splitlines() if line.strip() and "PyTorch was not found" not in line]


def test_a_model_the_server_does_not_serve(tmp_path):
    out = tmp_path / "out"
    with serving_in_a_thread(ScriptedOpenAIServer([{"content": "4"}], models=("org/served",))) as server:
        run = run_cli(
            ENTRY,
            "process",
            *("--openai.base_url", server.base_url, "--openai.model_name", "org/typo"),
            *("--env.tokenizer_name", embedded_tokenizer(), "--env.data_path_to_save_groups", str(out / "g.jsonl")),
        )
    assert run.returncode == 2, run.stderr
    assert error_lines(run.stderr) == [
        f"error: --openai.model_name 'org/typo' is not served by {server.base_url} (it serves 'org/served'); "
        "pass one of those"
    ]
    assert server.requests == [] and not out.exists()


@pytest.mark.parametrize("model", ["gpt-4o", "nobody/not-a-cached-model"])
def test_a_served_model_whose_tokenizer_is_not_here(model, tmp_path):
    out = tmp_path / "out"
    with serving_in_a_thread(ScriptedOpenAIServer([{"content": "4"}], models=(model,))) as server:
        run = run_cli(
            ENTRY,
            "process",
            *("--openai.base_url", server.base_url, "--openai.model_name", model),
            *("--env.data_path_to_save_groups", str(out / "g.jsonl")),
        )
    assert run.returncode == 2, run.stderr
    (line,) = error_lines(run.stderr)
    assert line.startswith(f"error: no tokenizer for --openai.model_name {model!r}") and "--env.tokenizer_name" in line
    assert server.requests == [] and not out.exists()


def test_an_unknown_model_as_a_user_runs_it(tmp_path):
    with serving_in_a_thread(ScriptedOpenAIServer([], models=("scripted",))) as server:
        argv = [sys.executable, "-m", "environments.gsm8k_agent_env", "process", "--openai.base_url", server.base_url]
        proc = subprocess.run(
            [*argv, "--openai.model_name", "gpt-4o", "--env.data_path_to_save_groups", str(tmp_path / "g.jsonl")],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=600,
        )
    assert proc.returncode == 2, proc.stderr
    assert error_lines(proc.stderr) == [
        f"error: --openai.model_name 'gpt-4o' is not served by {server.base_url} (it serves 'scripted'); pass one of those"
    ]
    assert list(tmp_path.iterdir()) == []


async def test_the_runtime_refuses_a_model_the_server_does_not_serve():
    # batch_runner and tests start the runtime without the CLI: the same check when it starts.
    async with ScriptedOpenAIServer([], models=("scripted",)) as server:
        config, _ = WriteWordEnv.config_init()
        config = config.model_copy(update={"tool_backend": "local", "unconfined_tools": True})
        env = WriteWordEnv(config, [APIServerConfig(base_url=server.base_url, model_name="other", api_key="x")])
        with pytest.raises(HermesEnvError, match="'other' is not served by"):
            async with env.runtime():
                pass
    assert server.requests == []
