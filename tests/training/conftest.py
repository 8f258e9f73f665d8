"""One real data path for the training tests, run once per test run (once across xdist workers).

atroposlib's `run-api` runs as a process; `python -m training.grpo` registers with it and waits
for a batch; the hash-reward GSM8k env serves groups into it from the embedded llama.cpp model
(exact tokens, free sampling at temperature 1); the trainer takes one step and saves its
weights and the batch it trained on; `serve` also saves the groups it sent (free sampling at
temperature 1: the tokens the model itself chose, for the logprob check). A `process` run with a
grammar forcing python tool calls writes groups in the env's JSONL format (for the per-tool SFT
split). All of it runs at once; tests then read what those real processes left behind.

The served groups come from llama.cpp running the embedded weights in
float32 (`embedded_float_gguf`): with the Q4_1 file llama.cpp rounds activations to 8 bits for
its matmuls, which moves logprobs by ~0.04 nats against any float recomputation and would hide
small data-path errors. The grammar run uses the Q4_1 file (the embedded model as shipped).
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import yaml

from tests.tokens.test_phase2_env import TOOL_CALL_GRAMMAR
from embedded_llm import EmbeddedLLM, EmbeddedLLMConfig
from tests.support.embedded import embedded_model_flags, small_group_flags
from tests.support.run_api import start_process, start_run_api, stop_process
from training.models import embedded_float_gguf


@dataclass
class TrainedRun:
    grpo_out: Path  # weights, metrics.jsonl, batches.jsonl
    grpo_log: str
    grpo_returncode: int
    processed: Path  # `process` JSONL of the same env, tool calls forced by a grammar (Q4_1 engine)
    served: (
        Path  # the groups `serve` sent to run-api, as it saved them: free sampling at temperature 1 (float32 engine)
    )


def _env_args(llm, config: Path, out: Path) -> list[str]:
    return [
        "--config",
        str(config),
        *embedded_model_flags(llm),
        "--env.runtime.token_server",
        "llamacpp",
        "--env.runtime.loop.temperature",
        "1.0",
        *small_group_flags(out),
    ]


@contextmanager
def one_thread_llm(model_path: Path) -> Iterator[EmbeddedLLM]:
    """A llama.cpp server on one thread: two of them and the trainer share 2 cores here, and a
    llama.cpp thread without a core of its own slows its server (see EmbeddedLLMConfig.omp_spin_count)."""
    llm = EmbeddedLLM(EmbeddedLLMConfig(model_path=model_path, n_parallel=2, ctx_size=4096, threads=1))
    llm.start()
    try:
        _ = llm.tokenizer_dir
        yield llm
    finally:
        llm.stop()


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, request) -> TrainedRun:
    if not hasattr(request.config, "workerinput"):  # not an xdist worker
        return _run_once(tmp_path_factory.mktemp("trained_run"))
    # Under xdist each worker has its own session: the first to get here runs it, the others wait
    # and read the record (the run directory is shared by this run's workers only).
    shared = tmp_path_factory.getbasetemp().parent
    with open(shared / "trained_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = shared / "trained_run.json"
        if not record.is_file():
            run = _run_once(shared / "trained_run")
            record.write_text(json.dumps({k: str(v) for k, v in asdict(run).items()}))
        fields = json.loads(record.read_text())
    return TrainedRun(
        grpo_out=Path(fields["grpo_out"]),
        grpo_log=fields["grpo_log"],
        grpo_returncode=int(fields["grpo_returncode"]),
        processed=Path(fields["processed"]),
        served=Path(fields["served"]),
    )


def _run_once(tmp: Path) -> TrainedRun:
    tmp.mkdir(exist_ok=True)
    with one_thread_llm(EmbeddedLLMConfig().model_path) as q4_llm, one_thread_llm(embedded_float_gguf()) as float_llm:
        return _trained_run(tmp, q4_llm, float_llm)


def _trained_run(tmp: Path, embedded_llm: EmbeddedLLM, embedded_float_llm: EmbeddedLLM) -> TrainedRun:
    grammar_config, free_config = tmp / "grammar.yaml", tmp / "free.yaml"
    grammar_config.write_text(yaml.safe_dump({"env": {"runtime": {"extra_body": {"grammar": TOOL_CALL_GRAMMAR}}}}))
    free_config.write_text(yaml.safe_dump({"env": {}}))
    env_cmd = [sys.executable, "-m", "tests.training.hash_reward_env"]
    processed, served = tmp / "processed.jsonl", tmp / "served.jsonl"
    grpo_out, grpo_log = tmp / "grpo", tmp / "grpo.log"

    # Everything at once (each server has slots for its runs): the grammar `process` run on the
    # Q4_1 server, and the trainer loading its weights while `serve` samples on the float32 one.
    api, api_url = start_run_api(tmp)
    trainer = env = grammar_run = None
    try:
        grammar_run = start_process(
            [*env_cmd, "process", *_env_args(embedded_llm, grammar_config, processed), "--env.total_steps", "1"],
            tmp / "process.log",
        )
        # lr large enough that one step visibly moves float32 weights.
        trainer = start_process(
            [
                sys.executable,
                "-m",
                "training.grpo",
                "--api_url",
                api_url,
                "--model",
                "embedded",
                "--out",
                str(grpo_out),
                "--steps",
                "1",
                "--batch_size",
                "2",
                "--lr",
                "1e-4",
                "--batch_timeout_s",
                "900",
            ],
            grpo_log,
        )
        env = start_process(
            [
                *env_cmd,
                "serve",
                *_env_args(embedded_float_llm, free_config, served),
                "--env.rollout_server_url",
                api_url,
                "--env.wandb_name",
                "grpo-test",
                "--env.max_num_workers",
                "1",
            ],
            tmp / "env.log",
        )
        for proc, name, log in ((grammar_run, "process", tmp / "process.log"), (trainer, "training.grpo", grpo_log)):
            try:
                proc.wait(1200)
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"{name} did not finish: " + log.read_text()[-3000:] + (tmp / "env.log").read_text()[-3000:]
                )
        assert grammar_run.returncode == 0, (tmp / "process.log").read_text()[-3000:]
    finally:
        for p in (env, trainer, grammar_run, api):
            if p is not None:
                stop_process(p)
    return TrainedRun(grpo_out, grpo_log.read_text(), trainer.returncode, processed, served)
