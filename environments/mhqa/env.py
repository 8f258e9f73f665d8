"""Multi-hop QA: HotpotQA (distractor, fullwiki) and MuSiQue-answerable questions over the item's paragraphs.

    python -m environments.mhqa_env process --env.total_steps 2 --env.group_size 2
    python -m environments.mhqa_env evaluate --env.dataset hotpot_dev_distractor_v1.json
    python -m environments.mhqa_env process --env.dataset hotpotqa/hotpot_qa --env.hub_config distractor

The agent searches and reads the question's own paragraphs (toolset `paragraphs`: HotpotQA's
`context`, which for fullwiki rows is the retrieved set; MuSiQue's `paragraphs`; with
`--env.search_scope dataset`, every paragraph of the loaded rows), then ends with

    SUPPORTING FACTS: [["Title", 0], ["Other title", 2]]      (optional; sentence ids from open_paragraph)
    FINAL ANSWER: <answer>

The reward is the official answer F1 (`--env.reward_metric em`: exact match): HotpotQA's for its
rows, MuSiQue's (no yes/no rule) for MuSiQue's, the best over its answer aliases. Supporting-fact and joint EM/F1 are metrics, never the reward.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any


from environments.agent_loop import AgentResult
from environments.gaia.env import extract_final_answer
from environments.dataset_source import dataset_error, looks_local
from environments.hermes_base_env import HermesAgentBaseEnv, HermesEnvError, Rollout
from environments.mhqa.config import ENTRY, MHQAEnvConfig
from environments.mhqa.data import OFFLINE_PATH, load_items
from environments.mhqa.scoring import SetScores, best_answer_scores, joint_scores, sp_scores
from tools.context import ToolContext
from tools.documents import ParagraphIndex, paragraph_tools, write_paragraphs
from tools.registry import ToolRegistry

__all__ = ["MHQAEnv", "MHQAEnvConfig", "SYSTEM_PROMPT", "cited_facts", "score_response"]

SYSTEM_PROMPT = (
    "Answer the question from its paragraphs. Find them with search_paragraphs and read them with "
    "open_paragraph; the answer may need facts from two or more paragraphs. Finish with two lines:\n"
    'SUPPORTING FACTS: [["<title>", <sentence number>], ...]\n'
    "FINAL ANSWER: <answer in as few words as possible; yes or no for yes/no questions>"
)

_CITED = re.compile(r"supporting\s+facts\s*:\s*(\[.*\])\s*$", re.IGNORECASE | re.MULTILINE)


def cited_facts(response: str | None) -> list[tuple[str, int]]:
    """The `[title, sentence]` pairs of the last SUPPORTING FACTS line; none when absent or malformed."""
    matches = _CITED.findall(response or "")
    if not matches:
        return []
    try:
        facts = json.loads(matches[-1])
    except json.JSONDecodeError:
        return []
    return [
        (f[0], f[1])
        for f in facts
        if isinstance(f, list) and len(f) == 2 and isinstance(f[0], str) and type(f[1]) is int
    ]


def score_response(item: dict[str, Any], response: str | None) -> dict[str, SetScores]:
    """Answer, supporting-fact and joint scores of a final response (a missing answer scores 0)."""
    answer = extract_final_answer(response)
    if answer is None:
        ans = SetScores(0.0, 0.0, 0.0, 0.0)
    else:  # each dataset's own official rules (see environments/mhqa/scoring.py)
        ans = best_answer_scores(answer, item["answers"], hotpot_rules=item["source"] != "musique")
    sp = sp_scores(cited_facts(response), [tuple(f) for f in item["supporting_facts"]])
    return {"answer": ans, "sp": sp, "joint": joint_scores(ans, sp)}


class MHQAEnv(HermesAgentBaseEnv):
    name = ENTRY.name
    env_config_cls = MHQAEnvConfig
    default_toolsets = ["paragraphs"]
    default_system_prompt = SYSTEM_PROMPT

    def __init__(self, config: MHQAEnvConfig, server_configs, slurm: bool = False, testing: bool = False) -> None:
        self._items: list[dict[str, Any]] = []
        self._preloaded: list[dict[str, Any]] | None = None
        self._corpus: ParagraphIndex | None = None
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        self.config: MHQAEnvConfig = config

    def tool_registry(self) -> ToolRegistry:
        return ToolRegistry(paragraph_tools(self.corpus if self.config.search_scope == "dataset" else None))

    def corpus(self) -> ParagraphIndex:
        """The index of every paragraph of the loaded rows (search_scope dataset), built by items()."""
        if self._corpus is None:
            raise HermesEnvError("the paragraph corpus is built when the items load; call setup() first")
        return self._corpus

    @staticmethod
    def _index_corpus(items: list[dict[str, Any]]) -> ParagraphIndex:
        seen: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
        for item in items:
            for p in item["paragraphs"]:
                seen.setdefault((p["title"], tuple(p["sentences"])), p)  # rows share Wikipedia paragraphs
        return ParagraphIndex(list(seen.values()))

    def _load(self) -> list[dict[str, Any]]:
        c = self.config
        source = str(OFFLINE_PATH) if c.dataset == "offline" else c.dataset
        try:
            items = load_items(source, c.split, c.hub_config)
        except (ValueError, OSError) as exc:
            raise HermesEnvError(dataset_error(c.dataset, exc)) from None
        if not items:
            raise HermesEnvError(f"--env.dataset {c.dataset!r} holds no rows; pass a file with at least one question")
        return items

    def check_data(self) -> None:
        # A local file (or a path that is not there) is read now, before anything starts; a hub name loads in items().
        if self.config.dataset != "offline" and looks_local(self.config.dataset):
            self._preloaded = self._load()

    async def items(self) -> list[dict[str, Any]]:
        c = self.config
        self._items = self._preloaded if self._preloaded is not None else await asyncio.to_thread(self._load)
        if c.search_scope == "dataset":
            self._corpus = await asyncio.to_thread(self._index_corpus, self._items)
        return self._items

    async def eval_items(self) -> list[dict[str, Any]]:
        return self._items  # published dev sets are the ones with answers: evaluate runs the loaded rows

    def format_prompt(self, item: dict[str, Any]) -> str:
        if self.config.search_scope == "dataset":
            return item["question"]
        titles = ", ".join(p["title"] for p in item["paragraphs"])
        return f"{item['question']}\n\nParagraph titles: {titles}"

    async def setup_trajectory_workspace(self, item: dict[str, Any], ctx: ToolContext) -> None:
        if self.config.search_scope == "item":
            await write_paragraphs(ctx, item["paragraphs"])  # paragraphs only: no gold, no supporting flags

    async def compute_reward(self, item: dict[str, Any], result: AgentResult, ctx: ToolContext) -> float:
        return getattr(score_response(item, result.final_response)["answer"], self.config.reward_metric)

    def build_group(self, rollouts: list[Rollout]):
        group = super().build_group(rollouts)
        for info in group["rollout_info"]:
            r = rollouts[info["rollout"]]
            assert r.result is not None
            scores = score_response(r.item, r.result.final_response)
            info.update(
                task_id=r.item["id"],
                domain="mhqa",
                model_answer=extract_final_answer(r.result.final_response),
                **{f"{k}_{m}": getattr(v, m) for k, v in scores.items() for m in ("em", "f1")},
            )
        return group

    def eval_metrics(self, rollouts: list[Rollout]) -> dict[str, float]:
        done = [score_response(r.item, r.result.final_response) for r in rollouts if r.result is not None]
        out = {}
        for k in ("answer", "sp", "joint"):
            for m in ("em", "f1"):
                name = m if k == "answer" else f"{k}_{m}"
                out[f"eval/{name}"] = sum(getattr(s[k], m) for s in done) / len(done) if done else 0.0
        return {**out, "eval/mean_reward": super().eval_metrics(rollouts)["eval/accuracy"]}

    def eval_sample(self, rollout: Rollout) -> dict[str, Any]:
        item, result = rollout.item, rollout.result
        response = result.final_response if result else None
        return {
            **super().eval_sample(rollout),
            "item": {"id": item["id"], "question": item["question"], "source": item["source"]},
            "gold": item["answers"],
            "model_answer": extract_final_answer(response),
            "cited": cited_facts(response),
        }


if __name__ == "__main__":
    MHQAEnv.cli()
