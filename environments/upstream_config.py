"""The fields of atroposlib 0.4.0's `BaseEnvConfig`, declared here so the command line can read,
check and explain a config without importing `atroposlib.envs.base` (which pulls in transformers
and torch: seconds before `--help` could answer).

`BaseEnv` reads its settings by attribute, so an env config built on this class runs under it
unchanged; tests/test_upstream_config.py checks that the names and defaults match atroposlib's.
Fields no code hermes-rl runs ever reads are kept (BaseEnv.__init__ still reads some of them) but
marked `unused`: `--help` leaves them out and the CLI refuses them in one line, instead of
accepting a setting that changes nothing.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

__all__ = ["EvalHandling", "UpstreamEnvConfig", "unused_reason"]

_NO_REASONING = (
    "atroposlib passes it only to its own server classes, which hermes-rl's model clients replace; "
    "put reasoning settings in --env.runtime.extra_body"
)


class EvalHandling(str, Enum):
    """atroposlib's EvalHandlingEnum by value; the env hands atroposlib its own member (BaseEnv compares by identity)."""

    STOP_TRAIN = "STOP_TRAIN"
    LIMIT_TRAIN = "LIMIT_TRAIN"
    NONE = "NONE"


def _unused(default: Any, why: str) -> Any:
    return Field(default, exclude=True, json_schema_extra={"unused": why})


def unused_reason(model: type[BaseModel], name: str) -> str | None:
    """Why a field is refused (None: the field is honoured)."""
    field = model.model_fields.get(name)
    extra = field.json_schema_extra if field is not None else None
    return str(extra["unused"]) if isinstance(extra, dict) and "unused" in extra else None


class UpstreamEnvConfig(BaseModel):
    """atroposlib's env settings that hermes-rl honours (each read by atroposlib's loop or ours)."""

    group_size: int = Field(4, description="Rollouts per group (one item, scored together)")
    max_num_workers: int = Field(
        -1, description="Groups collected at once; -1: max_num_workers_per_node per model server"
    )
    max_num_workers_per_node: int = Field(8, description="Groups at once per model server when max_num_workers is -1")
    steps_per_eval: int = Field(100, description="serve: run the evaluation every this many trainer steps")
    max_token_length: int = Field(2048, description="Longest sequence a group may hold, in tokens")
    eval_handling: EvalHandling = Field(
        EvalHandling.STOP_TRAIN, description="serve: what training does during an evaluation"
    )
    eval_limit_ratio: float = Field(0.5, description="serve with eval_handling LIMIT_TRAIN: share of workers kept")
    inference_weight: float = Field(1.0, description="serve: this env's weight, told to run-api at registration")
    batch_size: int = Field(-1, description="Trainer batch size (-1: the trainer's, from run-api)")
    max_batches_offpolicy: int = Field(3, description="serve: batches queued at run-api before collection pauses")
    tokenizer_name: str = Field(
        "NousResearch/DeepHermes-3-Llama-3-3B-Preview", description="Tokenizer of the trained model (hub name or dir)"
    )
    use_wandb: bool = Field(True, description="Log to Weights & Biases")
    rollout_server_url: str = Field("http://localhost:8000", description="serve: atroposlib's run-api")
    total_steps: int = Field(1000, description="Groups to make (process) or trainer steps to serve")
    wandb_name: str | None = Field(None, description="Run name in wandb")
    num_rollouts_to_keep: int = Field(32, description="Rollouts shown in wandb's table")
    num_rollouts_per_group_for_logging: int = Field(1, description="Rollouts per group logged to wandb (-1: all)")
    ensure_scores_are_not_same: bool = Field(
        True, description="Drop groups whose scores are all equal (they teach a trainer nothing)"
    )
    data_path_to_save_groups: str | None = Field(None, description="JSONL file the groups are written to")
    data_dir_to_save_evals: str | None = Field(None, description="Directory for evaluation metrics and samples")
    min_items_sent_before_logging: int = Field(2, description="serve: groups sent between wandb logs")
    include_messages: bool = Field(False, description="Keep each rollout's messages in its group")
    min_batch_allocation: float | None = Field(
        None, description="serve: the smallest share of each batch run-api keeps for this env (0-1)"
    )
    worker_timeout: float = Field(600, description="Seconds one group may take (-1: no limit)")
    thinking_mode: bool = _unused(False, _NO_REASONING)
    reasoning_effort: str | None = _unused(None, _NO_REASONING)
    max_reasoning_tokens: int | None = _unused(None, _NO_REASONING)
    custom_thinking_prompt: str | None = _unused(None, "atroposlib 0.4.0 never reads it; use --env.system_prompt")
    max_eval_workers: int = _unused(
        16, "only atroposlib's example evaluate() reads it; hermes-rl's evaluate runs every eval item at once"
    )
