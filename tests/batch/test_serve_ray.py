"""`serve` on a real multi-node Ray cluster on this machine: two env workers (Ray actors, one
`serve` process each) register with atroposlib's real run-api and feed a trainer polling /batch.
One worker's node is removed without warning mid-run: the worker is replaced on another node, the
trainer keeps receiving whole groups until its steps are done, and every worker's serve ends.
"""

from __future__ import annotations

from tests.support.embedded import embedded_tokenizer
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from ray.cluster_utils import Cluster

from environments.serve_ray import parse_args
from tests.batch.conftest import DRIVER_ENV, NODE
from tests.support.run_api import ROOT, register_trainer, start_run_api, stop_process
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread

STEPS = 6
STARTED = re.compile(r"worker (\d) started on node (\w+) \(actor pid \d+, serve pid (\d+)\)")


def serve_ray_command(cluster: Cluster, api_url: str, server: ScriptedOpenAIServer) -> list[str]:
    return [
        sys.executable,
        "-m",
        "environments.serve_ray",
        "--ray",
        cluster.address,
        "--workers",
        "2",
        "--env_module",
        "tests.support.tiny_env",
        "--",
        "--env.rollout_server_url",
        api_url,
        "--env.wandb_name",
        "serve-ray",
        "--openai.base_url",
        server.base_url,
        "--openai.model_name",
        "scripted",
        "--env.tokenizer_name",
        embedded_tokenizer(),
        "--env.group_size",
        "2",
        "--env.max_num_workers",
        "1",
        "--env.ensure_scores_are_not_same=false",
        "--env.runtime.loop.max_turns",
        "2",
    ]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_worker_node_removed_mid_serve_is_replaced_and_the_trainer_gets_its_steps(
    tmp_path: Path, cluster: Cluster
) -> None:
    api, api_url = start_run_api(tmp_path)
    log = tmp_path / "serve_ray.log"
    driver = None
    batches: list[list[dict[str, Any]]] = []
    try:
        register_trainer(api_url, tmp_path / "ckpt", batch_size=2, num_steps=STEPS)
        # Latency keeps a group in flight on each worker when a node goes.
        with serving_in_a_thread(ScriptedOpenAIServer([{"content": "Done."}] * 1000, delay_s=0.3)) as server:
            with log.open("wb") as f:
                driver = subprocess.Popen(
                    serve_ray_command(cluster, api_url, server), cwd=ROOT, env=DRIVER_ENV, stderr=f
                )
            victim = None
            deadline = time.monotonic() + 600  # a guard against a hang, not a speed check
            while len(batches) < STEPS:
                assert driver.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                batch = httpx.get(api_url + "/batch", timeout=10).json().get("batch")
                if batch:
                    batches.append(batch)
                started = STARTED.findall(log.read_text())
                if victim is None and batches and len(started) == 2:
                    killed_after = len(batches)
                    victim_slot, victim_node, victim_serve = started[0]
                    victim = next(n for n in cluster.worker_nodes if n.node_id == victim_node)
                    cluster.add_node(**NODE, num_cpus=1)  # room for the replacement
                    cluster.remove_node(victim, allow_graceful=False)  # every process of the node killed
                if not batch:
                    time.sleep(0.3)
            driver.wait(timeout=300)  # the trainer is done: every serve ends, then the driver
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
            driver.wait()
        stop_process(api)
    text = log.read_text()
    assert driver.returncode == 0, text[-3000:]
    assert victim is not None and killed_after < STEPS  # the node went mid-run
    assert f"worker {victim_slot} lost: its actor or node died" in text, text[-3000:]
    restarted = [node for slot, node, _ in STARTED.findall(text) if slot == victim_slot]
    assert len(restarted) == 2 and restarted[1] != victim.node_id  # replaced, on another node
    assert text.count("done: serve exited 0") == 2
    with pytest.raises(ProcessLookupError):  # the lost worker's serve died with it: no orphan posting groups
        os.kill(int(victim_serve), 0)
    # Each serve process registered itself with run-api: the two first workers and the replacement.
    assert (tmp_path / "run-api.log").read_text().count("POST /register-env") == 3
    # The trainer took all its steps, in whole groups only: nothing half-sent by the lost worker.
    groups = [g for b in batches for g in b]
    assert len(batches) == STEPS and all(len(g["tokens"]) == len(g["masks"]) == 2 for g in groups)


def test_serve_ray_flags_are_typed_and_strict(capsys: pytest.CaptureFixture[str]) -> None:
    config = parse_args(["--ray", "local", "--workers", "3", "--env_module", "m", "--", "--env.group_size", "4"])
    assert config.ray.address == "local" and config.ray.workers == 3
    assert config.env_module == "m" and config.serve_args == ["--env.group_size", "4"]
    with pytest.raises(SystemExit):
        parse_args(["--ray", "local", "--env_module", "m"])
    assert "the env's serve flags go after --" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--ray", "local", "--env_module", "m", "--wrokers", "2", "--"])
    with pytest.raises(SystemExit):
        parse_args(["--ray", "local", "--workers", "0", "--env_module", "m", "--"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_serve_flags_the_env_refuses_stop_the_run_without_restarts(tmp_path: Path, cluster: Cluster) -> None:
    with serving_in_a_thread(ScriptedOpenAIServer([])) as server:
        args = [*serve_ray_command(cluster, "http://127.0.0.1:9", server), "--env.group_sise", "2"]
        result = subprocess.run(args, cwd=ROOT, env=DRIVER_ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "lost" not in result.stderr  # no worker was restarted
    line = next(x for x in result.stderr.splitlines() if x.startswith("error: "))
    assert line.startswith("error: worker ") and "serve refused its flags or config (exit 2)" in line
    assert "group_sise" in line  # the env's own error, in the driver's line
