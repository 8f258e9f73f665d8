"""batch_runner's settings (BatchConfig, RayConfig), its prompt file and toolset distributions."""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

from environments.agent_loop import AgentLoopConfig
from environments.models.tool_choice import ToolChoice
from environments.gc_tuning import GCConfig
from environments.jsonl import jsonl_lines
from environments.models.chat_mode import PLACEHOLDER_API_KEY
from environments.models.token_mode.wiring import TokenServerChoice
from environments.runtime import EMBEDDED, EMBEDDED_MODEL_NAME, ModelServer, RuntimeConfig
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.tool_backend import LocalToolBackendConfig
from tools.context import ToolLimits
from tools.web import WebConfig

__all__ = ["BatchConfig", "BatchError", "DISTRIBUTIONS", "Prompt", "RayConfig", "load_prompts", "sample_toolsets"]

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

_LOOP = AgentLoopConfig()

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


class BatchConfig(BaseModel):
    @field_validator("base_url", mode="before")
    @classmethod
    def _one_or_more(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    dataset_file: Path
    run_name: str = Field(min_length=1)
    model: str = EMBEDDED_MODEL_NAME
    base_url: list[str] = Field(
        default_factory=lambda: [EMBEDDED],
        min_length=1,
        description="OpenAI-compatible base URL(s), or 'embedded' for the bundled model; with several, each prompt "
        "goes to the healthy server with the fewest prompts in flight (one that stops answering gets none)",
    )
    token_server: TokenServerChoice = Field(
        "off", description="token mode on request: the server's token protocol (auto: llamacpp for the embedded model)"
    )
    api_key: SecretStr | None = Field(
        None, description="Model server key (default: $OPENAI_API_KEY, else a placeholder)"
    )
    output_dir: Path = Path("runs")
    resume: bool = False
    concurrency: int = Field(8, ge=1)
    distribution: str = "default"
    seed: int = 0
    # The agent loop's defaults, shared with the envs.
    max_turns: int = Field(_LOOP.max_turns, ge=1)
    max_tokens: int | None = Field(_LOOP.max_tokens, ge=1)
    temperature: float = Field(_LOOP.temperature, ge=0)
    time_budget_s: float = Field(_LOOP.time_budget_s, gt=0)
    tool_choice: ToolChoice = Field(_LOOP.tool_choice, description="tool_choice of every turn (docs/environments.md)")
    first_turn_tool_choice: ToolChoice | None = Field(
        None,
        description="tool_choice of the first turn; None: required on the embedded model in token mode, else as tool_choice",
    )
    max_attempts: int = Field(3, ge=1, description="Tries per prompt when the infrastructure fails")
    retry_backoff_s: float = Field(1.0, ge=0)
    max_consecutive_failures: int = Field(
        10, ge=1, description="Prompts in a row lost to infrastructure errors before the run stops (server down)"
    )
    request_timeout_s: float = Field(120.0, gt=0)
    request_retries: int = Field(2, ge=0, description="Retries of one HTTP request inside the client")
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tool_call_parser: str | None = "hermes"
    extra_body: dict[str, Any] = Field(default_factory=dict)
    tool_limits: ToolLimits = Field(default_factory=ToolLimits)
    tool_backend: Literal["local", "sandbox"] = Field(
        "sandbox", description="Where tools run: sandbox slots, or local processes (needs unconfined_tools)"
    )
    unconfined_tools: bool = Field(False, description="Run model code unconfined (docs/security.md)")
    workspace: LocalToolBackendConfig = Field(default_factory=LocalToolBackendConfig)
    sandbox: SandboxToolBackendConfig = Field(default_factory=SandboxToolBackendConfig)
    web: WebConfig = Field(default_factory=WebConfig)
    gc: GCConfig = Field(default_factory=GCConfig, description="Collector settings while the prompts run")
    progress_interval_s: float = Field(0.5, gt=0)
    agent: Literal["tools", "codeact"] = Field(
        "tools",
        description="tools: the tool-calling loop; codeact: smolagents' CodeAgent, code actions run where tools run "
        "(the `codeact` extra; docs/code_actions.md)",
    )
    ray: RayConfig | None = Field(None, description="Run the prompts on Ray workers (environments/batch/on_ray.py)")

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.run_name

    def resolved_api_key(self) -> str:
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        return os.environ.get("OPENAI_API_KEY") or PLACEHOLDER_API_KEY

    def runtime_config(self) -> RuntimeConfig:
        servers = [
            ModelServer(
                base_url=url, model=self.model, api_key=self.resolved_api_key(), timeout_s=self.request_timeout_s
            )
            # model_copy(update=...) skips validation: a single URL may still be a string here
            for url in ([self.base_url] if isinstance(self.base_url, str) else self.base_url)
        ]
        loop = AgentLoopConfig(
            max_turns=self.max_turns,
            time_budget_s=self.time_budget_s,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            tool_choice=self.tool_choice,
            first_turn_tool_choice=self.first_turn_tool_choice,
        )
        return RuntimeConfig(
            servers=servers,
            token_server=self.token_server,
            tool_call_parser=self.tool_call_parser,
            extra_body=self.extra_body,
            model_max_retries=self.request_retries,
            loop=loop,
            tool_limits=self.tool_limits,
            tool_backend=self.tool_backend,
            unconfined_tools=self.unconfined_tools,
            workspace=self.workspace,
            sandbox=self.sandbox,
            web=self.web,
        )


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
