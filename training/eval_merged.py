"""AIME25 pass@k of a served model (e.g. a merged checkpoint behind vLLM) through lm-evaluation-harness.

    python -m training.eval_merged --base_url http://127.0.0.1:8000/v1 --model merged \
        --data aime25/ --repeats 8 --temperature 0.6 --out results.json

The harness's own `aime25` task (its prompt, stop strings and answer check) runs against the
OpenAI-compatible server at --base_url: `/chat/completions` by default (the server applies the
model's chat template), `/completions` with `--api completions` (the raw "Question: ...\\nAnswer:"
prompt). --data is a local copy of the task's data set, math-ai/aime25, as published: a directory
holding `test.jsonl` with `problem`, `answer`, `id` per line; nothing is downloaded, and no
tokenizer is needed (requests go out as text).

Each problem is asked --repeats times; every answer is scored by the task's checker, so pass@1 is
the share of correct answers averaged over problems and pass@K (K = --repeats) the share of
problems answered correctly at least once. Repeats only differ when sampled: --repeats > 1 needs
--temperature > 0, and each request leaves the seed to the server (the harness would otherwise send
one fixed seed, and a seeded server would repeat itself). --out receives those numbers, each
problem's answers and correct count, and the harness's own result block.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from importlib.resources import files
from math import comb
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from training.cli import parse_config

__all__ = ["EvalConfig", "evaluate", "pass_at_k", "main"]

TASK = "aime25"
_FILTER = "repeats"  # our filter's name: lm-eval keys its metrics "<metric>,<filter>"


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    model: str = Field(description="model name the server serves (vLLM's --served-model-name)")
    data: Path = Field(description="local copy of math-ai/aime25: a directory holding test.jsonl")
    out: Path = Field(description="JSON file for the results")
    repeats: int = Field(1, ge=1, description="answers per problem (pass@1 is averaged over them; pass@K uses all)")
    api: Literal["chat", "completions"] = Field("chat", description="endpoint: /chat/completions or /completions")
    temperature: float = Field(
        0.0, ge=0.0, validate_default=True, description="sampling temperature (the task's default is greedy)"
    )
    max_tokens: int | None = Field(None, ge=1, description="tokens per answer (the task's default is 32768)")
    concurrency: int = Field(1, ge=1, description="requests in flight at once")
    limit: int | None = Field(None, ge=1, description="evaluate only the first N problems")
    timeout_s: int = Field(1800, ge=1, description="seconds one request may take")

    @field_validator("base_url")
    @classmethod
    def _base(cls, v: str) -> str:
        if v.rstrip("/").endswith("/completions"):
            raise ValueError(f"{v} is an endpoint: pass the base, e.g. http://HOST:PORT/v1")
        return v.rstrip("/")

    @field_validator("temperature")
    @classmethod
    def _sampled(cls, v: float, info: ValidationInfo) -> float:
        repeats = info.data.get("repeats", 1)
        if repeats > 1 and v == 0:
            raise ValueError(f"--repeats {repeats} at temperature 0 repeats one greedy answer: pass e.g. 0.6")
        return v

    @property
    def endpoint(self) -> str:
        return self.base_url + ("/chat/completions" if self.api == "chat" else "/completions")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n answers of which c are correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def _score_repeats(doc: dict[str, Any], results: list[list[str]], ks: tuple[int, ...]) -> dict[str, float]:
    """process_results for the task with every repeat kept: the task's own checker on each answer."""
    from lm_eval.tasks.aime.utils import process_results as aime_check

    answers = results[0]
    correct = sum(aime_check(doc, [answer])["exact_match"] for answer in answers)
    return {f"pass@{k}": pass_at_k(len(answers), correct, k) for k in ks}


def _task_spec(config: EvalConfig, ks: tuple[int, ...]) -> dict[str, Any]:
    """The harness's aime25 entry with the dataset and repeat handling overridden.

    A group whose member names the registered task is lm-eval's way to override fields of a
    task while inheriting the rest of its yaml (prompt, target, stop strings, splits).
    """
    return {
        "group": f"hermes_{TASK}",
        "task": [
            {
                "task": TASK,
                "dataset_path": str(config.data),
                "repeats": config.repeats,
                "process_results": partial(_score_repeats, ks=ks),
                "metric_list": [{"metric": f"pass@{k}", "aggregation": "mean", "higher_is_better": True} for k in ks],
                # Every repeat reaches process_results (the default filter keeps only the first).
                "filter_list": [{"name": _FILTER, "filter": [{"function": "take_first_k", "k": config.repeats}]}],
            }
        ],
    }


