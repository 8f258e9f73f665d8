"""atroposlib's real `run-api` as a process, and the calls a trainer makes to it.

Shared by the serve, Tinker and training tests: start it on a free port, wait until it answers,
register a trainer the way tinker-atropos and atropos's example trainer do, stop it and its children.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
RUN_API = Path(sys.executable).with_name("run-api")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_process(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    # Own process group, so stop_process() ends the command and everything it started.
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(15)


def start_run_api(log_dir: Path, wait_s: float = 120) -> tuple[subprocess.Popen[bytes], str]:
    """run-api on a free port, answering `GET /`; returns (process, base URL)."""
    port = free_port()
    api_url = f"http://127.0.0.1:{port}"
    log = log_dir / "run-api.log"
    api = start_process([str(RUN_API), "--host", "127.0.0.1", "--port", str(port)], log)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if httpx.get(api_url + "/", timeout=2).status_code == 200:
                return api, api_url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or api.poll() is not None:
            stop_process(api)
            raise AssertionError(f"run-api did not come up: {log.read_text()[-2000:]}")
        time.sleep(0.5)


def register_trainer(
    api_url: str, checkpoint_dir: Path, *, batch_size: int, num_steps: int, max_token_len: int = 4096
) -> None:
    """What a trainer (tinker-atropos, atropos's example trainer) sends to /register."""
    reg = httpx.post(
        api_url + "/register",
        json={
            "wandb_group": "test",
            "wandb_project": "hermes-rl",
            "batch_size": batch_size,
            "max_token_len": max_token_len,
            "checkpoint_dir": str(checkpoint_dir),
            "save_checkpoint_interval": 100,
            "starting_step": 0,
            "num_steps": num_steps,
        },
        timeout=10,
    )
    assert reg.status_code == 200 and "uuid" in reg.json(), reg.text


def wait_for_batch(
    api_url: str, env: subprocess.Popen[bytes], log: Path, *, timeout_s: float = 600, exit_ok: bool = True
) -> list[dict]:
    """Poll run-api's `/batch` the way a trainer does until a batch comes; fail with the env's log tail
    if the env dies first (or exits at all, unless `exit_ok`: a finished `serve` exits 0) or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = env.poll() is None or (exit_ok and env.returncode == 0)
        assert alive, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        batch = httpx.get(api_url + "/batch", timeout=10).json().get("batch")
        if batch is not None:
            return batch
        time.sleep(1)
