"""GSM8k with a python tool: the agent may compute, then answers in \\boxed{}.

    python -m environments.gsm8k_agent_env process --env.total_steps 2 --env.group_size 2
    python -m environments.gsm8k_agent_env process --openai.base_url URL --openai.model_name M ...

The reward is 1.0 when math-verify finds the final answer equal to the number after
`####`. A wrong answer that still ends with a marked final number (`\\boxed{N}`, GSM8k's
`#### N`, or `answer is N`) earns `--env.format_reward` (default 0.1; 0 turns it off), else
0.0: even a tiny model then gets groups whose scores differ, which atroposlib needs to send
them. Offline by default (`--env.dataset synthetic`); `--env.dataset openai/gsm8k` loads the
real set through `datasets`; `--env.dataset PATH` reads a JSONL file of openai/gsm8k rows
(`question`, `answer` ending in `#### N`) or a `save_to_disk` directory.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

from environments.agent_loop import AgentResult
from environments.gsm8k.answers import has_marked_answer
from environments.gsm8k.data import dataset_kind, gold_answer, load_gsm8k, load_local_gsm8k, synthetic_gsm8k
from environments.isolated_call import CheckTimeout, IsolatedCall
from environments.dataset_source import dataset_error
from environments.gsm8k.config import ENTRY, GSM8kAgentEnvConfig
from environments.hermes_base_env import HermesAgentBaseEnv, HermesEnvError, Rollout
from tools.context import ToolContext

SYSTEM_PROMPT = (
    "You are a careful math assistant. You can run Python with the `python` tool to check "
    "arithmetic. When you know the answer, reply with the final number in \\boxed{}, "
    "for example \\boxed{42}."
)


class GSM8kAgentEnv(HermesAgentBaseEnv):
    config: GSM8kAgentEnvConfig  # this env's own settings class
    name = ENTRY.name
    env_config_cls = GSM8kAgentEnvConfig
    default_toolsets = ["python"]
    default_system_prompt = SYSTEM_PROMPT

    _local: tuple[list[dict[str, str]], list[dict[str, str]]] | None = None  # a local dataset, read by check_data

    def check_data(self) -> None:
        # A local file or directory is read (and kept) before anything starts; a hub name loads in items().
        cfg: GSM8kAgentEnvConfig = self.config
        try:
            if dataset_kind(cfg.dataset) != "local":
                return
            train, test = load_local_gsm8k(Path(cfg.dataset))
        except (ValueError, OSError) as exc:
            raise HermesEnvError(dataset_error(cfg.dataset, exc)) from None
        if not train or not test:
            raise HermesEnvError(f"--env.dataset {cfg.dataset!r} holds no rows; pass a file with at least one problem")
        self._local = (train, test)

    async def _split(self, split: str) -> list[dict[str, str]]:
        cfg: GSM8kAgentEnvConfig = self.config
        try:
            kind = dataset_kind(cfg.dataset)
            if kind == "offline":
                if split == "train":
                    return synthetic_gsm8k(cfg.synthetic_size, seed=cfg.seed)
                return synthetic_gsm8k(cfg.eval_size, seed=cfg.seed + 1_000_003)
            if kind == "local":
                if self._local is None:
                    await asyncio.to_thread(self.check_data)
                assert self._local is not None
                train, test = self._local
                return train if split == "train" else test
            return await asyncio.to_thread(load_gsm8k, split, cfg.dataset)
        except ValueError as exc:
            raise HermesEnvError(str(exc)) from None

    async def items(self) -> list[dict[str, str]]:
        return await self._split("train")

    async def eval_items(self) -> list[dict[str, str]]:
        return (await self._split("test"))[: self.config.eval_size]

    def format_prompt(self, item: dict[str, str]) -> str:
        return item["question"]

    @functools.cached_property
    def answer_check(self) -> IsolatedCall:
        # The policy writes what math-verify parses: a ruinous expression must not stall the run.
        return IsolatedCall("environments.gsm8k.answers:is_correct", timeout_s=self.config.answer_check_timeout_s)

    async def teardown(self) -> None:
        if "answer_check" in self.__dict__:
            await self.answer_check.aclose()

    async def compute_reward(self, item: dict[str, str], result: AgentResult, ctx: ToolContext) -> float:
        try:
            if await self.answer_check(result.final_response, gold_answer(item["answer"])):
                return 1.0
        except CheckTimeout:
            return 0.0  # too costly to check: nothing, not even the format reward
        return self.config.format_reward if has_marked_answer(result.final_response) else 0.0

    def eval_sample(self, rollout: Rollout) -> dict[str, Any]:
        return {**super().eval_sample(rollout), "gold": gold_answer(rollout.item["answer"])}


if __name__ == "__main__":
    GSM8kAgentEnv.cli()
