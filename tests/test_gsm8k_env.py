"""The GSM8k agent env end to end: the real `process` command against the embedded
llama.cpp server, and the command's behaviour on bad input."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from environments.gsm8k.answers import is_correct
from environments.gsm8k.data import gold_answer, synthetic_gsm8k
from environments.gsm8k.env import GSM8kAgentEnv
from tests.support.cli import CliRun, run_cli
from tests.support.embedded import embedded_model_flags, embedded_tokenizer, small_group_flags


# llama.cpp grammar: the model must write one hermes-format python call computing a product.
TOOL_CALL_GRAMMAR = r"""root ::= "<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(" num " * " num ")\"}}\n</tool_call>"
num ::= [1-9] [0-9]?"""


def run_env(*args: str) -> CliRun:
    return run_cli(GSM8kAgentEnv, *args)


def read_groups(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_synthetic_problems_are_gsm8k_format_and_deterministic():
    a, b = synthetic_gsm8k(20, seed=3), synthetic_gsm8k(20, seed=3)
    assert a == b and a != synthetic_gsm8k(20, seed=4)
    for item in a:
        gold = gold_answer(item["answer"])
        assert item["answer"].splitlines()[-1] == f"#### {gold}"
        assert int(gold) >= 0
        # the worked steps' <<a*b=c>> annotations are arithmetically true
        for expr in __import__("re").findall(r"<<([^=]+)=([^>]+)>>", item["answer"]):
            assert eval(expr[0]) == int(expr[1])


def test_math_verify_scoring():
    assert is_correct("So the answer is \\boxed{42}.", "42")
    assert is_correct("The change is $1,234", "1234")
    assert not is_correct("\\boxed{41}", "42")
    assert not is_correct("", "42") and not is_correct(None, "42")
    assert gold_answer("blah\n#### 1,000") == "1000"


@pytest.mark.llm
def test_process_runs_against_embedded_llama_cpp_and_executes_model_tool_calls(embedded_llm, tmp_path):
    out = tmp_path / "groups.jsonl"
    config = tmp_path / "config.yaml"
    # Grammar-constrained decoding makes the tiny model emit a tool call (it rarely does on its own).
    # llama.cpp refuses tools= together with a grammar, so the tools go into the system prompt.
    config.write_text(
        yaml.safe_dump(
            {"env": {"runtime": {"extra_body": {"grammar": TOOL_CALL_GRAMMAR}, "tools_in": "system_prompt"}}}
        )
    )
    proc = run_env(
        "process",
        "--config",
        str(config),
        *embedded_model_flags(embedded_llm),
        "--env.total_steps",
        "1",
        *small_group_flags(out, max_tokens=64),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert str(out.resolve()) in proc.stdout and str(out.with_suffix(".html").resolve()) in proc.stdout
    groups = read_groups(out)
    assert len(groups) == 1 and out.with_suffix(".html").exists()
    executed = 0
    for group in groups:
        assert len(group["messages"]) == len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == 2
        assert all(0.0 <= s <= 1.0 for s in group["scores"])
        for messages, tokens, masks in zip(group["messages"], group["tokens"], group["masks"]):
            assert len(tokens) == len(masks)
            assert any(m != -100 for m in masks) and any(m == -100 for m in masks)
            calls = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
            results = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
            assert calls, "the grammar forces a tool call every turn"
            for call in calls:
                assert call["function"]["name"] == "python"
                code = json.loads(call["function"]["arguments"])["code"]
                a, b = (int(x) for x in code.removeprefix("print(").removesuffix(")").split(" * "))
                # the call really ran: its output is the product the model asked for
                assert json.loads(results[call["id"]])["output"] == f"{a * b}\n"
                executed += 1
    assert executed == 4  # 2 rollouts, a forced call in each of their 2 turns


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_base_url_fails_fast_and_writes_nothing(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}/v1"
    out = tmp_path / "never.jsonl"
    proc = run_cli(
        GSM8kAgentEnv,
        "process",
        "--openai.base_url",
        url,
        "--openai.model_name",
        "m",
        "--env.tokenizer_name",
        embedded_tokenizer(),
        "--env.data_path_to_save_groups",
        str(out),
    )
    assert proc.returncode != 0
    assert url in proc.stderr and "cannot reach the model server" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_base_url_that_is_not_a_url_is_refused(tmp_path):
    proc = run_cli(
        GSM8kAgentEnv,
        "process",
        "--openai.base_url",
        "localhost:8000",
        "--env.data_path_to_save_groups",
        str(tmp_path / "x.jsonl"),
    )
    assert proc.returncode == 2
    assert "'localhost:8000' is not an http(s) URL" in proc.stderr


@pytest.mark.llm
def test_default_command_starts_the_embedded_model_and_gives_exact_tokens(tmp_path):
    """The README's main job, shortened: no --openai flags at all."""
    out = tmp_path / "default.jsonl"
    proc = run_env(
        "process",
        "--env.total_steps",
        "1",
        "--env.group_size",
        "2",
        "--env.runtime.loop.max_tokens",
        "48",
        "--env.data_path_to_save_groups",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "starting the embedded model server" in proc.stderr and "token mode" in proc.stderr
    assert str(out.resolve()) in proc.stdout and out.with_suffix(".html").exists()
    (group,) = read_groups(out)
    assert len(group["tokens"]) == 2 and all(0.0 <= s <= 1.0 for s in group["scores"])
    for tokens, masks, logprobs in zip(group["tokens"], group["masks"], group["inference_logprobs"]):
        assert len(tokens) == len(masks) == len(logprobs)
        sampled = [lp for m, lp in zip(masks, logprobs) if m != -100]
        assert sampled and all(lp <= 0.0 for lp in sampled)  # real sampling logprobs on the model's tokens
    for messages in group["messages"]:  # the embedded default: the first turn must call a tool
        first = next(m for m in messages if m["role"] == "assistant")
        # (a call whose arguments ran past the 48-token cap stays as its unparsed markup)
        assert first.get("tool_calls") or (first["content"] or "").startswith("<tool_call>"), first
