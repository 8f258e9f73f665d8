"""The GAIA env's settings (`--env.*`) and its command-line entry; the env is environments/gaia/env.py.

Kept apart from the env so `--help` and the CLI's checks run without importing atroposlib's BaseEnv.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from environments.env_config import HermesAgentEnvConfig
from environments.env_entry import EnvEntry
from environments.gaia.offline import OFFLINE_DIR

__all__ = ["ENTRY", "GaiaAgentEnvConfig"]


class GaiaAgentEnvConfig(HermesAgentEnvConfig):
    # Research questions with attachments need longer trajectories than the base defaults.
    task_defaults: ClassVar[dict[str, Any]] = {
        "total_steps": 12,
        "max_token_length": 8192,
        "runtime.loop.max_turns": 8,
        "runtime.loop.max_tokens": 512,
    }
    data_dir: str = Field(
        str(OFFLINE_DIR),
        description="GAIA split directory (metadata.parquet or metadata.jsonl + attachments) or a GAIA snapshot root",
    )
    split: Literal["validation", "test"] = Field(
        "validation", description="Split used when data_dir is a snapshot root"
    )
    levels: list[int] | None = Field(None, description="Only tasks of these levels (None: all)")
    correctness_weight: float = Field(0.9, ge=0, description="Weight of the quasi-exact match in the reward")
    efficiency_weight: float = Field(
        0.1, ge=0, description="Weight of the tool-call efficiency term (counts only when correct)"
    )
    efficiency_free_calls: int = Field(4, ge=0, description="Tool calls that cost nothing")
    efficiency_max_calls: int = Field(20, ge=1, description="Tool calls at which the efficiency term reaches 0")

    @model_validator(mode="after")
    def _weights(self) -> "GaiaAgentEnvConfig":
        total = self.correctness_weight + self.efficiency_weight
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"correctness_weight + efficiency_weight must be 1.0 (rewards lie in [0, 1]), got {total}")
        if self.efficiency_max_calls <= self.efficiency_free_calls:
            raise ValueError("efficiency_max_calls must be larger than efficiency_free_calls")
        return self


ENTRY = EnvEntry(
    "environments.gaia.env:GaiaAgentEnv",
    "gaia_agent",
    GaiaAgentEnvConfig,
    summary="GAIA research questions with attachments, answered with web, file, python and terminal tools.",
)
