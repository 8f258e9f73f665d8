"""`python -m training.eval_merged`: lm-eval's aime25 task against an OpenAI-compatible server.

The data set is a local copy in math-ai/aime25's published shape (tests/training/data/aime25/
test.jsonl: `problem`, `answer` (int), `id` (str); our own problems). The command runs as a
process with the hub switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), so any download
attempt (data set, tokenizer) fails the run. Every run is a process for a second reason: inside
pytest the name `training` is this directory's package (tests/ is on sys.path first), so an
in-process `import training.eval_merged` would reach the installed checkout, not this one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread

DATA = Path(__file__).parent / "data" / "aime25"
ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = [json.loads(line) for line in (DATA / "test.jsonl").read_text().splitlines()]


def _run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "training.eval_merged", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _problem_of(body: dict[str, Any]) -> dict[str, Any]:
    prompt = body["messages"][-1]["content"]
    (problem,) = [p for p in PROBLEMS if f"Question: {p['problem']}\nAnswer:" == prompt]
    return problem


def test_pass_at_k_is_counted_over_repeats(tmp_path: Path) -> None:
    """Problem 0 right every time (boxed, then in $...$), problem 1 right on its second answer only,
    problem 2 never: pass@1 = (3 + 1 + 0) / 9, pass@3 = 2 / 3, whatever order the requests come in."""
    asked: Counter[str] = Counter()

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        problem = _problem_of(body)
        asked[problem["id"]] += 1
        n = asked[problem["id"]]
        if problem["id"] == "0":
            return {"content": "7^4 ends in 1, so the remainder is \\boxed{7}." if n % 2 else "It is $7$."}
        if problem["id"] == "1":
            return {"content": "\\boxed{4}" if n == 2 else "There are \\boxed{6} of them."}
        return {"content": "The area is at most \\boxed{624}."}

    out = tmp_path / "results.json"
    with serving_in_a_thread(ScriptedOpenAIServer([answer] * 9)) as server:
        run = _run(
            "--base_url",
            server.base_url,
            "--model",
            "merged",
            "--data",
            str(DATA),
            "--repeats",
            "3",
            "--temperature",
            "0.7",
            "--max_tokens",
            "256",
            "--out",
            str(out),
        )
        requests = list(server.requests)
    assert run.returncode == 0, run.stderr[-3000:]
    assert asked == {"0": 3, "1": 3, "2": 3}
    result = json.loads(out.read_text())
    assert result["pass@1"] == pytest.approx(4 / 9)
    assert result["pass@3"] == pytest.approx(2 / 3)
    assert [(p["id"], p["target"], p["correct"], len(p["answers"])) for p in result["per_problem"]] == [
        ("0", "7", 3, 3),
        ("1", "4", 1, 3),
        ("2", "625", 0, 3),
    ]
    assert result["problems"] == 3 and result["repeats"] == 3
    assert "pass@1 0.4444, pass@3 0.6667" in run.stdout
    # The harness's task and the sampling settings reached the server: its prompt and stop
    # strings, our temperature and token cap, and no fixed seed (repeats must differ).
    for body in requests:
        assert body["model"] == "merged"
        assert body["temperature"] == 0.7 and body["max_tokens"] == 256
        assert body["seed"] is None
        assert "Question:" in body["stop"]
        assert len(body["messages"]) == 1 and body["messages"][0]["role"] == "user"


def test_one_answer_per_problem_keeps_the_task_greedy(tmp_path: Path) -> None:
    """--repeats 1 (the default): greedy, the harness's fixed seed, pass@1 is plain accuracy."""
    out = tmp_path / "results.json"
    replies = [lambda b: {"content": f"\\boxed{{{_problem_of(b)['answer'] if _problem_of(b)['id'] != '2' else 0}}}"}]
    with serving_in_a_thread(ScriptedOpenAIServer(replies * 3)) as server:
        run = _run("--base_url", server.base_url, "--model", "m", "--data", str(DATA), "--out", str(out))
        requests = list(server.requests)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["pass@1"] == pytest.approx(2 / 3)
    assert "pass@2" not in result and [p["correct"] for p in result["per_problem"]] == [1, 1, 0]
    assert {(b["temperature"], b["seed"], b["max_tokens"]) for b in requests} == {(0.0, 1234, 32768)}


def test_bad_settings_fail_in_one_line(tmp_path: Path) -> None:
    base = ["--base_url", "http://127.0.0.1:9/v1", "--model", "m", "--out", str(tmp_path / "r.json")]
    greedy = _run(*base, "--data", str(DATA), "--repeats", "4")
    assert greedy.returncode == 2
    assert "--temperature: Value error, --repeats 4 at temperature 0 repeats one greedy answer" in greedy.stderr
    endpoint = _run(*base[:1], "http://127.0.0.1:9/v1/chat/completions", *base[2:], "--data", str(DATA))
    assert endpoint.returncode == 2 and "is an endpoint: pass the base" in endpoint.stderr
    missing = _run(*base, "--data", str(tmp_path / "nowhere"))
    assert missing.returncode == 1
    assert missing.stderr.startswith("eval_merged: FileNotFoundError: --data") and missing.stderr.count("\n") == 1


def test_unreachable_server_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "r.json"
    run = _run("--base_url", f"http://127.0.0.1:{port}/v1", "--model", "m", "--data", str(DATA), "--out", str(out))
    assert run.returncode == 1
    (error,) = [line for line in run.stderr.splitlines() if line.startswith("eval_merged:")]
    assert error.startswith("eval_merged: ConnectionError:") and f"port={port}" in error
    assert "/v1/chat/completions" in error
    assert not out.exists()


@pytest.mark.llm
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_runs_against_the_embedded_model(embedded_llm: Any, tmp_path: Path, api: str) -> None:
    """The real llama.cpp server, both endpoints: two problems, two short sampled answers each."""
    out = tmp_path / "results.json"
    run = _run(
        "--base_url",
        embedded_llm.base_url,
        "--model",
        embedded_llm.model_name,
        "--data",
        str(DATA),
        "--api",
        api,
        "--limit",
        "2",
        "--repeats",
        "2",
        "--temperature",
        "0.8",
        "--max_tokens",
        "24",
        "--concurrency",
        "2",
        "--out",
        str(out),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["problems"] == 2 and [p["id"] for p in result["per_problem"]] == ["0", "1"]
    for problem in result["per_problem"]:
        assert len(problem["answers"]) == 2 and all(isinstance(a, str) for a in problem["answers"])
        assert 0 <= problem["correct"] <= 2
    assert 0.0 <= result["pass@1"] <= result["pass@2"] <= 1.0
    assert result["lm_eval"]["results"]["sample_len"] == 2
