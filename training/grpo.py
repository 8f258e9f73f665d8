"""A small reference GRPO trainer: registers with Atropos run-api, pulls `/batch`, takes steps.

    run-api --host 127.0.0.1 --port 8000 &       # atroposlib's rollout API (its default host is 0.0.0.0)
    python -m training.grpo --api_url http://127.0.0.1:8000 --model embedded --out runs/grpo --steps 1 &
    python -m environments.gsm8k_agent_env serve --env.rollout_server_url http://127.0.0.1:8000

With `--sync embedded --serve_port P` the trainer also serves the policy it trains (training.sync):
point the env at it with `--openai.base_url http://127.0.0.1:P/v1 --env.runtime.token_server llamacpp`.

It proves the data path end to end and is a template; real training stays on Atropos or Tinker
trainers. One step, for every sequence of a batch:

- advantage: the rollout's score normalised within its group ((s - mean) / (std + eps)) over
  rollouts, not sequences: when `group_overrides.sequence_rollouts` says that several sequences
  are one rollout (a template that is not append-only), they share one advantage and count once
  in the baseline (docs/trainers.md); per-token `advantages` sent with a group are used as given;
- ratio: exp(new logprob - inference logprob) per trained token, new logprobs computed in the
  distribution the group's sampling record names (training.groups.LogprobSemantics);
- loss: PPO's clipped objective, averaged over all trained tokens of the batch; a position
  trains exactly where its mask is not -100, and trained positions without a logprob (the
  1.0 marker) are left out and counted.

Logged per step (stdout and OUT/metrics.jsonl): loss, KL(inference || new) by the k3
estimator, mean |new - inference| before the update, tokens, gaps. Each batch is kept in
OUT/batches.jsonl (readable by training.check_logprobs); the weights are saved to OUT at the end.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from embedded_llm import EmbeddedLLMError
from training.cli import parse_config, run_or_report
from training.groups import IGNORE, NOT_SAMPLED, Group, parse_groups

__all__ = [
    "GRPOConfig",
    "RunApiClient",
    "SequenceInputs",
    "StepStats",
    "sequence_inputs",
    "rollout_advantages",
    "policy_loss",
    "train_step",
    "run",
    "main",
]


class GRPOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_url: str = Field("http://127.0.0.1:8000", description="Atropos run-api")
    model: str = Field("embedded", description="'embedded' (the bundled GGUF, dequantized) or an HF checkpoint dir")
    out: Path = Field(Path("runs/grpo"), description="where the weights, metrics.jsonl and batches.jsonl go")
    steps: int = Field(1, ge=1, description="training steps (one /batch each)")
    batch_size: int = Field(
        4, ge=1, description="sequences per batch (run-api's batch_size); at least an env's group_size"
    )
    max_token_len: int = Field(4096, ge=1, description="longest sequence, told to run-api")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate")
    clip_eps: float = Field(0.2, gt=0, description="PPO clip range of the importance ratio")
    weight_decay: float = Field(0.0, ge=0)
    batch_timeout_s: float = Field(1800, gt=0, description="give up when no batch arrives for this long")
    poll_interval_s: float = Field(1.0, gt=0)
    wandb_project: str = Field("hermes-rl", description="sent at registration (run-api requires it)")
    wandb_group: str = Field("grpo-reference", description="sent at registration (run-api requires it)")
    sync: Literal["none", "embedded"] = Field(
        "none",
        description="'embedded': serve the policy being trained from a llama.cpp server this trainer owns "
        "(float32 GGUF, restarted with the new weights after every step; training.sync)",
    )
    serve_port: int = Field(0, ge=0, le=65535, description="--sync embedded: the server's port (0: a free one)")
    serve_threads: int = Field(1, ge=1, description="--sync embedded: llama.cpp threads")
    serve_parallel: int = Field(4, ge=1, description="--sync embedded: concurrent request slots")
    torch_threads: int = Field(
        0, ge=0, description="torch's CPU threads (0: torch's default); 1 keeps a shared machine's cores for the server"
    )


class RunApiClient:
    """The trainer side of run-api: POST /register, then GET /batch until one is ready."""

    def __init__(self, config: GRPOConfig, http: httpx.AsyncClient) -> None:
        self.config = config
        self.http = http

    async def register(self) -> str:
        c = self.config
        response = await self.http.post(
            f"{c.api_url}/register",
            json={
                "wandb_group": c.wandb_group,
                "wandb_project": c.wandb_project,
                "batch_size": c.batch_size,
                "max_token_len": c.max_token_len,
                "checkpoint_dir": str(c.out),
                "save_checkpoint_interval": c.steps,
                "starting_step": 0,
                "num_steps": c.steps,
            },
        )
        response.raise_for_status()
        return str(response.json()["uuid"])

    async def next_batch(self) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.config.batch_timeout_s
        while True:
            response = await self.http.get(f"{self.config.api_url}/batch")
            response.raise_for_status()
            batch = response.json().get("batch")
            if batch:
                return batch
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no batch from {self.config.api_url} within {self.config.batch_timeout_s:.0f} s; "
                    "is an env serving into it (`serve --env.rollout_server_url ...`)?"
                )
            await asyncio.sleep(self.config.poll_interval_s)


@dataclass
class SequenceInputs:
    """One sequence, ready for the loss: which positions train, against which logprobs."""

    tokens: list[int]
    trained: list[bool]  # mask != -100 and a logprob exists (position 0 never: no context)
    old_logprobs: list[float]  # 0.0 where not trained
    advantages: list[float]
    gaps: int  # trained by the mask, but no logprob to form a ratio with


def rollout_advantages(group: Group) -> list[float]:
    """One advantage per sequence: its rollout's score, normalised over the group's rollouts."""
    rollouts = group.sequence_rollouts or list(range(len(group.scores)))
    per_rollout = dict(zip(rollouts, group.scores))  # a rollout's sequences share its score
    scores = list(per_rollout.values())
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
    return [(per_rollout[r] - mean) / (std + 1e-6) for r in rollouts]


def sequence_inputs(group: Group) -> list[SequenceInputs]:
    if group.inference_logprobs is None:
        raise ValueError(f"{group.source}: GRPO needs inference_logprobs; serve with a token server")
    advantage = rollout_advantages(group)
    out = []
    for i, (tokens, masks, logprobs) in enumerate(zip(group.tokens, group.masks, group.inference_logprobs)):
        if any(m not in (IGNORE, tok) for tok, m in zip(tokens, masks)):
            raise ValueError(f"{group.source}: sequence {i} has a mask that is neither -100 nor its token id")
        sampled = [m != IGNORE and t > 0 for t, m in enumerate(masks)]
        has_lp = [lp is not None and lp < NOT_SAMPLED for lp in logprobs]
        trained = [s and h for s, h in zip(sampled, has_lp)]
        if group.advantages is not None:
            adv = [float(a) for a in group.advantages[i]]
        else:
            adv = [advantage[i]] * len(tokens)
        old = [lp if t else 0.0 for lp, t in zip(logprobs, trained)]
        out.append(SequenceInputs(tokens, trained, old, adv, sum(s and not h for s, h in zip(sampled, has_lp))))
    return out


def policy_loss(new_logprobs: Any, inputs: SequenceInputs, clip_eps: float) -> tuple[Any, dict[str, Any]]:
    """(sum of clipped-objective losses over trained tokens, detached sums for logging)."""
    import torch

    trained = torch.tensor(inputs.trained)
    old = torch.tensor(inputs.old_logprobs, dtype=new_logprobs.dtype)
    adv = torch.tensor(inputs.advantages, dtype=new_logprobs.dtype)
    # Untrained positions are cut out of the graph (not multiplied by 0): their gradient is exactly zero.
    new_t, old_t, adv_t = new_logprobs[trained], old[trained], adv[trained]
    log_ratio = new_t - old_t
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps)
    loss = -torch.minimum(ratio * adv_t, clipped * adv_t).sum()
    with torch.no_grad():
        sums = {
            "kl": (ratio - 1 - log_ratio).sum().item(),  # k3 estimator of KL(inference || new)
            "mismatch": log_ratio.abs().sum().item(),
            "clipped": ((ratio - clipped).abs() > 0).sum().item(),
        }
    return loss, sums


@dataclass
class StepStats:
    step: int
    loss: float
    kl: float
    mismatch: float
    clip_fraction: float
    tokens: int
    gaps: int
    sequences: int
    mean_score: float
    seconds: float


def train_step(model: Any, optimizer: Any, groups: list[Group], config: GRPOConfig, step: int) -> StepStats:
    """One optimizer step over a batch, one sequence at a time (gradients accumulate)."""
    from training.policy import sequence_logprobs

    start = time.monotonic()
    prepared = [(g, s) for g in groups for s in sequence_inputs(g)]
    tokens = sum(sum(s.trained) for _, s in prepared)
    if tokens == 0:
        raise ValueError("the batch has no trained token with a logprob: nothing to learn from")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    totals = {"loss": 0.0, "kl": 0.0, "mismatch": 0.0, "clipped": 0.0}
    for group, inputs in prepared:
        if not any(inputs.trained):
            continue
        new = sequence_logprobs(model, inputs.tokens, group.semantics)
        loss, sums = policy_loss(new, inputs, config.clip_eps)
        (loss / tokens).backward()
        totals["loss"] += loss.item()
        for k, v in sums.items():
            totals[k] += v
    optimizer.step()
    scores = [s for g in groups for s in g.scores]
    return StepStats(
        step,
        totals["loss"] / tokens,
        totals["kl"] / tokens,
        totals["mismatch"] / tokens,
        totals["clipped"] / tokens,
        tokens,
        sum(s.gaps for _, s in prepared),
        len(prepared),
        sum(scores) / len(scores),
        time.monotonic() - start,
    )


async def run(config: GRPOConfig) -> list[StepStats]:
    import torch

    from training.models import copy_tokenizer, load_causal_lm

    from training.sync import PolicyServer

    if config.sync == "embedded" and config.model != "embedded":
        raise ValueError("--sync embedded trains the embedded model: pass --model embedded")
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    config.out.mkdir(parents=True, exist_ok=True)
    server = None
    if config.sync == "embedded":
        server = PolicyServer(config.out, config.serve_port, config.serve_threads, config.serve_parallel)
    # Torch work runs in one worker thread; the event loop stays free for run-api.
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo")
    loop = asyncio.get_running_loop()
    stats: list[StepStats] = []
    try:
        if server is not None:
            url = await loop.run_in_executor(executor, server.start)
            assert server.llm is not None
            print(f"[grpo] serving the policy at {url} (tokenizer {server.llm.tokenizer_dir})", flush=True)
        async with httpx.AsyncClient(timeout=30) as http:
            api = RunApiClient(config, http)
            await api.register()
            # Envs start once the trainer asks for a batch: load the weights while polling.
            loading = loop.run_in_executor(executor, load_causal_lm, config.model)
            for step in range(1, config.steps + 1):
                batch = await api.next_batch()
                if step == 1:
                    model, model_dir = await loading
                    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
                with (config.out / "batches.jsonl").open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"batch": batch}) + "\n")
                groups = list(parse_groups(batch, f"batch {step}"))
                result = await loop.run_in_executor(executor, train_step, model, optimizer, groups, config, step)
                stats.append(result)
                if server is not None:  # the next batches are sampled from this step's weights
                    await loop.run_in_executor(executor, server.publish, model)
                line = json.dumps(asdict(result))
                with (config.out / "metrics.jsonl").open("a", encoding="utf-8") as f:
                    f.write(line + "\n")
                print(f"[grpo] {line}", flush=True)
        await loop.run_in_executor(executor, model.save_pretrained, str(config.out))
        copy_tokenizer(model_dir, config.out)
    finally:
        if server is not None:
            await loop.run_in_executor(executor, server.stop)
        executor.shutdown(wait=True)
    return stats


def main(argv: list[str] | None = None) -> int:
    config = parse_config(GRPOConfig, argv, "python -m training.grpo")
    stats = run_or_report(
        "grpo", lambda: asyncio.run(run(config)), (ValueError, TimeoutError, httpx.HTTPError, EmbeddedLLMError)
    )
    if stats is None:
        return 1
    if not all(math.isfinite(s.loss) for s in stats):
        print("grpo: the loss is not finite", file=sys.stderr)
        return 1
    print(f"[grpo] saved the updated weights to {config.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
