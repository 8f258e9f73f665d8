"""batch_runner's command line is the env commands' grammar over one BatchConfig that embeds the env's
RuntimeConfig: `--config run.yaml` (here on the docker backend), `--a.b` flags, did-you-mean, and the old
flag names working for one release with a one-line notice each."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from batch_runner import parse_args
from environments.cli_parse import CliError
from tests.batch.batch_helpers import agent_policy, lines, write_prompts
from tests.support.docker_engine import ENGINE, TEST_LABEL
from tests.support.scripted_openai import ScriptedOpenAIServer, tool_call

ROOT = Path(__file__).resolve().parents[2]


async def run_batch_runner(*argv: str) -> tuple[int, str]:
    """batch_runner.py as a user runs it (its own process), while the scripted server answers here."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "batch_runner.py",
        *argv,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=600)
    return proc.returncode or 0, err.decode()


def hostname_policy(body: dict[str, Any]) -> dict[str, Any]:
    """First the python tool reads the machine's /etc/hostname, then the answer repeats what it printed."""
    messages = body["messages"]
    if messages[-1]["role"] == "user":
        return {"content": None, "tool_calls": [tool_call("python", {"code": "print(open('/etc/hostname').read())"})]}
    return {"content": "host " + json.loads(messages[-1]["content"])["output"].strip()}


async def test_config_yaml_runs_a_batch_on_the_docker_backend(
    docker_sandbox_image, docker_test_id, tmp_path: Path
) -> None:
    dataset = write_prompts(
        tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"Where do you run, {i}?"} for i in range(2)]
    )
    async with ScriptedOpenAIServer([hostname_policy] * 4) as server:
        run = {
            "dataset_file": str(dataset),
            "run_name": "docker",
            "output_dir": str(tmp_path / "runs"),
            "model": "scripted",
            "base_url": server.base_url,
            "distribution": "math",
            "runtime": {
                "loop": {"max_turns": 2},
                "sandbox": {
                    "backend": {
                        "kind": "docker",
                        "engine": ENGINE,
                        "image": docker_sandbox_image.image,  # debian:bookworm + python3 (tests/support)
                        "runtime_dir": str(docker_sandbox_image.runtime_dir),
                        "pull": "never",
                        "labels": {TEST_LABEL: docker_test_id},
                        "pool": {"slots_per_sandbox": 2, "min_sandboxes": 1, "max_sandboxes": 1},
                    }
                },
            },
        }
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
        code, err = await run_batch_runner("--config", str(tmp_path / "run.yaml"), "--concurrency", "2")
    assert code == 0, err[-3000:]
    assert "is now" not in err  # no old names in this run
    records = lines(tmp_path / "runs/docker/trajectories.jsonl")
    assert sorted(r["prompt_id"] for r in records) == ["q0", "q1"]
    here = Path("/etc/hostname").read_text().strip()
    for r in records:
        # The python tool ran in a container of the image: its /etc/hostname is the container's, not this machine's.
        there = r["final_response"].removeprefix("host ")
        assert there and there != here and r["final_response"].startswith("host ")
    saved = json.loads((tmp_path / "runs/docker/run_config.json").read_text())
    assert saved["runtime"]["sandbox"]["backend"]["kind"] == "docker" and saved["concurrency"] == 2


async def test_old_flags_still_work_each_with_a_one_line_notice(tmp_path: Path) -> None:
    dataset = write_prompts(tmp_path / "p.jsonl", [{"id": "q", "prompt": "How long is this?"}])
    async with ScriptedOpenAIServer([agent_policy()] * 2) as server:
        code, err = await run_batch_runner(
            "--dataset_file", str(dataset), "--run_name", "old", "--output_dir", str(tmp_path / "runs"),
            "--model", "scripted", "--base_url", server.base_url, "--distribution", "math",
            "--max_turns", "1", "--request_retries", "0", "--tool_backend", "sandbox",
        )  # fmt: skip
    assert code == 0, err[-3000:]
    notices = [line for line in err.splitlines() if "is now" in line]
    assert notices == [
        "[hermes-rl] --max_turns is now --runtime.loop.max_turns; the old name is removed in the next release",
        "[hermes-rl] --request_retries is now --runtime.model_max_retries; the old name is removed in the next release",
        "[hermes-rl] --tool_backend is now --runtime.tool_backend; the old name is removed in the next release",
    ]
    saved = json.loads((tmp_path / "runs/old/run_config.json").read_text())["runtime"]
    assert (saved["loop"]["max_turns"], saved["model_max_retries"]) == (1, 0)
    (record,) = lines(tmp_path / "runs/old/trajectories.jsonl")
    assert (
        record["stop_reason"] == "max_turns" and record["turns"] == 1
    )  # one model call (a tool call), then the limit: the flag held


def test_flags_override_the_yaml_and_every_key_is_checked(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"dataset_file": "d.jsonl", "run_name": "r", "runtime": {"loop": {"max_turns": 3}}}))
    config = parse_args(
        ["--config", str(run), "--runtime.loop.max_turns", "5", "--runtime.tool_limits.max_timeout_s", "9"]
    )
    assert (config.runtime.loop.max_turns, config.runtime.tool_limits.max_timeout_s) == (5, 9.0)
    assert config.runtime.loop.temperature == 0.7  # the rest of the nested section keeps its defaults

    run.write_text(yaml.safe_dump({"dataset_file": "d.jsonl", "run_name": "r", "runtime": {"loop": {"max_turn": 3}}}))
    with pytest.raises(
        CliError, match=r"unknown key runtime\.loop\.max_turn in .*did you mean runtime\.loop\.max_turns\?"
    ):
        parse_args(["--config", str(run)])
    with pytest.raises(CliError, match=r"unknown flag --concurency; did you mean --concurrency\?"):
        parse_args(["--dataset_file", "d", "--run_name", "r", "--concurency", "2"])
    with pytest.raises(CliError, match=r"--runtime\.sandbox\.backend\.pool\.max_sandboxes: .*greater than or equal"):
        parse_args(["--dataset_file", "d", "--run_name", "r", "--runtime.sandbox.backend.pool.max_sandboxes", "0"])
    with pytest.raises(CliError, match="--runtime.loop.max_turns given twice"):
        parse_args(["--dataset_file", "d", "--run_name", "r", "--max_turns", "2", "--runtime.loop.max_turns", "3"])
