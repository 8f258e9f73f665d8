"""Nothing lost between a rollout and the trainer: `serve` into atroposlib's real `run-api`, a
trainer polling `/batch`, token mode with Qwen3's chat template (not append-only: an assistant turn
whose reasoning is empty renders differently once a tool result follows, so every tool-using
rollout spans two token sequences), and model requests lost to 503s.

The token server is a double on 127.0.0.1 speaking vLLM's `/generate` that answers like a model
following Qwen3's template: a `write_file` tool call on a rollout's first turn, "Done." after it.
Its 2nd and 5th and 6th first-turn requests answer 503 (no request retries): group 1 loses a
rollout and re-runs it (complete: sent); group 2 loses one twice (`rollout_infra_retries 1`), so
`serve` says it is not sent and why; group 3 is complete. The trainer takes 2 steps of 2 sequences.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys

import httpx
import pytest
from aiohttp import web

from tests.support.run_api import register_trainer, start_run_api, stop_process

from .conftest import QWEN_TOKENIZER, TEMPLATES
from .doubles import Scripted, ScriptedTokenServerDouble

FAILING_FIRST_TURNS = {2, 5, 6}


class Qwen3Agent(ScriptedTokenServerDouble):
    """Answers from the prompt it is sent: a tool call first, then "Done."; some first turns 503."""

    def __init__(self, tokenizer) -> None:
        super().__init__([])
        self.tokenizer = tokenizer
        self.first_turns = 0

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = self.tokenizer.decode(body["prompt"]["prompt_token_ids"])
        if "<tool_response>" not in prompt:
            self.first_turns += 1
            if self.first_turns in FAILING_FIRST_TURNS:
                self.requests.append(("/generate", body))
                return web.Response(status=503, text="engine overloaded")
            word = re.findall(r"Write the word (\w+) into answer.txt", prompt)[-1]
            call = {"name": "write_file", "arguments": {"path": "answer.txt", "content": word}}
            text = f"<think>\n\n</think>\n\n<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"
        else:
            text = "<think>\n\n</think>\n\nDone.<|im_end|>"
        ids = self.tokenizer.encode(text)
        self.script.append(Scripted(ids, [-0.25] * len(ids)))
        return await super()._generate(_Replayed(body))


class _Replayed:
    """The request body again, for the double's own handler (the stream was read above)."""

    def __init__(self, body: dict) -> None:
        self.body = body

    async def json(self) -> dict:
        return self.body


@pytest.mark.timeout(600)
async def test_every_sequence_serve_reports_sent_reaches_the_trainer_and_serve_exits(qwen_tokenizer, tmp_path):
    api, api_url = start_run_api(tmp_path)
    serve = None
    try:
        register_trainer(api_url, tmp_path / "ckpt", batch_size=2, num_steps=2)
        async with Qwen3Agent(qwen_tokenizer) as model:
            serve = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.support.tiny_env",
                "serve",
                "--env.rollout_server_url",
                api_url,
                "--env.wandb_name",
                "boundary",
                "--openai.base_url",
                model.url + "/v1",
                "--openai.model_name",
                "m",  # what the vLLM double lists
                "--env.runtime.token_server",
                "vllm",
                "--env.tokenizer_name",
                str(QWEN_TOKENIZER),
                "--env.runtime.chat_template_path",
                str(TEMPLATES / "Qwen-Qwen3-0.6B.jinja"),
                "--env.group_size",
                "2",
                "--env.max_num_workers",
                "1",
                "--env.runtime.model_max_retries",
                "0",
                "--env.rollout_infra_retries",
                "1",
                "--env.ensure_scores_are_not_same=false",
                "--env.runtime.loop.max_turns",
                "3",
                "--env.runtime.loop.max_tokens",
                "64",
                "--env.data_path_to_save_groups",
                str(tmp_path / "served.jsonl"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            batches: list[list[dict]] = []
            async with httpx.AsyncClient(timeout=10) as http:
                while len(batches) < 2:  # the trainer: two steps
                    assert serve.returncode is None, "serve stopped before the trainer was done"
                    batch = (await http.get(api_url + "/batch")).json().get("batch")
                    if batch:
                        batches.append(batch)
                    else:
                        await asyncio.sleep(0.5)
            _, err_bytes = await asyncio.wait_for(serve.communicate(), 300)  # the trainer is done: serve exits
    finally:
        if serve is not None and serve.returncode is None:
            serve.kill()
            await serve.wait()
        stop_process(api)
    log = err_bytes.decode()
    assert serve.returncode == 0, log[-3000:]
    assert "Traceback" not in log

    sent = [line for line in log.splitlines() if "sent to the trainer" in line]
    assert len(sent) == 2 and all("sent to the trainer: run-api received;" in line for line in sent), log[-3000:]
    lost = [line for line in log.splitlines() if "group not sent: 1 of 2 rollouts lost to infrastructure" in line]
    assert len(lost) == 1, log[-3000:]
    assert "buffered" not in log.replace("0 buffered", "")
    (summary,) = [line for line in log.splitlines() if "serve: stopping: the trainer's run is done" in line]
    assert "2 groups (4 sequences) received by run-api, 0 buffered" in summary
    assert "1 x 1 of 2 rollouts lost to infrastructure errors" in summary

    # The trainer received every sequence serve reported as sent, in whole groups.
    groups = [g for batch in batches for g in batch]
    assert [len(g["tokens"]) for g in groups] == [2, 2]
    assert sum(len(b) for b in batches) == 2  # one group per step of 2 sequences
    for group in groups:
        assert len(group["inference_logprobs"]) == len(group["masks"]) == 2
        assert group["group_overrides"]["sequence_rollouts"] == [0, 1]
        for tokens, masks, logprobs in zip(group["tokens"], group["masks"], group["inference_logprobs"]):
            assert all((m != -100) == (lp <= 0.0) for m, lp in zip(masks, logprobs))
            assert all(m == t for m, t in zip(masks, tokens) if m != -100)
            # the last sequence of a split rollout: the tool call is context, "Done." is trained
            assert "<tool_call>" in qwen_tokenizer.decode(tokens)
            assert qwen_tokenizer.decode([t for t, m in zip(tokens, masks) if m != -100]).endswith("Done.<|im_end|>")
    # Qwen3's template split every rollout in two (process-side record: run-api drops rollout_info).
    written = [json.loads(line) for line in (tmp_path / "served.jsonl").read_text().splitlines()]
    assert len(written) == 2 and all(i["token_sequences"] == 2 for g in written for i in g["rollout_info"])
    # the same groups, in whatever order the two finished and run-api queued them
    assert sorted(g["tokens"] for g in written) == sorted(g["tokens"] for g in groups)
    # 9 first turns asked for: 6 groups' rollouts, 3 lost to 503s (1 re-run that succeeded, 2 for group 2)
    assert model.first_turns >= 8
