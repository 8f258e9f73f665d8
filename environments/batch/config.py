"""batch_runner's settings (BatchConfig, RayConfig), its prompt file and toolset distributions."""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from environments.cli_parse import renamed_keys
from environments.gc_tuning import GCConfig
from environments.jsonl import jsonl_lines
from environments.models.chat_mode import PLACEHOLDER_API_KEY
from environments.runtime import EMBEDDED, EMBEDDED_MODEL_NAME, ModelServer, RuntimeConfig

__all__ = [
    "BATCH_RENAMED",
    "BatchConfig",
    "BatchError",
    "DISTRIBUTIONS",
    "Prompt",
    "RayConfig",
    "load_prompts",
    "sample_toolsets",
]

# Probability that each toolset is offered to a prompt. Names are public API (--distribution).
DISTRIBUTIONS: MappingProxyType[str, MappingProxyType[str, float]] = MappingProxyType(
    {
        name: MappingProxyType(dist)
        for name, dist in {
            "default": {"terminal": 1.0, "file": 1.0, "python": 1.0, "web": 1.0},
            "research": {"web": 1.0, "python": 0.6, "file": 0.4},
            "coding": {"terminal": 1.0, "file": 1.0, "python": 0.8},
            "math": {"python": 1.0},
            "mixed": {"terminal": 0.5, "file": 0.5, "python": 0.5, "web": 0.5},
        }.items()
    }
)

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant that can use tools. Call a tool when it helps; when you are done, "
    "answer the user directly."
)


class RayConfig(BaseModel):
    """Where batch_runner's rollout workers run."""

    address: str = Field(
        min_length=1, description="'local' starts a Ray cluster here; else a running cluster's address (HOST:PORT)"
    )
    workers: int = Field(2, ge=1, description="Rollout worker actors; each runs --concurrency prompts at once")
    worker_cpus: float = Field(
        1.0, gt=0, description="CPUs Ray reserves per worker (placement only; the work is mostly waiting)"
    )


# batch_runner's flags before its config embedded the env's RuntimeConfig -> their new names; they still
# work for one release, with a one-line notice (environments/cli_parse.py).
BATCH_RENAMED: dict[str, str] = {
    "max_turns": "runtime.loop.max_turns",
    "max_tokens": "runtime.loop.max_tokens",
    "temperature": "runtime.loop.temperature",
    "time_budget_s": "runtime.loop.time_budget_s",
    "tool_choice": "runtime.loop.tool_choice",
    "first_turn_tool_choice": "runtime.loop.first_turn_tool_choice",
    "request_timeout_s": "runtime.loop.model_timeout_s",
    "request_retries": "runtime.model_max_retries",
    "web_backend": "runtime.web.backend",
    "gc_profile": "gc.profile",
    "max_consecutive_failures": "max_consecutive_infra_failures",
    "ray": "ray.address",
    "workers": "ray.workers",
    "worker_cpus": "ray.worker_cpus",
    **{
        name: f"runtime.{name}"
        for name in ("token_server", "tool_call_parser", "extra_body", "tool_backend", "unconfined_tools")
    },
}


