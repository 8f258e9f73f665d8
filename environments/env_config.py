"""The settings of a hermes-rl env: atroposlib's env settings (environments/upstream_config.py), the runtime
(`--env.runtime.*`: the same `RuntimeConfig` batch_runner embeds) and what only an env decides (toolsets, groups,
logprob handling), each an `--env.*` flag (environments/cli.py)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from environments.cli_parse import renamed_keys
from environments.gc_tuning import GCConfig
from environments.runtime import RuntimeConfig
from environments.upstream_config import UpstreamEnvConfig

__all__ = ["ENV_RENAMED", "HermesAgentEnvConfig", "SplitSequences"]

# Old `--env.*` names (before the runtime was one embedded RuntimeConfig) -> their new place; they still
# work for one release, with a one-line notice (environments/cli_parse.py).
ENV_RENAMED: dict[str, str] = {
    "max_agent_turns": "runtime.loop.max_turns",
    "agent_time_budget_s": "runtime.loop.time_budget_s",
    "agent_temperature": "runtime.loop.temperature",
    "agent_max_tokens": "runtime.loop.max_tokens",
    "tool_choice": "runtime.loop.tool_choice",
    "first_turn_tool_choice": "runtime.loop.first_turn_tool_choice",
    "tool_timeout_s": "runtime.tool_limits.default_timeout_s",
    "tool_max_timeout_s": "runtime.tool_limits.max_timeout_s",
    "tool_max_output_chars": "runtime.tool_limits.max_output_chars",
    "python_timeout_s": "runtime.tool_limits.python_timeout_s",
    "workspace_root": "runtime.workspace.workspace_root",
    **{
        name: f"runtime.{name}"
        for name in (
            "model_max_retries",
            "tool_call_parser",
            "token_server",
            "chat_template_path",
            "extra_body",
            "tools_in",
            "tool_backend",
            "unconfined_tools",
            "sandbox",
            "web",
            "embedded_threads",
            "embedded_parallel",
        )
    },
}


# Rollouts spanning several token sequences: what a group keeps (environments/trainer_boundary.py).
SplitSequences = Literal["last", "all"]


class HermesAgentEnvConfig(UpstreamEnvConfig):
    renamed: ClassVar[dict[str, str]] = ENV_RENAMED
    # A task's own defaults for the CLI (environments/env_entry.py default_config), keyed as its flags are
    # named after `--env.`, e.g. {"group_size": 4, "runtime.loop.max_turns": 6}.
    task_defaults: ClassVar[dict[str, Any]] = {}

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """Old names given in Python (`HermesAgentEnvConfig(max_agent_turns=4)`), moved like old flags."""
        return renamed_keys(cls.renamed, data, "", f"{cls.__name__}(...)") if isinstance(data, dict) else data

    enabled_toolsets: list[str] | None = Field(
        None, description="Toolsets offered to the model (None: the env's default)"
    )
    disabled_toolsets: list[str] = Field(default_factory=list, description="Toolsets never offered")
    system_prompt: str | None = Field(None, description="System prompt (None: the env's default)")
    runtime: RuntimeConfig = Field(
        default_factory=RuntimeConfig,
        description="How rollouts run: model clients, agent loop, tools and where they run (environments/runtime.py)",
    )
    rollout_infra_retries: int = Field(
        1, ge=0, description="Times a rollout lost to an infrastructure error is run again to fill its group"
    )
    split_sequences: SplitSequences = Field(
        "last",
        description="Rollouts that span several token sequences (a template that is not append-only): last = the "
        "rollout's last sequence only (groups keep group_size sequences, which run-api releases); all = every "
        "sequence, tagged with its rollout in group_overrides.sequence_rollouts (process output; docs/trainers.md)",
    )
    max_consecutive_infra_failures: int = Field(
        3, ge=1, description="Groups in a row lost to infrastructure errors before the command stops"
    )
    server_down_wait_s: float = Field(
        120.0,
        ge=0,
        description="When every rollout of a group failed on infrastructure: how long to wait for a model server "
        "that does not answer; one that comes back (a restart, e.g. training.grpo --sync) gets the group again, "
        "not counted as lost",
    )
    inference_logprobs: Literal["raw_logits", "sampling_policy"] = Field(
        "raw_logits",
        description="Which distribution inference_logprobs describe: raw_logits = log-softmax of the model's logits "
        "(temperature 1, no truncation; every engine's default); sampling_policy = the distribution actually sampled "
        "(temperature, top-k/top-p/min-p applied; llama.cpp post_sampling_probs)",
    )
    missing_logprobs: Literal["mask", "drop", "keep"] = Field(
        "mask",
        description="Trained tokens the server reported no logprob for: mask = not trained (mask -100); "
        "drop = leave the sequence out of the group; keep = train them with 1.0 (atroposlib's 'no logprob' marker)",
    )
    require_inference_logprobs: bool = Field(
        False, description="Refuse to start without token mode's logprobs (set by a `tinker:` YAML section)"
    )
    eval_size: int | None = Field(None, ge=1, description="Eval items used by evaluate (None: all)")
    gc: GCConfig = Field(
        default_factory=GCConfig, description="Collector settings while the command runs (environments/gc_tuning.py)"
    )
