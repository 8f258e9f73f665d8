"""What `serve` says about a posted group is what run-api answered: the real run-api for
`received` (a complete group) and `buffered` (a short one), a server answering 503 for the error
path (run-api itself answers 5xx only when it fails)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from aiohttp import web

from environments.trainer_boundary import SendLedger, post_group
from tests.support.run_api import register_trainer, start_run_api, stop_process


ROOT = Path(__file__).resolve().parents[1]


def _group(n: int, env_id: int) -> dict:
    return {"tokens": [[1, 2, 3]] * n, "masks": [[-100, 2, 3]] * n, "scores": [1.0, 0.0, 0.5][:n], "env_id": env_id}


async def test_received_and_buffered_are_run_apis_own_answers(tmp_path):
    api, url = start_run_api(tmp_path)
    try:
        register_trainer(url, tmp_path / "ckpt", batch_size=2, num_steps=1)
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(url + "/batch")).json()["batch"] is None  # the trainer starts polling
            reg = await http.post(
                url + "/register-env",
                json={"max_token_length": 4096, "desired_name": "t", "weight": 1.0, "group_size": 2},
            )
            env_id = reg.json()["env_id"]
            ledger = SendLedger()
            short = await post_group(http, url + "/scored_data", _group(1, env_id))
            ledger.record(short, 1)
            whole = await post_group(http, url + "/scored_data", _group(2, env_id))
            ledger.record(whole, 2)
            batch = (await http.get(url + "/batch")).json()["batch"]
    finally:
        stop_process(api)
    assert short.status == "buffered" and short.line == "run-api buffered (1 sequences wait for a partner group)"
    assert whole.status == "received" and whole.line == "run-api received"
    assert [len(g["tokens"]) for g in batch] == [2]  # the trainer got the complete group, not the short one
    assert ledger.summary == "1 groups (2 sequences) received by run-api, 1 buffered, 0 not sent"


async def test_a_503_is_an_error_after_bounded_retries_never_sent():
    calls = 0

    async def overloaded(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.Response(status=503, text="overloaded")

    app = web.Application()
    app.router.add_post("/scored_data", overloaded)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # started just above
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await post_group(http, f"http://127.0.0.1:{port}/scored_data", _group(2, 0), backoff_s=0.01)
    finally:
        await runner.cleanup()
    assert calls == 3 and answer.status == "error"
    assert answer.line == "run-api error (after 3 attempts: HTTP 503: overloaded)"
    ledger = SendLedger()
    ledger.record(answer, 2)
    assert ledger.summary.startswith(
        "0 groups (0 sequences) received by run-api, 0 buffered, 1 not sent: 1 x run-api error"
    )


def test_serve_refuses_a_trainer_batch_smaller_than_a_group_before_starting_anything(tmp_path):
    """docs/training.md's path with the trainer's default batch size (2) and the env's group size (4):
    one line, exit 2, before the env registers or its model server starts; nothing written."""
    api, url = start_run_api(tmp_path)
    try:
        register_trainer(url, tmp_path / "ckpt", batch_size=2, num_steps=1)
        assert httpx.get(url + "/batch", timeout=10).json()["batch"] is None  # the trainer polls: envs may register
        out = tmp_path / "out"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "environments.gsm8k_agent_env",
                "serve",
                "--env.rollout_server_url",
                url,
                "--env.group_size",
                "4",
                "--env.data_path_to_save_groups",
                str(out / "g.jsonl"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 2, proc.stderr[-3000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "batches of 2 sequences" in errors[0] and "--batch_size 4" in errors[0]
        assert "Traceback" not in proc.stderr and "registered with" not in proc.stderr
        assert "llama" not in proc.stderr.lower()  # no model server was started
        assert not out.exists()
        # run-api saw no env register: the first env to register now gets id 0
        reg = httpx.post(
            url + "/register-env",
            json={"max_token_length": 4096, "desired_name": "probe", "weight": 1.0, "group_size": 2},
            timeout=10,
        )
        assert reg.json()["env_id"] == 0
    finally:
        stop_process(api)


def test_serve_refuses_a_longer_sequence_than_the_trainer_takes(tmp_path):
    api, url = start_run_api(tmp_path)
    try:
        register_trainer(url, tmp_path / "ckpt", batch_size=4, num_steps=1, max_token_len=1024)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "environments.gsm8k_agent_env",
                "serve",
                "--env.rollout_server_url",
                url,
                "--env.max_token_length",
                "2048",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "at most 1024 tokens" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        stop_process(api)
