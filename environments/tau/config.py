"""The τ² env's settings (`--env.*`) and its command-line entry; the env is environments/tau/env.py.

Kept apart from the env so `--help` and the CLI's checks run without importing atroposlib's BaseEnv.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from environments.env_config import HermesAgentEnvConfig
from environments.env_entry import EnvEntry
from environments.tau.conversation import TauRules
from environments.tau.user_sim import JudgeConfig, UserModelConfig

__all__ = ["ENTRY", "TauEnvConfig"]


class TauEnvConfig(HermesAgentEnvConfig):
    # The benchmark caps a run by steps (TauRules.max_steps), not model calls, and sends no token cap.
    task_defaults: ClassVar[dict[str, Any]] = {"runtime.loop.max_turns": 200, "runtime.loop.max_tokens": None}
    data_dir: str | None = Field(
        None, description="tau2-bench's data/tau2 directory (domains/<domain>/...); None: the bundled offline sample"
    )
    domain: str = Field("retail", description="The τ²-bench domain (implemented: retail, airline)")
    task_split: str | None = Field(None, description="A split of split_tasks.json (train/test/base); None: every task")
    user_model: UserModelConfig = Field(default_factory=UserModelConfig, description="The user simulator's model")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="The NL-assertion judge (off by default)")
    rules: TauRules = Field(default_factory=TauRules, description="The benchmark's limits; deliberate differences")


ENTRY = EnvEntry(
    "environments.tau.env:TauEnv",
    "tau",
    TauEnvConfig,
    summary="τ²-bench domains: policy-following customer service with a simulated user.",
)
