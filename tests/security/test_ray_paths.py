"""The Ray paths under model-controlled text: `batch_runner --ray` (rollout actors -> the driver, the only
writer) and `environments.serve_ray` (actors forwarding each `serve`'s log to the driver).

- what reaches the driver from an actor is the record built by our code: model text inside it is
  data (a multi-MiB answer, JSONL-looking text, line separators, terminal control characters and
  made-up tool names travel byte-exact into one line each; no file appears outside the run's directory;
  nothing the model wrote is printed raw on the driver's terminal);
- a `serve` log line of any length (a log quoting model text) never ends serve_ray's forwarding.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.batch.batch_helpers import write_prompts
from tests.batch.conftest import DRIVER_ENV
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread, tool_call

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
N = 4
ESCAPES = "\x1b]0;retitled by the model\x07\x1b[2J"


def hostile_answer(prompt: str) -> str:
    forged = '"}\n{"prompt_id": "forged", "messages": []}\n'
    return f"{prompt}: " + ("B" * (2 << 20)) + forged + "\u2028\u2029\x85\r" + ESCAPES


def hostile_policy(outside: Path):
    def reply(body: dict[str, Any]) -> Any:
        messages = body["messages"]
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        if messages[-1]["role"] == "user":
            return {
                "content": ESCAPES,
                "tool_calls": [
                    tool_call(str(outside / "tool_named_as_path"), {"path": str(outside / "arg")}),
                    tool_call("python", {"code": f"print({ESCAPES!r} * 3)"}),
                ],
            }
        return {"content": hostile_answer(prompt)}

    return reply


def test_model_text_through_batch_runner_on_ray_is_data(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    dataset = write_prompts(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(N)])
    with serving_in_a_thread(ScriptedOpenAIServer([hostile_policy(outside)] * (4 * N))) as server:
        run = subprocess.run(
            [
                sys.executable, "batch_runner.py", "--dataset_file", str(dataset), "--run_name", "hostile",
                "--output_dir", str(tmp_path / "runs"), "--model", "scripted", "--base_url", server.base_url,
                "--distribution", "math", "--runtime.model_max_retries", "0",
                "--ray.address", "local", "--ray.workers", "1", "--ray.worker_cpus", "0.5", "--concurrency", "2",
            ],
            cwd=ROOT, env=DRIVER_ENV, capture_output=True, timeout=900,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    data = (tmp_path / "runs/hostile/trajectories.jsonl").read_bytes()
    assert data.endswith(b"\n")
    records = [json.loads(line) for line in data.split(b"\n")[:-1]]
    assert sorted(r["prompt_id"] for r in records) == [f"q{i}" for i in range(N)]  # one line each, none forged
    for r in records:
        assert r["final_response"] == hostile_answer(r["prompt"])  # byte-exact
    assert not outside.exists()
    made = {p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*")}
    assert made <= {"p.jsonl", "runs"}
    for out in (run.stderr, run.stdout):  # the model's escapes are not in our output (Ray's own colours may be)
        assert b"\x1b]0;" not in out and b"\x1b[2J" not in out


def test_a_serve_log_line_of_any_length_does_not_end_serve_ray() -> None:
    run = subprocess.run(
        [
            sys.executable, "-m", "environments.serve_ray", "--ray", "local", "--workers", "1",
            "--worker_cpus", "0.5", "--max_restarts", "0", "--env_module", "tests.support.loud_serve", "--", "--x",
        ],
        cwd=ROOT, env=DRIVER_ENV, capture_output=True, timeout=600,
    )  # fmt: skip
    err = run.stderr.decode(errors="replace")
    assert run.returncode == 0, err[-3000:]
    # The long line no longer ends the worker's forwarding (LimitOverrunError ended the run): the worker saw its
    # serve to the end. Its last lines reach the driver through Ray's own log forwarding, which may still be
    # under way when the driver exits (twice missing in CI under load), so "serve done" is not asserted.
    assert "worker 0 done: serve exited 0" in err
    # Control characters from a log are not replayed on the driver's terminal (Ray's own colours may be).
    assert "\x1b]0;" not in err and "\x1b[2J" not in err