class BatchConfig(BaseModel):
    """batch_runner's settings: the prompts, the model server(s), the run, and the runtime (the env's own class)."""

    @field_validator("base_url", mode="before")
    @classmethod
    def _one_or_more(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """Old names given in Python (`BatchConfig(max_turns=4)`), moved like old flags."""
        if not isinstance(data, dict):
            return data
        if "max_attempts" in data:
            data = {**data, "rollout_infra_retries": data["max_attempts"] - 1}
            data.pop("max_attempts")
        return renamed_keys(BATCH_RENAMED, data, "", "BatchConfig(...)")

    dataset_file: Path = Field(description="JSONL of {prompt, id?, toolsets?} lines")
    run_name: str = Field(min_length=1, description="The run's directory under output_dir (resume by name)")
    model: str = Field(
        EMBEDDED_MODEL_NAME, description="The name the server knows the model by (required with base_url)"
    )
    base_url: list[str] = Field(
        default_factory=lambda: [EMBEDDED],
        min_length=1,
        description="OpenAI-compatible base URL(s), or 'embedded' for the bundled model; with several (a,b), each "
        "prompt goes to the healthy server with the fewest prompts in flight (one that stops answering gets none)",
    )
    api_key: SecretStr | None = Field(
        None, description="Model server key (default: $OPENAI_API_KEY, else a placeholder)"
    )
    output_dir: Path = Field(Path("runs"), description="Where run directories go")
    resume: bool = Field(False, description="Continue a killed run: run only prompts not yet in the output")
    concurrency: int = Field(8, ge=1, description="Prompts in flight (per Ray worker with ray)")
    distribution: str = Field("default", description=f"Toolset distribution: {', '.join(DISTRIBUTIONS)}")
    seed: int = Field(0, description="Seeds each prompt's toolset sample (with its id)")
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    rollout_infra_retries: int = Field(
        2, ge=0, description="Times a prompt lost to an infrastructure error (server, workspace) is run again"
    )
    retry_backoff_s: float = Field(1.0, ge=0, description="Wait before the second try; doubled for each next one")
    max_consecutive_infra_failures: int = Field(
        10, ge=1, description="Prompts in a row lost to infrastructure errors before the run stops (server down)"
    )
    progress_interval_s: float = Field(0.5, gt=0, description="How often the progress line is redrawn")
    agent: Literal["tools", "codeact"] = Field(
        "tools",
        description="tools: the tool-calling loop; codeact: smolagents' CodeAgent, code actions run where tools run "
        "(the `codeact` extra; docs/code_actions.md)",
    )
    runtime: RuntimeConfig = Field(
        default_factory=RuntimeConfig,
        description="How rollouts run: the env's RuntimeConfig (environments/runtime.py), same names and defaults",
    )
    gc: GCConfig = Field(default_factory=GCConfig, description="Collector settings while the prompts run")
    ray: RayConfig | None = Field(None, description="Run the prompts on Ray workers (environments/batch/on_ray.py)")

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.run_name

    def resolved_api_key(self) -> str:
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        return os.environ.get("OPENAI_API_KEY") or PLACEHOLDER_API_KEY

    def model_servers(self) -> list[ModelServer]:
        """The servers, each timed out like the loop's model calls (runtime.loop.model_timeout_s)."""
        timeout = self.runtime.loop.model_timeout_s
        key = self.resolved_api_key()
        return [ModelServer(base_url=url, model=self.model, api_key=key, timeout_s=timeout) for url in self.base_url]


class BatchError(RuntimeError):
    """A problem the user must fix; printed without a traceback."""


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    toolsets: list[str] | None
    extra: dict[str, Any]


def load_prompts(path: Path) -> list[Prompt]:
    if not path.is_file():
        raise BatchError(f"--dataset_file {str(path)!r} does not exist")
    prompts, seen = [], set()
    for n, line in jsonl_lines(path.read_text(encoding="utf-8")):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BatchError(
                f"{path}:{n} is not JSON ({exc.msg}); each line must be an object with a 'prompt'"
            ) from exc
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise BatchError(f"{path}:{n} has no non-empty string 'prompt'")
        pid = str(row.get("id", f"line-{n}"))
        if pid in seen:
            raise BatchError(f"{path}:{n} repeats id {pid!r}; ids must be unique for --resume to work")
        seen.add(pid)
        toolsets = row.get("toolsets")
        if toolsets is not None and not (isinstance(toolsets, list) and all(isinstance(t, str) for t in toolsets)):
            raise BatchError(f"{path}:{n}: 'toolsets' must be a list of toolset names")
        extra = {k: v for k, v in row.items() if k not in ("prompt", "id", "toolsets")}
        prompts.append(Prompt(pid, row["prompt"], toolsets, extra))
    return prompts


def sample_toolsets(distribution: str, prompt_id: str, seed: int) -> list[str]:
    """Each toolset independently with its probability; never none (the likeliest is kept)."""
    dist = DISTRIBUTIONS.get(distribution)
    if dist is None:
        raise BatchError(f"unknown --distribution {distribution!r}; known: {sorted(DISTRIBUTIONS)}")
    rng = random.Random(f"{seed}:{prompt_id}")
    chosen = [name for name, p in sorted(dist.items()) if rng.random() < p]
    return chosen or [max(dist, key=dist.__getitem__)]
