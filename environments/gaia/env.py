"""GAIA: research questions with file attachments, answered with web, file and python tools.

    python -m environments.gaia_agent_env process --env.total_steps 12 --env.group_size 2
    python -m environments.gaia.data download --dest data/GAIA      # the gated real set
    python -m environments.gaia_agent_env process --env.data_dir data/GAIA --env.split validation \
        --config gaia.yaml --openai.base_url URL --openai.model_name M

(nested settings go in the YAML file, e.g. `env: {web: {backend: tavily}}`; the key is
read from $TAVILY_API_KEY unless `env.runtime.web.tavily.api_key` is set.)

Offline by default: a dozen GAIA-format tasks bundled in environments/data/gaia/offline,
and the embedded offline web (tools/web) that answers `web_search`/`web_extract`.
A task's attachment is copied into the trajectory's workspace and named in the prompt.

The reward is `question_scorer` (GAIA's quasi-exact match) combined with an efficiency
term for the number of tool calls; the pure correctness is reported beside it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import string
from pathlib import Path
from typing import Any


from environments.agent_loop import AgentResult
from environments.gaia.data import load_tasks
from environments.hermes_base_env import HermesAgentBaseEnv, HermesEnvError, Rollout
from environments.gaia.config import ENTRY, GaiaAgentEnvConfig
from tools.context import ToolContext

__all__ = [
    "GaiaAgentEnv",
    "GaiaAgentEnvConfig",
    "question_scorer",
    "extract_final_answer",
    "efficiency",
    "SYSTEM_PROMPT",
]

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are a research assistant. Use the tools to look things up on the web, read attached files "
    "in your working directory, and compute with python. When you are sure, end your reply with a "
    "line of the form\nFINAL ANSWER: <answer>\n"
    "The answer is a number, as few words as possible, or a comma separated list. Write numbers "
    "with digits only: no thousands separators and no units such as $ or % unless asked. Write "
    "strings without articles or abbreviations."
)


# ---- GAIA's quasi-exact match -------------------------------------------------------------


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _normalize_number(text: str) -> float:
    for char in ("$", "%", ","):
        text = text.replace(char, "")
    try:
        return float(text)
    except ValueError:
        return float("inf")  # never equal to a ground truth


def _normalize_str(text: str, remove_punct: bool = True) -> str:
    text = re.sub(r"\s", "", text).lower()
    return text.translate(str.maketrans("", "", string.punctuation)) if remove_punct else text


def question_scorer(model_answer: str, ground_truth: str) -> bool:
    """GAIA's reference scorer: numbers as floats, lists element-wise, strings normalised."""
    if model_answer is None:
        model_answer = "None"
    if _is_float(ground_truth):
        return _normalize_number(model_answer) == float(ground_truth)
    if any(char in ground_truth for char in ",;"):
        truth = re.split(r"[,;]", ground_truth)
        answer = re.split(r"[,;]", model_answer)
        if len(truth) != len(answer):
            return False
        return all(
            _normalize_number(a) == float(t) if _is_float(t) else _normalize_str(a, False) == _normalize_str(t, False)
            for a, t in zip(answer, truth)
        )
    return _normalize_str(model_answer) == _normalize_str(ground_truth)


_FINAL = re.compile(r"final\s*answer\s*:\s*(.*)", re.IGNORECASE)


def extract_final_answer(response: str | None) -> str | None:
    """The text after the last `FINAL ANSWER:` (to the end of its line); None when absent."""
    if not response:
        return None
    matches = _FINAL.findall(response)
    if not matches:
        return None
    return matches[-1].strip().strip("*").strip()


def efficiency(tool_calls: int, free_calls: int, max_calls: int) -> float:
    """1.0 up to `free_calls` tool calls, falling linearly to 0.0 at `max_calls`."""
    if tool_calls <= free_calls:
        return 1.0
    if tool_calls >= max_calls:
        return 0.0
    return 1.0 - (tool_calls - free_calls) / (max_calls - free_calls)


