"""batch_runner as a loop over the shared runtime: the embedded model by default (token mode, as in
the envs: runtime.token_server auto), and an injected model with no HTTP server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from batch_runner import BatchConfig, parse_args, run_batch
from environments.models.base import ModelTurn
from tests.batch.batch_helpers import lines, write_prompts

ROOT = Path(__file__).resolve().parents[2]


class LengthAgent:
    """Prints the prompt's length with the python tool, then reports it: no server involved."""

    async def chat(self, messages, tools, options) -> ModelTurn:
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        if messages[-1]["role"] == "user":
            call = {"function": {"name": "python", "arguments": json.dumps({"code": f"print(len({prompt!r}))"})}}
            return ModelTurn(content=None, tool_calls=[call])
        return ModelTurn(content=f"The answer is {json.loads(messages[-1]['content'])['output'].strip()}")


async def test_an_injected_model_runs_without_any_server(tmp_path: Path) -> None:
    dataset = write_prompts(tmp_path / "p.jsonl", [{"prompt": "x" * i} for i in range(1, 4)])
    config = BatchConfig(dataset_file=dataset, run_name="inj", output_dir=tmp_path, distribution="math")
    stats = await run_batch(config, model=LengthAgent)
    records = lines(tmp_path / "inj/trajectories.jsonl")
    assert sorted(r["final_response"] for r in records) == ["The answer is 1", "The answer is 2", "The answer is 3"]
    assert stats["recorded"] == 3 and stats["tools"]["python"]["calls"] == 3
    assert all("token_sequences" not in r for r in records)  # an injected model has no token protocol


def test_defaults_are_the_embedded_model_and_the_envs_own_runtime() -> None:
    from environments.cli_parse import CliError
    from environments.hermes_base_env import HermesAgentEnvConfig
    from environments.runtime import RuntimeConfig

    config = parse_args(["--dataset_file", "d.jsonl", "--run_name", "r"])
    env = HermesAgentEnvConfig()
    assert config.base_url == ["embedded"] and config.model == "SmolLM2-135M-Instruct"
    # One class, embedded unchanged: the same fields, names and defaults in both entry points.
    assert type(config.runtime) is type(env.runtime) is RuntimeConfig
    assert config.runtime == env.runtime and config.runtime.token_server == "auto"
    with pytest.raises(CliError, match="--model is required"):
        parse_args(["--dataset_file", "d.jsonl", "--run_name", "r", "--base_url", "http://127.0.0.1:8000/v1"])


@pytest.mark.llm
@pytest.mark.slow
def test_no_base_url_runs_the_embedded_model_and_records_exact_tokens(tmp_path: Path) -> None:
    dataset = write_prompts(
        tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"What is {i} plus {i}?"} for i in range(2)]
    )
    proc = subprocess.run(
        [
            sys.executable,
            "batch_runner.py",
            "--dataset_file",
            str(dataset),
            "--run_name",
            "emb",
            "--output_dir",
            str(tmp_path),
            "--distribution",
            "math",
            "--runtime.loop.max_turns",
            "1",
            "--runtime.loop.max_tokens",
            "16",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "starting the embedded model server" in proc.stderr and "token mode: exact tokens from llamacpp" in proc.stderr
    )
    records = lines(tmp_path / "emb/trajectories.jsonl")
    assert sorted(r["prompt_id"] for r in records) == ["q0", "q1"]
    for r in records:
        (seq,) = r["token_sequences"]
        assert len(seq["tokens"]) == len(seq["masks"]) == len(seq["logprobs"])
        sampled = [lp for m, lp in zip(seq["masks"], seq["logprobs"]) if m != -100]
        assert 0 < len(sampled) <= 16 and all(lp <= 0.0 for lp in sampled)
