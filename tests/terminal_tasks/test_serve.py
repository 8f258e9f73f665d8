"""`serve` into atroposlib's real run-api: the oracle's terminal-task groups reach a trainer scored 1.0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_API = Path(sys.executable).with_name("run-api")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(15)


@pytest.mark.slow
def test_serve_with_the_oracle_feeds_run_api(tmp_path):
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}"
    api = _start([str(RUN_API), "--host", "127.0.0.1", "--port", str(port)], tmp_path / "run-api.log")
    env = None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(api_url + "/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and api.poll() is None, (tmp_path / "run-api.log").read_text()[-2000:]
            time.sleep(0.5)
        registration = {
            "wandb_group": "test",
            "wandb_project": "hermes-rl",
            "batch_size": 2,
            "max_token_len": 8192,
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "save_checkpoint_interval": 100,
            "starting_step": 0,
            "num_steps": 10,
        }
        assert httpx.post(api_url + "/register", json=registration, timeout=10).status_code == 200
        env = _start(
            [
                sys.executable,
                "-m",
                "environments.terminal_tasks_env",
                "serve",
                "--env.rollout_server_url",
                api_url,
                "--env.wandb_name",
                "terminal-tasks-test",
                "--env.agent",
                "oracle",
                "--env.group_size",
                "2",
                "--env.max_num_workers",
                "1",
                "--env.ensure_scores_are_not_same",
                "False",
                "--env.data_path_to_save_groups",
                str(tmp_path / "served.jsonl"),
            ],
            tmp_path / "env.log",
        )
        batch = None
        deadline = time.monotonic() + 600
        while batch is None:
            assert env.poll() is None, (tmp_path / "env.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "env.log").read_text()[-3000:]
            batch = httpx.get(api_url + "/batch", timeout=10).json().get("batch")
            if batch is None:
                time.sleep(1)
    finally:
        if env is not None:
            _stop(env)
        _stop(api)
    assert sum(len(g["tokens"]) for g in batch) == 2
    for group in batch:
        assert group["scores"] == [1.0] * len(group["tokens"])
        assert all(len(t) == len(m) for t, m in zip(group["tokens"], group["masks"]))
        user = next(m for m in group["messages"][0] if m["role"] == "user")["content"]
        assert "Working directory: /workspace" in user
