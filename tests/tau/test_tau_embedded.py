"""The τ² env runs `process` on the embedded llama.cpp model in token mode, the embedded model also
playing the user; the user's turns are in the token sequences and never trained; the export validates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

import exports
from environments.tau.env import TauEnv
from tests.support.cli import run_cli
from tests.support.embedded import embedded_model_flags, small_group_flags


@pytest.mark.llm
def test_process_on_the_embedded_model_in_token_mode(embedded_llm, tmp_path: Path) -> None:
    out = tmp_path / "groups.jsonl"
    proc = run_cli(
        TauEnv,
        "process",
        *embedded_model_flags(embedded_llm),
        "--env.runtime.token_server",
        "llamacpp",
        "--env.user_model.base_url",
        embedded_llm.base_url,
        "--env.user_model.max_tokens",
        "16",
        "--env.total_steps",
        "1",
        *small_group_flags(out, max_turns=1, max_tokens=16),  # the prompt (policy + 16 tools) is the cost
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "token mode: exact tokens from llamacpp" in proc.stderr
    (group,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(group["tokens"]) == len(group["masks"]) == len(group["inference_logprobs"]) == 2
    assert all(0.0 <= s <= 1.0 for s in group["scores"])
    for info in group["rollout_info"]:
        assert info["domain"] == "tau2_retail" and info["user_turns"] >= 1
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_llm.tokenizer_dir))
    for tokens, masks, messages in zip(group["tokens"], group["masks"], group["messages"]):
        assert len(tokens) == len(masks) and any(m != -100 for m in masks)
        full = tokenizer.decode(tokens)
        trained = tokenizer.decode([t for t, m in zip(tokens, masks) if m != -100])
        users = [m["content"] for m in messages if m["role"] == "user" and len(m["content"].strip()) >= 8]
        assistant = " ".join(m.get("content") or "" for m in messages if m["role"] == "assistant")
        assert users and users[0] in full  # the simulated user's opening is in the sequence ...
        for text in users:
            if text not in assistant:  # ... and no user turn is trained (unless the agent echoed it)
                assert text not in trained
    assert exports.main(["trajectory", str(out), str(tmp_path / "t.jsonl")]) == 0
    trajs = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [t["domain"] for t in trajs] == ["tau2_retail", "tau2_retail"]
    assert all(set(t) == {"task_id", "domain", "question", "actions", "final_answer", "metadata"} for t in trajs)
