"""batch_runner --ray on a real multi-node Ray cluster on this machine (ray.cluster_utils.Cluster:
a head and worker raylets, all on 127.0.0.1), against the scripted OpenAI server with latency.

A worker node killed without warning mid-run, and a driver killed mid-run then resumed, must
both leave every prompt exactly once in the output: whole lines, no duplicates, nothing missing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.cluster_utils import Cluster

import batch_runner
from environments.cli_parse import CliError
from environments.batch.config import RayConfig
from tests.batch.batch_helpers import agent_policy, write_prompts
from tests.batch.conftest import DRIVER_ENV, NODE
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread

ROOT = Path(__file__).resolve().parents[2]
N = 24


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedOpenAIServer]:
    # Latency keeps every worker busy with prompts in flight when something is killed.
    with serving_in_a_thread(ScriptedOpenAIServer([agent_policy()] * 1000, delay_s=0.15)) as s:
        yield s


def command(tmp_path: Path, cluster: Cluster, server: ScriptedOpenAIServer, run: str, workers: int) -> list[str]:
    dataset = write_prompts(tmp_path / "p.jsonl", [{"id": f"q{i:02d}", "prompt": f"question {i}"} for i in range(N)])
    return [
        sys.executable,
        "batch_runner.py",
        "--dataset_file",
        str(dataset),
        "--run_name",
        run,
        "--output_dir",
        str(tmp_path / "runs"),
        "--model",
        "scripted",
        "--base_url",
        server.base_url,
        "--distribution",
        "math",
        "--runtime.model_max_retries",
        "0",
        "--ray.address",
        cluster.address,
        "--ray.workers",
        str(workers),
        "--concurrency",
        "2",
    ]


def start_driver(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as f:
        return subprocess.Popen(args, cwd=ROOT, env=DRIVER_ENV, stdout=subprocess.DEVNULL, stderr=f)


def wait_until_running(out: Path, proc: subprocess.Popen[bytes], log: Path, workers: int) -> None:
    """Until every worker has started (so each holds prompts) and 3 results are written."""
    deadline = time.monotonic() + 300  # a guard against a hang, not a speed check
    while time.monotonic() < deadline and proc.poll() is None:
        ready = log.read_text().count(" ready on node ")
        if ready >= workers and out.exists() and out.read_bytes().count(b"\n") >= 3:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run ended or stalled before it could be interrupted: {log.read_text()[-3000:]!r}")


def exactly_once(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert data.endswith(b"\n")  # no torn last line
    records = [json.loads(line) for line in data.split(b"\n")[:-1]]
    ids = [r["prompt_id"] for r in records]
    assert sorted(ids) == [f"q{i:02d}" for i in range(N)]  # each prompt, once
    for r in records:  # a whole trajectory whose tool really ran on a worker
        assert r["completed"] and r["final_response"] == f"The answer is {len(r['prompt'])}"
    return records


@pytest.mark.slow
def test_a_worker_node_killed_mid_run_loses_no_prompt_and_duplicates_none(
    tmp_path: Path, cluster: Cluster, server: ScriptedOpenAIServer
) -> None:
    args = command(tmp_path, cluster, server, "nodeloss", workers=2)
    out = tmp_path / "runs/nodeloss/trajectories.jsonl"
    log = tmp_path / "driver.log"
    # Room for the replacement worker, made before the run: adding a node takes seconds on a loaded
    # machine, long enough for the whole run to end before the kill.
    cluster.add_node(**NODE, num_cpus=1)
    proc = start_driver(args, log)
    wait_until_running(out, proc, log, workers=2)
    ready = re.search(r"worker 0 ready on node (\w+)", log.read_text())
    assert ready, log.read_text()[-3000:]
    victim = next(n for n in cluster.worker_nodes if n.node_id == ready.group(1))
    cluster.remove_node(victim, allow_graceful=False)  # every process of the node killed at once
    proc.wait(timeout=600)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert f"worker 0 ready on node {victim.node_id}" in log.read_text() or (
        f"worker 1 ready on node {victim.node_id}" in log.read_text()
    )
    exactly_once(out)
    stats = json.loads((tmp_path / "runs/nodeloss/stats.json").read_text())
    ray_stats = stats["session"]["ray"]
    assert ray_stats["worker_restarts"] >= 1 and ray_stats["rerun_after_worker_loss"] >= 1, ray_stats
    assert ray_stats["duplicates_dropped"] == 0
    assert sum(w.get("done", 0) for w in ray_stats["per_worker"].values()) == N == stats["recorded"]
    assert [e["worker"] for e in ray_stats["worker_events"] if e["event"] == "lost"] == [
        int(w) for w, c in ray_stats["per_worker"].items() if c.get("restarts")
    ]

    before = out.read_bytes()
    resumed = subprocess.run([*args, "--resume"], cwd=ROOT, env=DRIVER_ENV, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert out.read_bytes() == before  # --resume finds nothing left to run
    assert json.loads((tmp_path / "runs/nodeloss/stats.json").read_text())["session"]["ran"] == 0


@pytest.mark.slow
def test_a_killed_driver_resumes_to_exactly_once(
    tmp_path: Path, cluster: Cluster, server: ScriptedOpenAIServer
) -> None:
    args = command(tmp_path, cluster, server, "driverkill", workers=1)  # one worker: one node does it all
    out = tmp_path / "runs/driverkill/trajectories.jsonl"
    log = tmp_path / "driver.log"
    proc = start_driver(args, log)
    wait_until_running(out, proc, log, workers=1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first = out.read_bytes()
    first_whole = first[: first.rfind(b"\n") + 1]
    assert first_whole.count(b"\n") < N

    resumed = subprocess.run([*args, "--resume"], cwd=ROOT, env=DRIVER_ENV, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert out.read_bytes().startswith(first_whole)  # what was recorded before the kill stays as it was
    exactly_once(out)
    stats = json.loads((tmp_path / "runs/driverkill/stats.json").read_text())
    assert stats["recorded"] == N and stats["session"]["ran"] == N - first_whole.count(b"\n")


def test_ray_flags_travel_as_typed_config_and_need_ray() -> None:
    base = ["--dataset_file", "p.jsonl", "--run_name", "r"]
    config = batch_runner.parse_args([*base, "--ray.address", "local", "--ray.workers", "3", "--concurrency", "5"])
    assert config.ray == RayConfig(address="local", workers=3) and config.concurrency == 5
    assert batch_runner.parse_args([*base, "--ray", "local", "--workers", "3", "--concurrency", "5"]) == config
    assert batch_runner.parse_args(base).ray is None
    with pytest.raises(CliError, match="ray.address .*Field required"):
        batch_runner.parse_args([*base, "--ray.workers", "3"])


@pytest.mark.slow
def test_workers_that_cannot_reach_the_model_server_stop_the_run_naming_it(
    tmp_path: Path, cluster: Cluster, server: ScriptedOpenAIServer
) -> None:
    args = command(tmp_path, cluster, server, "unreachable", workers=1)
    dead_url = "http://127.0.0.1:9/v1"  # the discard port: nothing listens
    args[args.index(server.base_url)] = dead_url
    result = subprocess.run(args, cwd=ROOT, env=DRIVER_ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    line = next(x for x in result.stderr.splitlines() if x.startswith("error: "))  # one line, no traceback
    assert line.startswith(f"error: worker 0 failed: cannot reach the model server at {dead_url}")
    assert "check --base_url" in line and "Traceback" not in result.stderr
    assert not (tmp_path / "runs/unreachable/trajectories.jsonl").read_bytes()
