"""Video QA over captions: EgoSchema / NExT-QA style multiple choice, answered from timestamped captions.

    python -m environments.video_qa_env process --env.total_steps 2 --env.group_size 2
    python -m environments.video_qa_env evaluate --env.dataset nextqa/val.csv --env.captions_dir captions/

The agent reads the video's captions by time window (`read_captions`) and searches them
(`search_captions`), then ends with `FINAL ANSWER: <letter>`. The reward is exact match of
the chosen letter with the gold option (1.0 or 0.0); an answer without a letter A-E scores 0.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any


from environments.agent_loop import AgentResult
from environments.gaia.env import extract_final_answer
from environments.dataset_source import dataset_error
from environments.hermes_base_env import HermesAgentBaseEnv, HermesEnvError, Rollout
from environments.video_qa.config import ENTRY, VideoQAEnvConfig
from environments.video_qa.data import LETTERS, OFFLINE_PATH, captions_of, load_items
from tools.context import ToolContext
from tools.documents import caption_tools, write_captions
from tools.registry import ToolRegistry

__all__ = ["VideoQAEnv", "VideoQAEnvConfig", "SYSTEM_PROMPT", "chosen_option"]

SYSTEM_PROMPT = (
    "Answer a multiple-choice question about a video you cannot see: read its timestamped captions "
    "with read_captions (a time window in seconds) and search_captions. Finish with the line\n"
    "FINAL ANSWER: <letter of the option>"
)

_LETTER = re.compile(r"^[(\[]?([A-E])(?:[)\].:]|\s|$)")


def chosen_option(response: str | None) -> int | None:
    """The option index named by the FINAL ANSWER line (`C`, `(C)`, `C. text`); None when there is none."""
    answer = extract_final_answer(response)
    m = _LETTER.match(answer.strip()) if answer else None
    return LETTERS.index(m.group(1)) if m else None


class VideoQAEnv(HermesAgentBaseEnv):
    name = ENTRY.name
    env_config_cls = VideoQAEnvConfig
    default_toolsets = ["captions"]
    default_system_prompt = SYSTEM_PROMPT

    def __init__(self, config: VideoQAEnvConfig, server_configs, slurm: bool = False, testing: bool = False) -> None:
        self._items: list[dict[str, Any]] = []
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        self.config: VideoQAEnvConfig = config

    def tool_registry(self) -> ToolRegistry:
        return ToolRegistry(caption_tools())

    def check_data(self) -> None:
        # Every source is a local file: read (and kept) before anything starts.
        c = self.config
        path = OFFLINE_PATH if c.dataset == "offline" else Path(c.dataset).expanduser()
        captions = Path(c.captions_dir).expanduser() if c.captions_dir else None
        answers = Path(c.answers_file).expanduser() if c.answers_file else None
        try:
            self._items = load_items(path, captions, answers)
        except (ValueError, OSError) as exc:
            raise HermesEnvError(dataset_error(c.dataset, exc)) from None
        if not self._items:
            raise HermesEnvError(f"--env.dataset {c.dataset!r} holds no rows; pass a file with at least one question")

    async def items(self) -> list[dict[str, Any]]:
        if not self._items:
            await asyncio.to_thread(self.check_data)
        return self._items

    async def eval_items(self) -> list[dict[str, Any]]:
        return self._items

    def format_prompt(self, item: dict[str, Any]) -> str:
        duration = max(end for _, end, _ in item["captions"])
        options = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(item["options"]))
        return f"The video lasts {duration:g} seconds.\n\n{item['question']}\n\n{options}"

    async def setup_trajectory_workspace(self, item: dict[str, Any], ctx: ToolContext) -> None:
        await write_captions(ctx, captions_of(item))

    async def compute_reward(self, item: dict[str, Any], result: AgentResult, ctx: ToolContext) -> float:
        return float(chosen_option(result.final_response) == item["answer"])

    def build_group(self, rollouts: list[Rollout]):
        group = super().build_group(rollouts)
        for info in group["rollout_info"]:
            r = rollouts[info["rollout"]]
            assert r.result is not None
            choice = chosen_option(r.result.final_response)
            info.update(
                task_id=r.item["id"],
                domain="video_qa",
                chosen=LETTERS[choice] if choice is not None else None,
                gold=LETTERS[r.item["answer"]],
            )
        return group

    def eval_sample(self, rollout: Rollout) -> dict[str, Any]:
        item, result = rollout.item, rollout.result
        choice = chosen_option(result.final_response if result else None)
        return {
            **super().eval_sample(rollout),
            "item": {k: item[k] for k in ("id", "video", "question", "options")},
            "gold": LETTERS[item["answer"]],
            "chosen": LETTERS[choice] if choice is not None else None,
        }


if __name__ == "__main__":
    VideoQAEnv.cli()
