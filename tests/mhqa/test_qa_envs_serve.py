"""`serve` of the QA envs into atroposlib's real `run-api`, on a scripted chat server: a trainer
registers and pulls a group whose scores differ (one right answer, one wrong)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer
from tests.support.run_api import wait_for_batch, register_trainer, start_process, start_run_api, stop_process
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread

# The bundled questions' gold answers, by a word of their prompt, and an answer wrong for all of them.
VIDEO_GOLD = {"kitchen": "C", "dog": "D", "vendor": "B"}
MHQA_GOLD = {
    "architect": "Kettering Vale",
    "same country": "no",
    "completed first": "Orlen Bridge",
    "instrument": "cello",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "golds", "wrong"),
    [("environments.video_qa_env", VIDEO_GOLD, "E"), ("environments.mhqa_env", MHQA_GOLD, "Selmar")],
    ids=["video_qa", "mhqa"],
)
def test_serve_hands_a_trainer_a_scored_group(tmp_path: Path, module: str, golds: dict[str, str], wrong: str) -> None:
    cfg = EmbeddedLLMConfig()
    tokenizer_dir = ensure_gguf_tokenizer(cfg.model_path, chat_template=cfg.resolved_chat_template())
    right = itertools.cycle([True, False])

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
        gold = next(answer for word, answer in golds.items() if word in prompt)
        return {"content": f"FINAL ANSWER: {gold if next(right) else wrong}"}

    api, api_url = start_run_api(tmp_path)
    env = None
    try:
        register_trainer(api_url, tmp_path / "ckpt", batch_size=2, num_steps=1)
        with serving_in_a_thread(ScriptedOpenAIServer([reply] * 50)) as server:
            env = start_process(
                [
                    sys.executable,
                    "-m",
                    module,
                    "serve",
                    "--env.rollout_server_url",
                    api_url,
                    "--openai.base_url",
                    server.base_url,
                    "--openai.model_name",
                    "scripted",
                    "--env.tokenizer_name",
                    str(tokenizer_dir),
                    "--env.max_num_workers",
                    "1",
                    "--env.group_size",
                    "2",
                ],
                tmp_path / "env.log",
            )
            batch = wait_for_batch(api_url, env, tmp_path / "env.log")
    finally:
        if env is not None:
            stop_process(env)
        stop_process(api)
    (group,) = batch
    assert sorted(group["scores"]) == [0.0, 1.0]
    assert len(group["tokens"]) == len(group["masks"]) == 2
    assert "registered with" in (tmp_path / "env.log").read_text()
