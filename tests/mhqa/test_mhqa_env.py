"""The MHQA env end to end: the published row shapes, real rollouts through the paragraph tools in
the sandbox, `process`/`evaluate` against a scripted OpenAI server, the unified trajectory export."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from atroposlib.envs.base import APIServerConfig

import exports
from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer
from environments.mhqa.data import OFFLINE_PATH, load_items
from environments.mhqa.env import MHQAEnv, MHQAEnvConfig, cited_facts, score_response
from environments.models.base import ModelTurn
from tools.documents import ParagraphIndex
from tests.support.cli import run_cli
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread, tool_call

# One dev row of hotpot_qa (distractor) as the hub's parquet holds it, shortened to two paragraphs.
HUB_ROW = {
    "id": "5a8b57f25542995d1e6f1371",
    "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
    "answer": "yes",
    "type": "comparison",
    "level": "hard",
    "supporting_facts": {"title": ["Scott Derrickson", "Ed Wood"], "sent_id": [0, 0]},
    "context": {
        "title": ["Ed Wood", "Scott Derrickson"],
        "sentences": [
            ["Edward Davis Wood Jr. was an American filmmaker, actor, writer, producer, and director."],
            ["Scott Derrickson is an American director, screenwriter and producer.", "He lives in Los Angeles."],
        ],
    },
}


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    cfg = EmbeddedLLMConfig()
    return str(ensure_gguf_tokenizer(cfg.model_path, chat_template=cfg.resolved_chat_template()))


def test_every_published_shape_loads(tmp_path: Path) -> None:
    offline = load_items(str(OFFLINE_PATH))
    assert {i["source"] for i in offline} == {"hotpotqa", "musique"}
    musique = next(i for i in offline if i["source"] == "musique")
    assert musique["answers"] == ["cello", "violoncello"]
    assert musique["supporting_facts"] == [["Quill Street Ensemble", 0], ["Maren Oduya", 0]]
    # HotpotQA's own files are JSON arrays of `_id` rows with list-shaped context.
    raw = [json.loads(line) for line in OFFLINE_PATH.read_text().splitlines()]
    (tmp_path / "dev.json").write_text(json.dumps(raw[:3]))
    assert [i["id"] for i in load_items(str(tmp_path / "dev.json"))] == [i["id"] for i in offline[:3]]
    # The hub's parquet: columnar context and supporting_facts.
    pq.write_table(pa.Table.from_pylist([HUB_ROW]), tmp_path / "hub.parquet")
    (hub,) = load_items(str(tmp_path / "hub.parquet"))
    assert hub["paragraphs"][1] == {"title": "Scott Derrickson", "sentences": HUB_ROW["context"]["sentences"][1]}
    assert hub["supporting_facts"] == [["Scott Derrickson", 0], ["Ed Wood", 0]] and hub["answers"] == ["yes"]
    # A save_to_disk DatasetDict, split chosen by name.
    from datasets import Dataset, DatasetDict

    DatasetDict({"validation": Dataset.from_list([HUB_ROW])}).save_to_disk(str(tmp_path / "ds"))
    assert load_items(str(tmp_path / "ds"))[0]["id"] == HUB_ROW["id"]
    with pytest.raises(ValueError, match="splits"):
        load_items(str(tmp_path / "ds"), split="train")
    (tmp_path / "bad.jsonl").write_text(json.dumps({**raw[3], "answerable": False}) + "\n")
    with pytest.raises(ValueError, match="unanswerable"):
        load_items(str(tmp_path / "bad.jsonl"))
    (tmp_path / "other.jsonl").write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match="row 1: neither a HotpotQA row"):
        load_items(str(tmp_path / "other.jsonl"))


def test_citations_and_response_scores() -> None:
    item = load_items(str(OFFLINE_PATH))[0]
    good = 'SUPPORTING FACTS: [["Varnholt Library", 1], ["Ilse Moravec", 1]]\nFINAL ANSWER: Kettering Vale'
    s = score_response(item, good)
    assert (s["answer"].f1, s["sp"].em, s["joint"].em) == (1.0, 1.0, 1.0)
    assert cited_facts('SUPPORTING FACTS: [["A", "1"], ["B", 2], "C"]') == [("B", 2)]  # malformed pairs dropped
    assert cited_facts("SUPPORTING FACTS: [not json") == []
    none = score_response(item, "I think Kettering Vale")  # no FINAL ANSWER line: nothing to score
    assert none["answer"].f1 == 0.0 and none["sp"].f1 == 0.0


class Researcher:
    """Searches, opens the two paragraphs the search ranks first, then answers with citations."""

    def __init__(self, answer: str, cite: list[list[Any]]) -> None:
        self.answer, self.cite, self.seen = answer, cite, []
        self.plan = ["search", "open"]

    async def chat(self, messages, tools, options) -> ModelTurn:
        self.seen = [m["content"] for m in messages if m["role"] == "tool"]
        step = self.plan.pop(0) if self.plan else None
        if step == "search":
            args: dict[str, Any] = {"query": "architect Varnholt Library"}
            return ModelTurn(content=None, tool_calls=[_call("search_paragraphs", args)])
        if step == "open":
            titles = [r["title"] for r in json.loads(self.seen[-1])["results"][:2]]
            return ModelTurn(content=None, tool_calls=[_call("open_paragraph", {"title": t}) for t in titles])
        return ModelTurn(content=f"SUPPORTING FACTS: {json.dumps(self.cite)}\nFINAL ANSWER: {self.answer}")


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"c{uuid.uuid4().hex[:6]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


async def test_rollouts_read_the_items_paragraphs_in_the_sandbox(tokenizer_dir: str, tmp_path: Path) -> None:
    async with ScriptedOpenAIServer([]) as model_server:  # only answers the runtime's GET /models
        config = MHQAEnvConfig(tokenizer_name=tokenizer_dir, use_wandb=False, data_path_to_save_groups=None)
        server = APIServerConfig(
            base_url=model_server.base_url, model_name="scripted", api_key="x", server_type="openai"
        )
        env = MHQAEnv(config, [server])
        await env.setup()
        assert {t["function"]["name"] for t in env.tool_schemas()} == {"search_paragraphs", "open_paragraph"}
        item = env._items[0]
        assert "Varnholt Library" in env.format_prompt(item)
        async with env.runtime():
            right = Researcher("the Kettering Vale", [["Varnholt Library", 1], ["Ilse Moravec", 1]])
            partial = Researcher("Kettering", [["Varnholt Library", 1]])
            r1 = await env.rollout(item, model=right)
            r2 = await env.rollout(item, model=partial)
            group = env.build_group([r1, r2])
    assert r1.error is None and r1.result.tool_errors == []
    search = json.loads(right.seen[0])
    assert [r["title"] for r in search["results"][:2]] == ["Varnholt Library", "Selmar"]
    opened = json.loads(right.seen[1])[0]
    assert opened["title"] == "Varnholt Library"
    assert opened["sentences"][1].startswith("[1] It was designed by the architect Ilse Moravec")
    assert r1.score == 1.0 and r2.score == pytest.approx(2 / 3)  # "kettering" vs "kettering vale"
    a, b = group["rollout_info"]
    assert a["domain"] == b["domain"] == "mhqa" and a["task_id"] == "mh-bridge-1"
    assert (a["sp_em"], a["joint_em"], b["sp_em"], b["sp_f1"]) == (1.0, 1.0, 0.0, pytest.approx(2 / 3))


def _scripted_reply(body: dict[str, Any], answers: list[str]) -> dict[str, Any]:
    """Search once, then answer with the next of `answers` (rollouts run concurrently)."""
    if body["messages"][-1]["role"] != "tool":
        return {"content": None, "tool_calls": [tool_call("search_paragraphs", {"query": "Varnholt architect"})]}
    return {"content": f"FINAL ANSWER: {answers.pop(0)}"}


def test_process_and_evaluate_on_a_scripted_server_export_with_the_domain(tokenizer_dir: str, tmp_path: Path) -> None:
    answers = ["Kettering Vale", "Selmar"]
    out = tmp_path / "groups.jsonl"
    with serving_in_a_thread(ScriptedOpenAIServer([lambda b: _scripted_reply(b, answers)] * 4)) as server:
        common = [
            "--openai.base_url",
            server.base_url,
            "--openai.model_name",
            "scripted",
            "--env.tokenizer_name",
            tokenizer_dir,
        ]
        proc = run_cli(
            MHQAEnv,
            "process",
            *common,
            "--env.total_steps",
            "1",
            "--env.group_size",
            "2",
            "--env.data_path_to_save_groups",
            str(out),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    (group,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(group["scores"]) == [0.0, 1.0]
    assert {t["function"]["name"] for t in group["tools"]} == {"search_paragraphs", "open_paragraph"}
    assert exports.main(["trajectory", str(out), str(tmp_path / "t.jsonl")]) == 0
    trajs = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [t["domain"] for t in trajs] == ["mhqa", "mhqa"]
    assert all(t["actions"][0]["tool"] == "search_paragraphs" and t["task_id"].startswith("mh-bridge-1") for t in trajs)
    assert {t["final_answer"] for t in trajs} == {"FINAL ANSWER: Kettering Vale", "FINAL ANSWER: Selmar"}

    by_question = {  # the answer (and citations) the scripted model gives each offline question
        "architect": 'SUPPORTING FACTS: [["Varnholt Library", 1], ["Ilse Moravec", 1]]\nFINAL ANSWER: Kettering Vale',
        "same country": "FINAL ANSWER: No.",
        "completed first": "FINAL ANSWER: the Halden Tower",
        "instrument": "FINAL ANSWER: violoncello",
    }

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        question = next(m["content"] for m in body["messages"] if m["role"] == "user")
        return {"content": next(a for k, a in by_question.items() if k in question)}

    evals = tmp_path / "eval"
    with serving_in_a_thread(ScriptedOpenAIServer([reply] * 4)) as server:
        common = [
            "--openai.base_url",
            server.base_url,
            "--openai.model_name",
            "scripted",
            "--env.tokenizer_name",
            tokenizer_dir,
        ]
        proc = run_cli(MHQAEnv, "evaluate", *common, "--env.data_dir_to_save_evals", str(evals))
        assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((evals / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/n"] == 4
    assert (metrics["eval/em"], metrics["eval/f1"], metrics["eval/mean_reward"]) == (0.75, 0.75, 0.75)
    assert (metrics["eval/sp_em"], metrics["eval/joint_em"], metrics["eval/joint_f1"]) == (0.25, 0.25, 0.25)


async def test_dataset_scope_searches_every_rows_paragraphs(tokenizer_dir: str) -> None:
    async with ScriptedOpenAIServer([]) as model_server:
        config = MHQAEnvConfig(
            tokenizer_name=tokenizer_dir, use_wandb=False, data_path_to_save_groups=None, search_scope="dataset"
        )
        server = APIServerConfig(
            base_url=model_server.base_url, model_name="scripted", api_key="x", server_type="openai"
        )
        env = MHQAEnv(config, [server])
        await env.setup()
        musique = env._items[3]
        assert env.format_prompt(musique) == musique["question"]  # no titles: the agent must search
        # 15 paragraphs in the rows, 12 distinct: "Orlen Bridge" and "Tasca Viaduct" recur; the two "Selmar" differ.
        assert len(env.corpus().paragraphs) == 12
        async with env.runtime():
            # The MuSiQue question's rollout finds a HotpotQA row's paragraph: one corpus for all.
            agent = Researcher("Kettering Vale", [["Ilse Moravec", 1]])
            r = await env.rollout(musique, model=agent)
    assert r.error is None and r.result.tool_errors == []
    assert [x["title"] for x in json.loads(agent.seen[0])["results"][:2]] == ["Varnholt Library", "Selmar"]
    assert r.score == 0.0  # the answer is right for another row, not for this one


def test_a_real_hotpotqa_row() -> None:
    """HotpotQA's train row 5a8c7595... as published (first three of its ten paragraphs): sentences after
    the first start with a space, and a title may be cited for two sentences."""
    (item,) = load_items(str(Path(__file__).parent / "hotpot_train_row.json"))
    index = ParagraphIndex(item["paragraphs"])
    (opened,) = index.open("shirley temple")
    assert opened["sentences"][1].startswith(" As an adult")  # kept as published; shown stripped by the tool
    assert [h["title"] for h in index.search({"corliss", "archer", "portrayed"}, 2)] == [
        "Kiss and Tell (1945 film)",
        "Janet Waldo",
    ]
    cite = '[["Kiss and Tell (1945 film)", 0], ["Shirley Temple", 0], ["Shirley Temple", 1]]'
    s = score_response(item, f"SUPPORTING FACTS: {cite}\nFINAL ANSWER: Chief of Protocol of the United States")
    # "chief of protocol of united states" vs "chief of protocol": 3 common tokens, p 1/2, r 1
    assert (s["answer"].em, s["answer"].f1, s["sp"].em) == (0.0, pytest.approx(2 / 3), 1.0)
    assert s["joint"].f1 == pytest.approx(2 / 3) and s["joint"].em == 0.0
