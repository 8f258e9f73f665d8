"""Both QA envs run `process` on the embedded llama.cpp model in token mode, and export with their domain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import exports
from environments.mhqa.env import MHQAEnv
from environments.video_qa.env import VideoQAEnv
from tests.support.cli import run_cli
from tests.support.embedded import embedded_model_flags, small_group_flags


@pytest.mark.llm
@pytest.mark.parametrize(("env_cls", "domain"), [(MHQAEnv, "mhqa"), (VideoQAEnv, "video_qa")])
def test_process_on_the_embedded_model_in_token_mode(embedded_llm, tmp_path: Path, env_cls, domain: str) -> None:
    out = tmp_path / "groups.jsonl"
    proc = run_cli(
        env_cls,
        "process",
        *embedded_model_flags(embedded_llm),
        "--env.runtime.token_server",
        "llamacpp",
        "--env.total_steps",
        "1",
        *small_group_flags(out, max_turns=2, max_tokens=32),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "token mode: exact tokens from llamacpp" in proc.stderr
    (group,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(group["tokens"]) == len(group["masks"]) == len(group["inference_logprobs"]) == 2
    for tokens, masks, logprobs in zip(group["tokens"], group["masks"], group["inference_logprobs"]):
        assert len(tokens) == len(masks) == len(logprobs) and any(m != -100 for m in masks)
    assert all(0.0 <= s <= 1.0 for s in group["scores"])
    assert exports.main(["trajectory", str(out), str(tmp_path / "t.jsonl")]) == 0
    trajs = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [t["domain"] for t in trajs] == [domain, domain]
    assert set(trajs[0]) == {"task_id", "domain", "question", "actions", "final_answer", "metadata"}
