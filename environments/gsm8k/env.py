"""GSM8k with a python tool: the agent may compute, then answers in \\boxed{}.

    python -m environments.gsm8k_agent_env process --env.total_steps 2 --env.group_size 2
    python -m environments.gsm8k_agent_env process --openai.base_url URL --openai.model_name M ...

The reward is 1.0 when math-verify finds the final answer equal to the number after
`####`, else 0.0. Offline by default (`--env.dataset synthetic`); `--env.dataset
openai/gsm8k` loads the real set through `datasets`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from math_verify import parse, verify
from pydantic import Field

from environments.agent_loop import AgentResult
from environments.gsm8k.data import gold_answer, load_gsm8k, synthetic_gsm8k
from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig, Rollout
from tools.context import ToolContext

SYSTEM_PROMPT = (
    "You are a careful math assistant. You can run Python with the `python` tool to check "
    "arithmetic. When you know the answer, reply with the final number in \\boxed{}, "
    "for example \\boxed{42}."
)


class GSM8kAgentEnvConfig(HermesAgentEnvConfig):
    dataset: Literal["synthetic", "openai/gsm8k"] = Field("synthetic", description="Problem source")
    synthetic_size: int = Field(200, ge=1, description="Problems the offline generator makes")
    eval_size: int = Field(16, ge=1, description="Problems used by evaluate")
    seed: int = Field(0, description="Seed of the generator and of the item order")


def is_correct(response: str | None, gold: str) -> bool:
    if not response:
        return False
    # Without a timeout math-verify also works outside the main thread.
    predicted = parse(response, parsing_timeout=None)
    return bool(predicted) and verify(parse(gold, parsing_timeout=None), predicted, timeout_seconds=None)


class GSM8kAgentEnv(HermesAgentBaseEnv):
    name = "gsm8k_agent"
    env_config_cls = GSM8kAgentEnvConfig
    default_toolsets = ["python"]
    default_system_prompt = SYSTEM_PROMPT

    @classmethod
    def config_init(cls):
        config, servers = super().config_init()
        return config.model_copy(update={"max_agent_turns": 4, "agent_max_tokens": 256}), servers

    async def items(self) -> list[dict[str, str]]:
        cfg: GSM8kAgentEnvConfig = self.config
        if cfg.dataset == "synthetic":
            return synthetic_gsm8k(cfg.synthetic_size, seed=cfg.seed)
        return await asyncio.to_thread(load_gsm8k, "train")

    async def eval_items(self) -> list[dict[str, str]]:
        cfg: GSM8kAgentEnvConfig = self.config
        if cfg.dataset == "synthetic":
            return synthetic_gsm8k(cfg.eval_size, seed=cfg.seed + 1_000_003)
        return (await asyncio.to_thread(load_gsm8k, "test"))[: cfg.eval_size]

    def format_prompt(self, item: dict[str, str]) -> str:
        return item["question"]

    async def compute_reward(self, item: dict[str, str], result: AgentResult, ctx: ToolContext) -> float:
        return 1.0 if is_correct(result.final_response, gold_answer(item["answer"])) else 0.0

    def eval_sample(self, rollout: Rollout) -> dict[str, Any]:
        return {**super().eval_sample(rollout), "gold": gold_answer(rollout.item["answer"])}


if __name__ == "__main__":
    GSM8kAgentEnv.cli()
