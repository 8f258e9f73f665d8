"""GSM8k with a python tool: the agent may compute, then answers in \\boxed{}.

    python -m environments.gsm8k_agent_env process --env.total_steps 2 --env.group_size 2
    python -m environments.gsm8k_agent_env process --openai.base_url URL --openai.model_name M ...

The reward is 1.0 when math-verify finds the final answer equal to the number after
`####`, else 0.0. Offline by default (`--env.dataset synthetic`); `--env.dataset
openai/gsm8k` loads the real set through `datasets`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Literal

from math_verify import parse, verify
from pydantic import Field

from environments.agent_loop import AgentResult
from environments.gsm8k.data import gold_answer, load_gsm8k, synthetic_gsm8k
from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig, embedded_server_configs
from tools.context import ToolContext

logger = logging.getLogger(__name__)

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
        config = GSM8kAgentEnvConfig(
            tokenizer_name="embedded",
            group_size=2,
            total_steps=2,
            max_token_length=4096,
            use_wandb=False,
            max_agent_turns=4,
            agent_max_tokens=256,
            data_path_to_save_groups="out/gsm8k_agent.jsonl",
            data_dir_to_save_evals="out/gsm8k_agent_eval",
        )
        return config, embedded_server_configs()

    async def setup(self) -> None:
        cfg: GSM8kAgentEnvConfig = self.config
        if cfg.dataset == "synthetic":
            train = synthetic_gsm8k(cfg.synthetic_size, seed=cfg.seed)
            test = synthetic_gsm8k(cfg.eval_size, seed=cfg.seed + 1_000_003)
        else:
            train, test = await asyncio.gather(
                asyncio.to_thread(load_gsm8k, "train"), asyncio.to_thread(load_gsm8k, "test")
            )
        self.train, self.test = train, test[: cfg.eval_size]
        self.iter = 0

    async def get_next_item(self) -> dict[str, str]:
        item = self.train[self.iter % len(self.train)]
        self.iter += 1
        return item

    def format_prompt(self, item: dict[str, str]) -> str:
        return item["question"]

    async def compute_reward(self, item: dict[str, str], result: AgentResult, ctx: ToolContext) -> float:
        return 1.0 if is_correct(result.final_response, gold_answer(item["answer"])) else 0.0

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        loop_config = self.loop_config().model_copy(update={"temperature": 0.0})
        start = time.time()
        rollouts = await asyncio.gather(*(self.rollout(item, loop_config=loop_config) for item in self.test))
        scored = [r.score for r in rollouts if r.score is not None]
        metrics = {
            "eval/accuracy": sum(scored) / len(scored) if scored else 0.0,
            "eval/infrastructure_failures": sum(r.infrastructure_failure for r in rollouts),
            "eval/n": len(rollouts),
        }
        logger.info("evaluation: %s", metrics)
        print(f"[hermes-rl] evaluation: {metrics}")
        samples = [
            {
                "question": r.item["question"],
                "gold": gold_answer(r.item["answer"]),
                "response": r.result.final_response if r.result else None,
                "score": r.score,
                "stop_reason": r.result.stop_reason if r.result else None,
                "error": r.error,
                "messages": r.result.messages if r.result else None,
            }
            for r in rollouts
        ]
        await self.evaluate_log(
            metrics=metrics,
            samples=samples,
            start_time=start,
            end_time=time.time(),
            generation_parameters={"temperature": 0.0, "max_tokens": loop_config.max_tokens},
        )


if __name__ == "__main__":
    GSM8kAgentEnv.cli()
