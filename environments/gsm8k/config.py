"""The GSM8k env's settings (`--env.*`) and its command-line entry; the env is environments/gsm8k/env.py.

Kept apart from the env so `--help` and the CLI's checks run without importing atroposlib's BaseEnv.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from environments.env_config import HermesAgentEnvConfig
from environments.env_entry import EnvEntry

__all__ = ["ENTRY", "GSM8kAgentEnvConfig"]


class GSM8kAgentEnvConfig(HermesAgentEnvConfig):
    # group_size 4: more rollouts per group, more often scores that differ.
    task_defaults: ClassVar[dict[str, Any]] = {
        "runtime.loop.max_turns": 4,
        "runtime.loop.max_tokens": 256,
        "group_size": 4,
    }
    dataset: str = Field(
        "synthetic",
        description="'synthetic' (offline generator), a hub name (openai/gsm8k), or a JSONL file / datasets dir",
    )
    synthetic_size: int = Field(200, ge=1, description="Problems the offline generator makes")
    eval_size: int = Field(16, ge=1, description="Problems used by evaluate")
    seed: int = Field(0, description="Seed of the generator and of the item order")
    answer_check_timeout_s: float = Field(
        10.0, gt=0, description="Deadline of one answer check (math-verify runs in a worker process); past it: 0"
    )
    format_reward: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="Reward of a wrong answer that marks its final number (\\boxed{N}, '#### N', 'answer is N'); 0: off",
    )


ENTRY = EnvEntry(
    "environments.gsm8k.env:GSM8kAgentEnv",
    "gsm8k_agent",
    GSM8kAgentEnvConfig,
    summary="GSM8k with a python tool: the agent may compute, then answers in \\boxed{}.",
)
