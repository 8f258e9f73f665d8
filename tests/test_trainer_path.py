"""What a trainer gets, and how the commands behave around it: per-server request limits, 4xx as a
config error, logprob gaps, a silent model server, short groups under wandb, SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from atroposlib.envs.base import APIServerConfig

from environments.hermes_base_env import HermesAgentEnvConfig, HermesEnvError
from environments.models.token_mode.wiring import finish_logprobs, sampling_setup
from tests.support.scripted_openai import ScriptedOpenAIServer, tool_call
from tests.support.tiny_env import WriteWordEnv
from tests.support.embedded import embedded_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def make_env(base_url: str, tmp_path: Path, server: dict | None = None, **overrides) -> WriteWordEnv:
    settings = {"group_size": 4, "total_steps": 1, **overrides}
    config = HermesAgentEnvConfig(
        tokenizer_name=embedded_tokenizer(),
        use_wandb=False,
        data_path_to_save_groups=str(tmp_path / "groups.jsonl"),
        ensure_scores_are_not_same=False,
        **settings,
    )
    env = WriteWordEnv(
        config, [APIServerConfig(base_url=base_url, model_name="scripted", api_key="", **(server or {}))]
    )
    env.process_mode = True
    env.n_groups_to_process = config.total_steps
    env.group_size_to_process = config.group_size
    return env


async def test_num_max_requests_at_once_bounds_our_own_client(tmp_path):
    async with ScriptedOpenAIServer([{"content": "done"}] * 4, delay_s=0.3) as server:
        env = make_env(server.base_url, tmp_path, {"num_max_requests_at_once": 1})
        await env.process_manager()
    assert len(server.requests) == 4 and server.max_in_flight == 1


async def test_num_requests_for_eval_bounds_evaluation_rollouts(tmp_path):
    async with ScriptedOpenAIServer([{"content": "done"}] * 6, delay_s=0.3) as server:
        env = make_env(server.base_url, tmp_path, {"num_max_requests_at_once": 8, "num_requests_for_eval": 2})
        async with env.runtime():
            await env.setup()
            await asyncio.gather(*(env.rollout({"word": "apple"}, for_eval=True) for _ in range(6)))
    assert len(server.requests) == 6 and server.max_in_flight == 2


async def test_a_4xx_stops_the_command_once_instead_of_being_retried(tmp_path):
    async with ScriptedOpenAIServer([400] * 20) as server:
        env = make_env(server.base_url, tmp_path, runtime={"model_max_retries": 2})
        with pytest.raises(HermesEnvError, match=r"refused the request \(HTTP 400\)"):
            await env.process_manager()
    assert len(server.requests) <= env.config.group_size  # the group's first calls, none retried
    assert not (tmp_path / "groups.jsonl").exists()


async def test_a_silent_model_server_voids_rollouts_instead_of_scoring_them(tmp_path):
    async with ScriptedOpenAIServer([{"content": "late"}] * 20, delay_s=5) as server:
        env = make_env(
            server.base_url,
            tmp_path,
            {"timeout": 1},
            group_size=2,
            max_consecutive_infra_failures=1,
            runtime={"model_max_retries": 0},
        )
        with pytest.raises(HermesEnvError, match="failed on infrastructure errors"):
            await env.process_manager()
    assert not (tmp_path / "groups.jsonl").exists()  # nothing scored 0.0


def test_trained_positions_without_a_logprob_are_never_silently_1():
    masks, logprobs = [-100, 5, 6, 7], [None, -0.5, None, -0.1]
    assert finish_logprobs(masks, logprobs, "mask") == ([-100, 5, -100, 7], [1.0, -0.5, 1.0, -0.1], 1)
    assert finish_logprobs(masks, logprobs, "drop") is None
    assert finish_logprobs(masks, logprobs, "keep") == (masks, [1.0, -0.5, 1.0, -0.1], 1)
    assert finish_logprobs([-100, 5], [None, -0.2], "drop") == ([-100, 5], [1.0, -0.2], 0)


def test_the_sampling_record_says_what_was_sent_and_what_logprobs_mean():
    extra, record = sampling_setup("llamacpp", 0.7, 64, {"top_k": 0}, "sampling_policy")
    assert extra == {"top_k": 0, "top_p": 0.95, "min_p": 0.05, "post_sampling_probs": True}
    assert record["top_k"] == 0 and record["temperature"] == 0.7 and "after temperature" in record["logprobs"]
    _, record = sampling_setup("llamacpp", 0.7, 64, {}, "raw_logits")
    assert record["logprobs"].startswith("log-softmax of the raw logits")
    with pytest.raises(ValueError, match="processed_logprobs"):
        sampling_setup("vllm", 1.0, 64, {}, "sampling_policy")
    assert sampling_setup(None, 1.0, 64, {}, "raw_logits")[1]["logprobs"] is None


async def _run_tiny(*args: str, env_vars: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.tiny_env",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env_vars or {})},
    )


def _write_then_done():
    return [
        {"content": None, "tool_calls": [tool_call("write_file", {"path": "answer.txt", "content": "apple"})]},
        {"content": "done"},
    ]


async def test_a_short_group_survives_wandb_rollout_logging(tmp_path):
    # 1 of 2 rollouts is lost to a 503 and not retried: a group of 1 with group_overrides.
    script = [*_write_then_done()[:1], 503, _write_then_done()[1]]
    async with ScriptedOpenAIServer(script) as server:
        proc = await _run_tiny(
            "process",
            "--openai.base_url",
            server.base_url,
            "--openai.model_name",
            "scripted",
            "--env.group_size",
            "2",
            "--env.total_steps",
            "1",
            "--env.rollout_infra_retries",
            "0",
            "--env.runtime.model_max_retries",
            "0",
            "--env.use_wandb",
            "true",
            "--env.num_rollouts_per_group_for_logging=-1",
            "--env.data_path_to_save_groups",
            str(tmp_path / "short.jsonl"),
            env_vars={"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"},
        )
        out, err = await asyncio.wait_for(proc.communicate(), 600)
    assert proc.returncode == 0, err.decode()[-3000:]
    (group,) = [json.loads(line) for line in (tmp_path / "short.jsonl").read_text().splitlines()]
    assert group["group_overrides"]["group_size"] == 1 and len(group["tokens"]) == 1
    assert list((tmp_path / "wandb").glob("offline-run-*")), "wandb ran (offline) and logged the group"


class HangAfter(ScriptedOpenAIServer):
    """Answers the first `n` requests, then holds the rest (a model server gone silent)."""

    def __init__(self, n: int, script: list) -> None:
        super().__init__(script)
        self.n = n

    async def _answer(self, request):
        if len(self.requests) >= self.n:
            await asyncio.sleep(20)
        return await super()._answer(request)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_stops_process_in_one_line_with_whole_lines_and_no_temp_dirs(tmp_path, signum):
    out = tmp_path / "groups.jsonl"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # The first group answers at once; the second hangs until the signal.
    script = [*_write_then_done(), *_write_then_done()] + [{"content": "late"}] * 8
    async with HangAfter(4, script) as server:
        proc = await _run_tiny(
            "process",
            "--openai.base_url",
            server.base_url,
            "--openai.model_name",
            "scripted",
            "--env.group_size",
            "2",
            "--env.total_steps",
            "5",
            "--env.data_path_to_save_groups",
            str(out),
            env_vars={"TMPDIR": str(tmp)},
        )
        for _ in range(1200):
            if out.exists() and out.read_text().endswith("\n"):
                break
            await asyncio.sleep(0.25)
        await asyncio.sleep(1.0)
        proc.send_signal(signum)
        _, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 128 + signum, err.decode()[-3000:]
    lines = [line for line in err.decode().splitlines() if "stopped by" in line]
    assert lines == [f"[hermes-rl] stopped by {signal.Signals(signum).name}; 1 complete groups in {out.resolve()}"]
    assert "Traceback" not in err.decode() and "KeyboardInterrupt" not in err.decode()
    text = out.read_text()
    assert text.endswith("\n") and all(json.loads(line) for line in text.splitlines())
    assert tmp.is_dir() and not list(tmp.glob("hermes-*"))  # sandbox workspaces and temp dirs removed
