"""The GSM8k env in Phase 2 (exact tokens) against the embedded llama.cpp server's native
`/completion` endpoint: the written groups carry the ids the model saw and produced."""

from __future__ import annotations

import json

import pytest
import yaml

from environments.gsm8k.env import GSM8kAgentEnv
from tests.support.cli import CliRun, run_cli
from tests.support.embedded import embedded_model_flags, small_group_flags


# llama.cpp grammar: one hermes-format python call computing a product (the tiny model rarely
# calls tools on its own).
TOOL_CALL_GRAMMAR = r"""root ::= "<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(" num " * " num ")\"}}\n</tool_call>"
num ::= [1-9] [0-9]?"""


def run_env(*args: str) -> CliRun:
    return run_cli(GSM8kAgentEnv, *args)


def trained_spans(masks: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate(masks + [-100]):
        if m != -100 and start is None:
            start = i
        elif m == -100 and start is not None:
            spans.append((start, i))
            start = None
    return spans


@pytest.mark.llm
@pytest.mark.slow
def test_gsm8k_phase2_groups_carry_exact_tokens_masks_logprobs(embedded_llm, tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "groups.jsonl"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"env": {"runtime": {"extra_body": {"grammar": TOOL_CALL_GRAMMAR}}}}))
    proc = run_env(
        "process",
        "--config",
        str(config),
        *embedded_model_flags(embedded_llm),
        "--env.runtime.token_server",
        "llamacpp",
        "--env.total_steps",
        "1",
        *small_group_flags(out, max_tokens=64),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "token mode: exact tokens from llamacpp" in proc.stderr
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_llm.tokenizer_dir))
    (group,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (
        len(group["tokens"]) == len(group["masks"]) == len(group["inference_logprobs"]) == len(group["messages"]) == 2
    )
    for tokens, masks, logprobs, messages in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], group["messages"]
    ):
        assert len(tokens) == len(masks) == len(logprobs)
        assert all(m in (-100, t) for t, m in zip(tokens, masks))
        # Sampled positions carry the server's logprobs; all others atroposlib's 1.0 marker.
        assert all((lp <= 0.0) == (m != -100) for m, lp in zip(masks, logprobs))
        spans = trained_spans(masks)
        assistants = [m for m in messages if m["role"] == "assistant"]
        assert len(spans) == len(assistants) == 2
        # Decoding the masked-in tokens gives exactly what each assistant turn said.
        for (start, end), msg in zip(spans, assistants):
            (call,) = msg["tool_calls"]
            args = json.loads(call["function"]["arguments"])
            said = (
                '<tool_call>\n{"name": "python", "arguments": {"code": "' + args["code"] + '"}}\n</tool_call><|im_end|>'
            )
            assert tokenizer.decode(tokens[start:end]) == said
        # The first prompt is the template's render of the opening messages, with the tools.
        opening = messages[: messages.index(assistants[0])]
        first = tokenizer.decode(tokens[: spans[0][0]])
        assert (
            first.startswith("<|im_start|>system\n")
            and "<tools>" in first
            and first.endswith("<|im_start|>assistant\n")
        )
        assert opening[-1]["content"] in first
        # Tool results sit between the turns, as the template renders them, unmasked.
        between = tokenizer.decode(tokens[spans[0][1] : spans[1][0]])
        result = next(m for m in messages if m["role"] == "tool")["content"]
        assert (
            between.startswith("\n<|im_start|>") and result in between and between.endswith("<|im_start|>assistant\n")
        )
        assert tokenizer.decode(tokens).count("<|im_end|><|im_end|>") == 0


@pytest.mark.llm
@pytest.mark.slow
def test_gsm8k_phase2_evaluate_runs_on_the_token_server(embedded_llm, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"env": {"runtime": {"extra_body": {"grammar": TOOL_CALL_GRAMMAR}}}}))
    proc = run_env(
        "evaluate",
        "--config",
        str(config),
        "--openai.base_url",
        embedded_llm.base_url,
        "--openai.model_name",
        embedded_llm.model_name,
        "--openai.api_key",
        "local",
        "--env.runtime.token_server",
        "llamacpp",
        "--env.tokenizer_name",
        str(embedded_llm.tokenizer_dir),
        "--env.eval_size",
        "2",
        "--env.runtime.loop.max_turns",
        "1",
        "--env.runtime.loop.max_tokens",
        "48",
        "--env.data_dir_to_save_evals",
        str(tmp_path / "evals"),
        "--env.data_path_to_save_groups",
        str(tmp_path / "groups.jsonl"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "groups.jsonl").exists(), "evaluate writes no groups, so it leaves no empty groups file"
    assert "token mode: exact tokens from llamacpp" in proc.stderr
    assert "'eval/infrastructure_failures': 0" in proc.stdout and "'eval/n': 2" in proc.stdout
