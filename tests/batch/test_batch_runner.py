"""batch_runner against real servers: a scripted OpenAI-compatible server for exact behaviour,
and the embedded llama.cpp model for the SIGKILL/resume exactly-once test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import batch_runner
from batch_runner import BatchConfig, BatchError, load_prompts, run_batch, sample_toolsets
from environments.batch.output import recover_output
from environments.runtime import RuntimeConfig
from tests.batch.batch_helpers import agent_policy, lines, write_prompts
from tests.support.scripted_openai import ScriptedOpenAIServer

ROOT = Path(__file__).resolve().parents[2]


def config(
    tmp_path: Path, dataset: Path, base_url: str | list[str], runtime: dict[str, Any] | None = None, **kw: Any
) -> BatchConfig:
    runtime = runtime or {}
    return BatchConfig(
        dataset_file=dataset,
        run_name="t",
        model="scripted",
        base_url=base_url,
        output_dir=tmp_path / "runs",
        distribution="math",
        retry_backoff_s=0.01,
        **kw,
        runtime=RuntimeConfig(model_max_retries=0, **runtime),
    )


def test_toolset_sampling_is_deterministic_and_never_empty() -> None:
    draws = [sample_toolsets("mixed", f"p{i}", 7) for i in range(200)]
    assert draws == [sample_toolsets("mixed", f"p{i}", 7) for i in range(200)]
    assert all(d and set(d) <= {"terminal", "file", "python", "web"} for d in draws)
    assert len({tuple(d) for d in draws}) > 8  # really sampled
    assert sample_toolsets("math", "x", 0) == ["python"]
    with pytest.raises(BatchError, match="known: .*research"):
        sample_toolsets("nope", "x", 0)


def test_prompt_file_errors_name_the_line(tmp_path: Path) -> None:
    with pytest.raises(BatchError, match=":2 repeats id 'a'"):
        load_prompts(write_prompts(tmp_path / "d.jsonl", [{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}]))
    with pytest.raises(BatchError, match=":1 has no non-empty string 'prompt'"):
        load_prompts(write_prompts(tmp_path / "e.jsonl", [{"text": "x"}]))


async def test_run_records_every_prompt_once_with_stats(tmp_path: Path) -> None:
    prompts = [{"prompt": f"question number {i}" + "?" * i} for i in range(6)]
    dataset = write_prompts(tmp_path / "p.jsonl", prompts)
    async with ScriptedOpenAIServer([agent_policy()] * 12) as server:
        stats = await run_batch(config(tmp_path, dataset, server.base_url, concurrency=3))
    out = lines(tmp_path / "runs/t/trajectories.jsonl")
    assert sorted(r["prompt_id"] for r in out) == [f"line-{i}" for i in range(1, 7)]
    for r in out:
        assert r["completed"] and r["tool_calls"] == {"python": 1} and r["toolsets"] == ["python"]
        assert r["final_response"] == f"The answer is {len(r['prompt'])}"  # the tool really ran
        assert r["messages"][0]["role"] == "system" and r["messages"][2]["tool_calls"]
        assert [t["function"]["name"] for t in r["tools"]] == ["python"]
    assert stats == json.loads((tmp_path / "runs/t/stats.json").read_text())
    assert stats["recorded"] == 6 and stats["missing"] == 0
    assert stats["tools"] == {"python": {"calls": 6, "errors": 0, "error_rate": 0.0}}
    assert stats["turns"]["total"] == 12
    assert stats["tokens"]["prompt_tokens"] == 120 and stats["tokens"]["completion_tokens"] == 60
    assert stats["session"]["recorded"] == 6


async def test_infrastructure_failures_are_retried_never_recorded(tmp_path: Path) -> None:
    dataset = write_prompts(
        tmp_path / "p.jsonl",
        [{"id": "ok", "prompt": "fine"}, {"id": "flaky", "prompt": "flaky"}, {"id": "down", "prompt": "down"}],
    )
    failures = {"flaky": 1, "down": -1}
    async with ScriptedOpenAIServer([agent_policy(failures)] * 50) as server:
        cfg = config(tmp_path, dataset, server.base_url, concurrency=1, rollout_infra_retries=2)
        stats = await run_batch(cfg)
        out = {r["prompt_id"]: r for r in lines(tmp_path / "runs/t/trajectories.jsonl")}
        assert set(out) == {"ok", "flaky"} and out["flaky"]["attempts"] == 2 and out["ok"]["attempts"] == 1
        (failed,) = lines(tmp_path / "runs/t/infra_failures.jsonl")
        assert failed["prompt_id"] == "down" and failed["attempts"] == 3 and "500" in failed["error"]
        assert stats["missing"] == 1 and stats["session"]["retries"] == 3
        # Without --resume an existing run is refused; with it, only the missing prompt runs.
        with pytest.raises(BatchError, match="--resume"):
            await run_batch(cfg)
        failures["down"] = 0  # the server is back
        stats = await run_batch(cfg.model_copy(update={"resume": True}))
    out = lines(tmp_path / "runs/t/trajectories.jsonl")
    assert sorted(r["prompt_id"] for r in out) == ["down", "flaky", "ok"]
    assert stats["missing"] == 0 and stats["session"]["ran"] == 1


async def test_resume_cuts_a_torn_line_and_reruns_that_prompt(tmp_path: Path) -> None:
    dataset = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"prompt {i}"} for i in range(4)])
    async with ScriptedOpenAIServer([agent_policy()] * 8) as server:
        await run_batch(config(tmp_path, dataset, server.base_url, concurrency=2))
    out_path = tmp_path / "runs/t/trajectories.jsonl"
    whole = out_path.read_bytes().splitlines(keepends=True)
    torn_id = json.loads(whole[2])["prompt_id"]
    out_path.write_bytes(b"".join(whole[:2]) + whole[2][: len(whole[2]) // 2])  # killed mid-write
    assert recover_output(out_path) == {json.loads(w)["prompt_id"] for w in whole[:2]}
    assert out_path.read_bytes() == b"".join(whole[:2])
    async with ScriptedOpenAIServer([agent_policy()] * 4) as server:
        stats = await run_batch(config(tmp_path, dataset, server.base_url, resume=True))
    ids = [r["prompt_id"] for r in lines(out_path)]
    assert sorted(ids) == ["p0", "p1", "p2", "p3"] and torn_id in ids[2:]
    assert stats["session"]["ran"] == 2


def test_unreachable_server_fails_fast_with_the_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = write_prompts(tmp_path / "p.jsonl", [{"prompt": "x"}])
    code = batch_runner.main(
        [
            "--dataset_file",
            str(dataset),
            "--run_name",
            "r",
            "--model",
            "m",
            "--base_url",
            "http://127.0.0.1:9/v1",
            "--output_dir",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "cannot reach the model server at http://127.0.0.1:9/v1" in err and "--base_url" in err
    assert not (tmp_path / "r").exists()  # bad input writes nothing: no run directory, no empty output


@pytest.mark.llm
@pytest.mark.slow
def test_sigkill_midway_then_resume_gives_each_prompt_exactly_once(embedded_llm, tmp_path: Path) -> None:
    n = 10
    dataset = write_prompts(
        tmp_path / "p.jsonl", [{"id": f"q{i:02d}", "prompt": f"What is {i} plus {i}?"} for i in range(n)]
    )
    args = [
        sys.executable,
        "batch_runner.py",
        "--dataset_file",
        str(dataset),
        "--run_name",
        "kill",
        "--model",
        embedded_llm.model_name,
        "--base_url",
        embedded_llm.base_url,
        "--api_key",
        "local",
        "--output_dir",
        str(tmp_path / "runs"),
        "--distribution",
        "math",
        "--concurrency",
        "2",
        "--runtime.loop.max_turns",
        "2",
        "--runtime.loop.max_tokens",
        "24",
        "--runtime.loop.temperature",
        "0",
    ]
    out_path = tmp_path / "runs/kill/trajectories.jsonl"
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if out_path.exists() and out_path.read_bytes().count(b"\n") >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"run ended before it could be killed: {proc.communicate()[1][-2000:]!r}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first = out_path.read_bytes()
    first_whole = first[: first.rfind(b"\n") + 1]
    killed_at = first_whole.count(b"\n")
    assert 4 <= killed_at < n

    resumed = subprocess.run([*args, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = out_path.read_bytes()
    assert final.startswith(first_whole)  # what was recorded before the kill is kept as it was
    records = [json.loads(line) for line in final.splitlines()]
    ids = [r["prompt_id"] for r in records]
    assert sorted(ids) == [f"q{i:02d}" for i in range(n)] and len(ids) == n
    assert all(r["model"] == embedded_llm.model_name and r["messages"][1]["role"] == "user" for r in records)
    assert f"[{n}/{n}] done {n - killed_at}" in resumed.stderr  # the progress line
    stats = json.loads((tmp_path / "runs/kill/stats.json").read_text())
    assert stats["recorded"] == n and stats["session"]["ran"] == n - killed_at
    assert stats["tokens"]["completion_tokens"] > 0


async def test_a_server_that_stays_down_stops_the_run(tmp_path: Path) -> None:
    dataset = write_prompts(tmp_path / "p.jsonl", [{"prompt": f"p{i}"} for i in range(30)])
    async with ScriptedOpenAIServer([500] * 100) as server:
        cfg = config(
            tmp_path, dataset, server.base_url, concurrency=1, rollout_infra_retries=1, max_consecutive_infra_failures=3
        )
        with pytest.raises(BatchError, match="3 prompts in a row .*HTTP 500.*--resume"):
            await run_batch(cfg)
    assert len(lines(tmp_path / "runs/t/infra_failures.jsonl")) == 3
    assert not (tmp_path / "runs/t/trajectories.jsonl").read_bytes()
    async with ScriptedOpenAIServer([agent_policy()] * 60) as server:
        stats = await run_batch(config(tmp_path, dataset, server.base_url, resume=True, concurrency=4))
    assert stats["recorded"] == 30 and stats["missing"] == 0


async def test_progress_is_live_on_a_terminal_and_quiet_in_logs() -> None:
    import asyncio
    import io

    from environments.batch.output import Progress, _progress_loop

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream in (Terminal(), io.StringIO()):
        progress = Progress(total=10, already=2)
        ticker = asyncio.create_task(_progress_loop(progress, 0.02, stream))
        await asyncio.sleep(0.2)
        progress.done, progress.failed = 3, 1
        await asyncio.sleep(0.3)
        ticker.cancel()
        out = stream.getvalue()
        if isinstance(stream, Terminal):
            assert out.startswith("\r[2/10] done 0 failed 0") and "\r[5/10] done 3 failed 1 retries 0 |" in out
        else:
            assert out.count("\n") == 1 and out.startswith("[5/10] done 3 failed 1 retries 0 |") and "ETA" in out


async def test_unknown_toolsets_in_the_dataset_fail_before_running(tmp_path: Path) -> None:
    dataset = write_prompts(tmp_path / "p.jsonl", [{"prompt": "x", "toolsets": ["python", "browser"]}])
    with pytest.raises(
        BatchError, match=r"unknown toolsets \['browser'\]; known: \['file', 'python', 'terminal', 'web'\]"
    ):
        await run_batch(config(tmp_path, dataset, "http://127.0.0.1:9/v1"))
    assert not (tmp_path / "runs").exists()


def test_bad_input_on_the_command_line_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown toolset in the dataset, or results already there without --resume: exit 2, one line, no files."""
    dataset = write_prompts(tmp_path / "p.jsonl", [{"prompt": "x", "toolsets": ["browser"]}])
    argv = ["--dataset_file", str(dataset), "--run_name", "r", "--model", "m", "--base_url", "http://127.0.0.1:9/v1"]
    code = batch_runner.main([*argv, "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "unknown toolsets ['browser']" in err
    assert not (tmp_path / "out").exists()
    torn = tmp_path / "old" / "r" / "trajectories.jsonl"  # a run that already has results, without --resume
    torn.parent.mkdir(parents=True)
    torn.write_text('{"prompt_id": "line-1"}\n')
    code = batch_runner.main([*argv, "--output_dir", str(tmp_path / "old")])
    assert code == 2 and "pass --resume" in capsys.readouterr().err
    assert [p.name for p in torn.parent.iterdir()] == ["trajectories.jsonl"]


@pytest.mark.slow
async def test_tools_can_run_in_sandbox_slots(tmp_path: Path) -> None:
    dataset = write_prompts(tmp_path / "p.jsonl", [{"id": f"s{i}", "prompt": f"sandboxed {'y' * i}"} for i in range(4)])
    async with ScriptedOpenAIServer([agent_policy()] * 8) as server:
        stats = await run_batch(
            config(tmp_path, dataset, server.base_url, concurrency=4, runtime={"tool_backend": "sandbox"})
        )
    out = lines(tmp_path / "runs/t/trajectories.jsonl")
    assert sorted(r["prompt_id"] for r in out) == ["s0", "s1", "s2", "s3"]
    assert all(r["final_response"] == f"The answer is {len(r['prompt'])}" for r in out)  # python ran in the slots
    assert stats["tools"]["python"] == {"calls": 4, "errors": 0, "error_rate": 0.0}


async def test_several_servers_share_the_prompts_and_a_killed_one_loses_its_share(tmp_path: Path) -> None:
    """Three --base_urls, one stopped mid-run: every prompt exactly once, the rest on the two left."""
    import asyncio

    n = 48
    dataset = write_prompts(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(n)])
    servers = [ScriptedOpenAIServer([agent_policy()] * (2 * n), delay_s=0.1) for _ in range(3)]
    a, b, c = servers
    for s in servers:
        await s.__aenter__()
    killed_after = 0

    async def kill_c() -> None:
        nonlocal killed_after
        while len(c.requests) < 6:
            await asyncio.sleep(0.02)
        killed_after = len(c.requests)
        await c.__aexit__()

    killer = asyncio.create_task(kill_c())
    try:
        # Backoff past one health probe (1 s): a retry goes to a server known to answer.
        cfg = config(tmp_path, dataset, [s.base_url for s in servers], concurrency=6)
        stats = await run_batch(cfg.model_copy(update={"retry_backoff_s": 1.5}))
        await killer
    finally:
        killer.cancel()
        for s in (a, b):
            await s.__aexit__()
    ids = [r["prompt_id"] for r in lines(tmp_path / "runs/t/trajectories.jsonl")]
    assert sorted(ids) == sorted(f"q{i}" for i in range(n)) and len(ids) == len(set(ids))  # each exactly once
    assert stats["missing"] == 0 and not (tmp_path / "runs/t/infra_failures.jsonl").read_bytes()
    # c answered only until it was stopped; a and b took everything after (2 requests per prompt).
    assert killed_after >= 6 and len(a.requests) + len(b.requests) >= 2 * n - killed_after
    assert min(len(a.requests), len(b.requests)) > n // 2  # shared between the two left, not all on one


def test_base_url_repeats_for_several_servers() -> None:
    args = ["--dataset_file", "d.jsonl", "--run_name", "r", "--model", "m"]
    urls = ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]
    cfg = batch_runner.parse_args([*args, "--base_url", ",".join(urls)])
    assert cfg.base_url == urls and [s.base_url for s in cfg.model_servers()] == urls
    assert batch_runner.parse_args([*args, "--base_url", urls[0], "--base_url", urls[1]]) == cfg  # the old spelling
    assert batch_runner.parse_args(args[:4]).base_url == ["embedded"]