def _check_data(data: Path) -> None:
    if not data.is_dir():
        raise FileNotFoundError(
            f"--data {data} is not a directory: put math-ai/aime25's test.jsonl in one "
            "(huggingface-cli download math-ai/aime25 --repo-type dataset --local-dir DIR)"
        )
    if not any(p.name.startswith("test") for p in data.iterdir()):
        raise FileNotFoundError(f"--data {data} has no test split file (math-ai/aime25 publishes test.jsonl)")


def evaluate(config: EvalConfig) -> dict[str, Any]:
    """Run the task against the server; return (and write to --out) the results."""
    _check_data(config.data)
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    ks = tuple(sorted({1, config.repeats}))
    # Only the aime tasks' directory is indexed: the full index parses every task yaml (seconds).
    tasks = TaskManager(include_path=str(files("lm_eval.tasks") / "aime"), include_defaults=False)
    model_args: dict[str, Any] = {
        "base_url": config.endpoint,
        "model": config.model,
        "num_concurrent": config.concurrency,
        "timeout": config.timeout_s,
        # Text requests: no tokenizer to fetch, the server tokenizes.
        "tokenizer_backend": None,
        "tokenized_requests": False,
    }
    # The task's stop strings stay; these keys update its generation_kwargs. seed None: see the
    # module docstring (the payload's fixed seed is replaced by null, the server's own sampling).
    gen_kwargs: dict[str, Any] = {"temperature": config.temperature, "do_sample": config.temperature > 0}
    if config.repeats > 1:
        gen_kwargs["seed"] = None
    if config.max_tokens is not None:
        gen_kwargs["max_gen_toks"] = config.max_tokens
    raw = simple_evaluate(
        model="local-chat-completions" if config.api == "chat" else "local-completions",
        model_args=model_args,
        tasks=[_task_spec(config, ks)],
        task_manager=tasks,
        apply_chat_template=config.api == "chat",
        gen_kwargs=gen_kwargs,
        limit=config.limit,
        log_samples=True,
    )
    if raw is None:
        raise RuntimeError("lm-eval returned no results (not the main rank)")
    summary = raw["results"][TASK]
    problems = []
    for sample in sorted(raw["samples"][TASK], key=lambda s: s["doc_id"]):
        answers = sample["filtered_resps"][0]
        problems.append(
            {
                "id": sample["doc"].get("id", sample["doc_id"]),
                "target": sample["target"],
                "correct": round(sample["pass@1"] * len(answers)),
                "answers": answers,
            }
        )
    report = {
        "task": TASK,
        "model": config.model,
        "base_url": config.base_url,
        "api": config.api,
        "data": str(config.data),
        "repeats": config.repeats,
        "temperature": config.temperature,
        "problems": len(problems),
        **{f"pass@{k}": summary[f"pass@{k},{_FILTER}"] for k in ks},
        "per_problem": problems,
        "lm_eval": {"results": summary, "versions": raw.get("versions", {}), "n-samples": raw.get("n-samples", {})},
    }
    config.out.parent.mkdir(parents=True, exist_ok=True)
    config.out.write_text(json.dumps(report, indent=2, default=str))
    return report


def main(argv: list[str] | None = None) -> int:
    config = parse_config(EvalConfig, argv, "python -m training.eval_merged")
    import aiohttp

    try:
        report = evaluate(config)
    except (ValueError, OSError, aiohttp.ClientError) as exc:
        # requests' and aiohttp's connection errors are OSErrors; HTTP statuses raise after retries
        print(f"eval_merged: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    scores = ", ".join(f"pass@{k} {report[f'pass@{k}']:.4f}" for k in sorted({1, config.repeats}))
    print(f"[{TASK}] {report['problems']} problems x {config.repeats} repeats: {scores} -> {config.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
