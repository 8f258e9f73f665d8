"""A policy learning through the project on CPU: GRPO on the embedded model, closed loop, held-out eval.

    python -m bench.learn --steps 6 --out runs/learn

1. Held-out reward before: the env's `evaluate` (its eval items, never trained on) against the
   embedded weights served in float32, `--repeats` times (the spread is the eval's noise).
2. Training: run-api, `training.grpo --sync embedded` (the trainer serves the policy it trains
   and restarts its server with each step's weights) and `bench.learn_env serve` sampling from it.
3. Held-out reward after: the same evaluation against the last weights the trainer served.
4. The reward per step (the mean score of each batch) as a PNG; the numbers as JSON.

The task is bench/learn_env.py (GSM8k prompts, reward for a brief final answer).
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, Field

from bench.machine import load_note
from embedded_llm import EmbeddedLLM, EmbeddedLLMConfig
from training.cli import parse_config

ROOT = Path(__file__).resolve().parents[1]


class LearnConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    out: Path = Field(Path("runs/learn"), description="trainer output, logs, learn.json, learn.png")
    png: Path | None = Field(None, description="where the curve goes (default OUT/learn.png)")
    steps: int = Field(6, ge=1, description="GRPO steps (one group each)")
    lr: float = Field(5e-5, gt=0, description="AdamW learning rate")
    group_size: int = Field(4, ge=2)
    max_tokens: int = Field(48, ge=8, description="tokens per reply (one turn)")
    eval_size: int = Field(8, ge=1, description="held-out problems per evaluation")
    repeats: int = Field(3, ge=1, description="evaluations before and after (their spread is the noise)")
    threads: int = Field(1, ge=1, description="llama.cpp threads per server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    print("$ " + shlex.join(cmd), flush=True)
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _env_flags(c: LearnConfig, base_url: str, tokenizer: Path) -> list[str]:
    return [
        "--openai.base_url",
        base_url,
        "--openai.model_name",
        "policy",
        "--openai.api_key",
        "local",
        "--env.tokenizer_name",
        str(tokenizer),
        "--env.runtime.token_server",
        "llamacpp",
        "--env.runtime.loop.max_turns",
        "1",
        "--env.runtime.loop.max_tokens",
        str(c.max_tokens),
        "--env.group_size",
        str(c.group_size),
        "--env.eval_size",
        str(c.eval_size),
    ]


def evaluate(c: LearnConfig, gguf: Path, tag: str) -> list[float]:
    """Held-out mean reward, `repeats` times, with `gguf` served in float32."""
    config = EmbeddedLLMConfig(model_path=gguf, model_name="policy", threads=c.threads, n_parallel=4)
    scores = []
    with EmbeddedLLM(config) as llm:
        for i in range(c.repeats):
            log = c.out / f"eval_{tag}_{i}.log"
            cmd = [sys.executable, "-m", "bench.learn_env", "evaluate", *_env_flags(c, llm.base_url, llm.tokenizer_dir)]
            cmd += ["--env.data_dir_to_save_evals", str(c.out / f"eval_{tag}_{i}")]
            proc = _start(cmd, log)
            if proc.wait() != 0:
                raise SystemExit(f"learn: evaluation failed; see {log}")
            found = re.findall(r"'eval/accuracy': ([0-9.eE+-]+)", log.read_text())
            if not found:
                raise SystemExit(f"learn: no eval/accuracy in {log}")
            scores.append(float(found[-1]))
            print(f"[learn] held-out reward {tag} #{i + 1}: {scores[-1]:.4f}", flush=True)
    return scores


def train(c: LearnConfig, tokenizer: Path) -> list[dict[str, float]]:
    api_port, serve_port = _free_port(), _free_port()
    api_url = f"http://127.0.0.1:{api_port}"
    grpo_out = c.out / "grpo"
    api = _start(
        [str(Path(sys.executable).with_name("run-api")), "--host", "127.0.0.1", "--port", str(api_port)],
        c.out / "api.log",
    )
    procs = [api]
    try:
        while True:
            try:
                if httpx.get(api_url + "/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        grpo = _start(
            [sys.executable, "-m", "training.grpo", "--api_url", api_url, "--model", "embedded", "--out", str(grpo_out),
             "--steps", str(c.steps), "--batch_size", str(c.group_size), "--lr", str(c.lr), "--sync", "embedded",
             "--serve_port", str(serve_port), "--serve_threads", str(c.threads), "--torch_threads", "1"],
            c.out / "grpo.log",
        )  # fmt: skip
        procs.append(grpo)
        serve = _start(
            [sys.executable, "-m", "bench.learn_env", "serve", "--env.rollout_server_url", api_url,
             "--env.runtime.loop.temperature", "1.0",
             "--env.data_path_to_save_groups", str(c.out / "groups.jsonl"),
             *_env_flags(c, f"http://127.0.0.1:{serve_port}/v1", tokenizer)],
            c.out / "serve.log",
        )  # fmt: skip
        procs.append(serve)
        while grpo.poll() is None:
            if serve.poll() not in (None, 0):  # the trainer would wait for batches that never come
                raise SystemExit(f"learn: serve failed; see {c.out / 'serve.log'}")
            time.sleep(2)
        if grpo.returncode != 0:
            raise SystemExit(f"learn: the trainer failed; see {c.out / 'grpo.log'}")
        serve.wait(600)
    finally:
        for p in reversed(procs):
            _stop(p)
    return [json.loads(line) for line in (grpo_out / "metrics.jsonl").read_text().splitlines()]


def plot(metrics: list[dict[str, float]], before: list[float], after: list[float], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3), dpi=100)
    ax.plot([m["step"] for m in metrics], [m["mean_score"] for m in metrics], marker="o", label="batch reward")
    ax.axhline(statistics.mean(before), color="grey", linestyle="--", label="held-out before")
    ax.axhline(statistics.mean(after), color="green", linestyle="--", label="held-out after")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    ax.set_title("SmolLM2-135M, closed loop on CPU")
    ax.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)


def main(argv: list[str] | None = None) -> int:
    from training.models import embedded_float_gguf

    c = parse_config(LearnConfig, argv, "python -m bench.learn")
    c.out.mkdir(parents=True, exist_ok=True)
    print("$ python -m bench.learn " + shlex.join(argv if argv is not None else sys.argv[1:]), flush=True)
    print(load_note(), flush=True)  # rewards do not depend on load; the step times printed do
    base = embedded_float_gguf()
    tokenizer = EmbeddedLLM(EmbeddedLLMConfig(model_path=base)).tokenizer_dir
    before = evaluate(c, base, "before")
    metrics = train(c, tokenizer)
    after = evaluate(c, c.out / "grpo" / "policy.F32.gguf", "after")
    noise = max(max(before) - min(before), max(after) - min(after))
    margin = statistics.mean(after) - statistics.mean(before)
    result = {
        "config": json.loads(c.model_dump_json()),
        "reward_per_step": [m["mean_score"] for m in metrics],
        "held_out_before": before,
        "held_out_after": after,
        "margin": margin,
        "noise": noise,
        "learned": margin > noise,
    }
    (c.out / "learn.json").write_text(json.dumps(result, indent=1))
    plot(metrics, before, after, c.png or c.out / "learn.png")
    print(f"[learn] {json.dumps({k: v for k, v in result.items() if k != 'config'})}", flush=True)
    print(load_note(), flush=True)
    return 0 if result["learned"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
