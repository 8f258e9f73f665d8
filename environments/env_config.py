"""The settings of a hermes-rl env: atroposlib's env settings (environments/upstream_config.py) plus the
agent's model, tools, limits, retries and token handling, each an `--env.*` flag (environments/cli.py)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from environments.agent_loop import AgentLoopConfig
from environments.gc_tuning import GCConfig
from environments.models.tool_choice import ToolChoice
from environments.models.token_mode.wiring import TokenServerChoice
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.upstream_config import UpstreamEnvConfig
from tools.web import WebConfig

__all__ = ["HermesAgentEnvConfig", "SplitSequences"]

_LOOP_DEFAULTS = AgentLoopConfig()  # one set of loop defaults for the env and batch_runner


# Rollouts spanning several token sequences: what a group keeps (environments/trainer_boundary.py).
SplitSequences = Literal["last", "all"]


class HermesAgentEnvConfig(UpstreamEnvConfig):
    # A task's own defaults for the CLI (environments/env_entry.py default_config), e.g. {"group_size": 4}.
    task_defaults: ClassVar[dict[str, Any]] = {}

    enabled_toolsets: list[str] | None = Field(
        None, description="Toolsets offered to the model (None: the env's default)"
    )
    disabled_toolsets: list[str] = Field(default_factory=list, description="Toolsets never offered")
    max_agent_turns: int = Field(_LOOP_DEFAULTS.max_turns, ge=1, description="Model calls per trajectory")
    agent_time_budget_s: float = Field(
        _LOOP_DEFAULTS.time_budget_s, gt=0, description="Wall-clock budget of one trajectory"
    )
    system_prompt: str | None = Field(None, description="System prompt (None: the env's default)")
    agent_temperature: float = Field(
        _LOOP_DEFAULTS.temperature, ge=0, description="Sampling temperature of agent turns"
    )
    agent_max_tokens: int | None = Field(_LOOP_DEFAULTS.max_tokens, ge=1, description="Cap on tokens per agent turn")
    tool_choice: ToolChoice = Field(
        _LOOP_DEFAULTS.tool_choice,
        description="OpenAI tool_choice of every turn: auto | none | required | '{type: function, function: "
        "{name: NAME}}' (chat mode: sent to the server; token mode: a llama.cpp grammar; docs/environments.md)",
    )
    first_turn_tool_choice: ToolChoice | None = Field(
        None,
        description="tool_choice of the first turn; None: required when the embedded model serves in token mode (a 135M model "
        "seldom calls a tool unprompted, so its rollouts would show no tool use), else as tool_choice",
    )
    tool_timeout_s: float = Field(30.0, gt=0, description="Default timeout of a terminal command")
    tool_max_timeout_s: float = Field(300.0, gt=0, description="Largest timeout a model may ask for")
    tool_max_output_chars: int = Field(20_000, gt=0, description="Cap on a tool's output")
    python_timeout_s: float = Field(30.0, gt=0, description="Timeout of one python tool call")
    tool_call_parser: str = Field("hermes", description="Parser for tool calls a server returns as text")
    token_server: TokenServerChoice = Field(
        "auto",
        description="Token mode (exact ids + logprobs): the model server's token protocol, vllm | vllm_openai | "
        "sglang | llamacpp | tinker; auto = llamacpp for the embedded model, else from --openai.server_type (vllm, sglang); "
        "off = chat mode (OpenAI chat; tokens re-rendered, no logprobs)",
    )
    chat_template_path: str | None = Field(
        None, description="Token mode: the model's chat template (.jinja) when the tokenizer has none or another one"
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="Extra fields for every chat request (e.g. a llama.cpp 'grammar')"
    )
    tools_in: Literal["request", "system_prompt"] = Field(
        "request", description="How tools reach the model: tools= in the request, or Hermes text in the system prompt"
    )
    workspace_root: str | None = Field(
        None, description="Where per-trajectory workspaces go with tool_backend local (default: a temp dir)"
    )
    tool_backend: Literal["local", "sandbox"] = Field(
        "sandbox", description="Where tools run: isolated sandbox slots, or local processes (needs unconfined_tools)"
    )
    unconfined_tools: bool = Field(
        False,
        description="Run model code as this user with this machine's files and network where it cannot be "
        "confined (no bubblewrap) or with tool_backend local; see docs/security.md for what that costs",
    )
    sandbox: SandboxToolBackendConfig = Field(
        default_factory=SandboxToolBackendConfig,
        description="Sandbox slots: backend (local | docker | nomad | modal) and pool",
    )
    model_max_retries: int = Field(2, ge=0, description="Retries of a failed model request (5xx, 429, connection)")
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
    embedded_threads: int = Field(2, ge=1, description="CPU threads of the embedded llama.cpp server")
    embedded_parallel: int = Field(4, ge=1, description="Concurrent sequences of the embedded llama.cpp server")
    web: WebConfig = Field(default_factory=WebConfig, description="Backend of the web toolset, when it is enabled")
    eval_size: int | None = Field(None, ge=1, description="Eval items used by evaluate (None: all)")
    gc: GCConfig = Field(
        default_factory=GCConfig, description="Collector settings while the command runs (environments/gc_tuning.py)"
    )