# ---- the env -------------------------------------------------------------------------------


class GaiaAgentEnv(HermesAgentBaseEnv):
    name = ENTRY.name
    env_config_cls = GaiaAgentEnvConfig
    default_toolsets = ["web", "file", "python", "terminal"]
    default_system_prompt = SYSTEM_PROMPT

    def __init__(self, config: GaiaAgentEnvConfig, server_configs, slurm: bool = False, testing: bool = False) -> None:
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        self.config: GaiaAgentEnvConfig = config
        self._correct_since_log: list[bool] = []

    async def items(self) -> list[dict[str, Any]]:
        tasks = await asyncio.to_thread(load_tasks, Path(self.config.data_dir), self.config.split)
        if self.config.levels is not None:
            tasks = [t for t in tasks if int(t["Level"]) in self.config.levels]
        if not tasks:
            raise HermesEnvError(f"no GAIA tasks in {self.config.data_dir!r} at levels {self.config.levels}")
        self.tasks = tasks
        return tasks

    async def eval_items(self) -> list[dict[str, Any]]:
        return self.tasks  # GAIA's validation split is the one with answers: evaluate runs the loaded tasks

    def format_prompt(self, item: dict[str, Any]) -> str:
        prompt = item["Question"]
        if item.get("file_name"):
            prompt += f"\n\nThe attached file is in your working directory as `{item['file_name']}`."
        return prompt

    async def setup_trajectory_workspace(self, item: dict[str, Any], ctx: ToolContext) -> None:
        if item.get("file_name"):
            await ctx.upload(item["file_path"], item["file_name"])

    def is_correct(self, item: dict[str, Any], result: AgentResult) -> bool:
        answer = extract_final_answer(result.final_response)
        return answer is not None and question_scorer(answer, str(item["Final answer"]))

    async def compute_reward(self, item: dict[str, Any], result: AgentResult, ctx: ToolContext) -> float:
        if not self.is_correct(item, result):
            return 0.0
        c = self.config
        return c.correctness_weight + c.efficiency_weight * efficiency(
            result.tool_call_count, c.efficiency_free_calls, c.efficiency_max_calls
        )

    def build_group(self, rollouts: list[Rollout]):
        group = super().build_group(rollouts)
        for info in group["rollout_info"]:
            r = rollouts[info["rollout"]]
            assert r.result is not None
            info["task_id"] = r.item["task_id"]
            info["correct"] = self.is_correct(r.item, r.result)
            info["model_answer"] = extract_final_answer(r.result.final_response)
            self._correct_since_log.append(info["correct"])
        return group

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        # The reward mixes in efficiency; log the pure correctness beside it.
        metrics = dict(wandb_metrics or {})
        if self._correct_since_log:
            metrics["train/accuracy"] = sum(self._correct_since_log) / len(self._correct_since_log)
            self._correct_since_log = []
        await super().wandb_log(metrics)

    def eval_metrics(self, rollouts: list[Rollout]) -> dict[str, float]:
        # The reward mixes in efficiency: accuracy is the pure quasi-exact match, the reward beside it.
        correct = [self.is_correct(r.item, r.result) for r in rollouts if r.score is not None and r.result is not None]
        return {
            "eval/accuracy": sum(correct) / len(correct) if correct else 0.0,
            "eval/mean_reward": super().eval_metrics(rollouts)["eval/accuracy"],
        }

    def eval_sample(self, rollout: Rollout) -> dict[str, Any]:
        item, result = rollout.item, rollout.result
        return {
            **super().eval_sample(rollout),
            "item": {"task_id": item["task_id"], "Question": item["Question"]},
            "gold": str(item["Final answer"]),
            "model_answer": extract_final_answer(result.final_response) if result else None,
            "correct": result is not None and self.is_correct(item, result),
        }


if __name__ == "__main__":
    GaiaAgentEnv.cli()
