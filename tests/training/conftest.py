"""One real data path for the training tests, run once per session.

atroposlib's `run-api` runs as a process; `python -m training.grpo` registers with it and waits
for a batch; the hash-reward GSM8k env serves groups into it from the embedded llama.cpp model
(exact tokens, free sampling at temperature 1); the trainer takes one step and saves its
weights and the batch it trained on. Two `process` runs on the same model write groups in the
env's own JSONL format: one with a grammar forcing python tool calls (for the per-tool SFT
split), one sampled freely at temperature 1 (the tokens the model itself chose, for the logprob
check). Tests then read what those real processes left behind.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.tokens.test_phase2_env import TOOL_CALL_GRAMMAR
from tests.support.run_api import start_process, start_run_api, stop_process

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class TrainedRun:
    grpo_out: Path  # weights, metrics.jsonl, batches.jsonl
    grpo_log: str
    grpo_returncode: int
    processed: Path  # `process` JSONL of the same env, tool calls forced by a grammar
    free_processed: Path  # `process` JSONL of the same env, free sampling at temperature 1


def _env_args(llm, config: Path, out: Path) -> list[str]:
    return [
        "--config",
        str(config),
        "--openai.base_url",
        llm.base_url,
        "--openai.model_name",
        llm.model_name,
        "--openai.api_key",
        "local",
        "--env.token_server",
        "llamacpp",
        "--env.tokenizer_name",
        str(llm.tokenizer_dir),
        "--env.group_size",
        "2",
        "--env.max_agent_turns",
        "2",
        "--env.agent_max_tokens",
        "48",
        "--env.agent_temperature",
        "1.0",
        "--env.data_path_to_save_groups",
        str(out),
    ]


@pytest.fixture(scope="session")
def trained_run(embedded_llm, tmp_path_factory) -> TrainedRun:
    tmp = tmp_path_factory.mktemp("trained_run")
    grammar_config, free_config = tmp / "grammar.yaml", tmp / "free.yaml"
    grammar_config.write_text(yaml.safe_dump({"env": {"extra_body": {"grammar": TOOL_CALL_GRAMMAR}}}))
    free_config.write_text(yaml.safe_dump({"env": {}}))
    env_cmd = [sys.executable, "-m", "tests.training.hash_reward_env"]

    # Both `process` runs at once: the llama.cpp server has slots for both.
    processed, free_processed = tmp / "processed.jsonl", tmp / "free_processed.jsonl"
    runs = [
        subprocess.Popen(
            [*env_cmd, "process", *_env_args(embedded_llm, config, out), "--env.total_steps", "1"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for config, out in ((grammar_config, processed), (free_config, free_processed))
    ]
    for run in runs:
        try:
            _, stderr = run.communicate(timeout=900)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 0, stderr[-3000:]

    api, api_url = start_run_api(tmp)
    trainer = env = None
    grpo_out, grpo_log = tmp / "grpo", tmp / "grpo.log"
    try:
        # lr large enough that one step visibly moves float32 weights.
        trainer = start_process(
            [
                sys.executable,
                "-m",
                "training.grpo",
                "--api_url",
                api_url,
                "--model",
                "embedded",
                "--out",
                str(grpo_out),
                "--steps",
                "1",
                "--batch_size",
                "2",
                "--lr",
                "1e-4",
                "--batch_timeout_s",
                "900",
            ],
            grpo_log,
        )
        env = start_process(
            [
                *env_cmd,
                "serve",
                *_env_args(embedded_llm, free_config, tmp / "served.jsonl"),
                "--env.rollout_server_url",
                api_url,
                "--env.wandb_name",
                "grpo-test",
                "--env.max_num_workers",
                "1",
            ],
            tmp / "env.log",
        )
        try:
            trainer.wait(1200)
        except subprocess.TimeoutExpired:
            pytest.fail(
                "training.grpo did not finish: " + grpo_log.read_text()[-3000:] + (tmp / "env.log").read_text()[-3000:]
            )
    finally:
        for p in (env, trainer, api):
            if p is not None:
                stop_process(p)
    return TrainedRun(grpo_out, grpo_log.read_text(), trainer.returncode, processed, free_processed)
