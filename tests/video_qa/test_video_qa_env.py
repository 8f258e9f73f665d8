"""The video QA env: EgoSchema / NExT-QA rows with caption files, the caption tools in the sandbox,
exact match on the option letter, `process`/`evaluate` on a scripted server, the export's domain."""

from __future__ import annotations

import csv
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from atroposlib.envs.base import APIServerConfig

import exports
from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer
from environments.models.base import ModelTurn
from environments.video_qa.data import OFFLINE_PATH, load_items
from environments.video_qa.env import VideoQAEnv, VideoQAEnvConfig, chosen_option
from tests.support.cli import run_cli
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread, tool_call
from tools.documents import parse_captions


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    cfg = EmbeddedLLMConfig()
    return str(ensure_gguf_tokenizer(cfg.model_path, chat_template=cfg.resolved_chat_template()))


def test_published_shapes_and_caption_files(tmp_path: Path) -> None:
    offline = load_items(OFFLINE_PATH)
    assert [(i["id"], i["answer"]) for i in offline] == [
        ("ego-offline-001", 2),
        ("3001_4", 3),
        ("plain-offline-001", 1),
    ]
    assert offline[1]["captions"][0] == [0.0, 5.0, "A girl in a red coat stands beside a bicycle in a park."]
    # EgoSchema: questions.json without answers + subset_answers.json; captions named by q_uid.
    ego = {k: v for k, v in json.loads(OFFLINE_PATH.read_text().splitlines()[0]).items() if k != "answer"}
    (tmp_path / "questions.json").write_text(json.dumps([ego]))
    (tmp_path / "captions").mkdir()
    (tmp_path / "captions" / "ego-offline-001.txt").write_text("[0-3.5] C opens a door.\n\n[3.5-9] C sits down.\n")
    with pytest.raises(ValueError, match="no answer for 'ego-offline-001'"):
        load_items(tmp_path / "questions.json")
    (tmp_path / "answers.json").write_text(json.dumps({"ego-offline-001": 4}))
    (item,) = load_items(tmp_path / "questions.json", answers_file=tmp_path / "answers.json")
    assert item["answer"] == 4 and item["captions"][1] == [3.5, 9.0, "C sits down."]
    # NExT-QA: a CSV with a0..a4 and an integer answer column.
    row = json.loads(OFFLINE_PATH.read_text().splitlines()[1])
    with open(tmp_path / "val.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    with pytest.raises(ValueError, match="no caption file"):
        load_items(tmp_path / "val.csv")
    (nextqa,) = load_items(tmp_path / "val.csv", captions_dir=OFFLINE_PATH.parent / "captions")
    assert (nextqa["id"], nextqa["answer"], nextqa["options"][3]) == ("3001_4", 3, "to bring back the ball")
    with pytest.raises(ValueError, match="not '\\[start-end\\] text'"):
        parse_captions("[0-1] fine\n0:05 not a caption line")


@pytest.mark.parametrize(
    ("response", "index"),
    [
        ("FINAL ANSWER: C", 2),
        ("thinking...\nFINAL ANSWER: (B)", 1),
        ("FINAL ANSWER: E. to bark at a stranger", 4),
        ("FINAL ANSWER: D.", 3),
        ("FINAL ANSWER: Because of the ball", None),  # a word that starts with B is no letter
        ("FINAL ANSWER: F", None),
        ("I pick C", None),
        (None, None),
    ],
)
def test_chosen_option(response: str | None, index: int | None) -> None:
    assert chosen_option(response) == index


class Watcher:
    """Reads the first 20 s, searches for 'ball', then answers `letter`."""

    def __init__(self, letter: str) -> None:
        self.letter, self.plan, self.seen = letter, ["read", "search"], []

    async def chat(self, messages, tools, options) -> ModelTurn:
        self.seen = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
        step = self.plan.pop(0) if self.plan else None
        if step is None:
            return ModelTurn(content=f"FINAL ANSWER: {self.letter}")
        name, args = (
            ("read_captions", {"start_s": 6, "end_s": 12}) if step == "read" else ("search_captions", {"query": "ball"})
        )
        call = {
            "id": f"c{uuid.uuid4().hex[:6]}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        return ModelTurn(content=None, tool_calls=[call])


async def test_rollouts_read_and_search_the_captions_in_the_sandbox(tokenizer_dir: str) -> None:
    async with ScriptedOpenAIServer([]) as model_server:
        config = VideoQAEnvConfig(tokenizer_name=tokenizer_dir, use_wandb=False, data_path_to_save_groups=None)
        server = APIServerConfig(
            base_url=model_server.base_url, model_name="scripted", api_key="x", server_type="openai"
        )
        env = VideoQAEnv(config, [server])
        await env.setup()
        item = env._items[1]
        prompt = env.format_prompt(item)
        assert "lasts 30 seconds" in prompt and "D. to bring back the ball" in prompt
        assert {t["function"]["name"] for t in env.tool_schemas()} == {"read_captions", "search_captions"}
        async with env.runtime():
            right, wrong = Watcher("D"), Watcher("A")
            r1 = await env.rollout(item, model=right)
            r2 = await env.rollout(item, model=wrong)
            group = env.build_group([r1, r2])
    assert r1.error is None and r1.result.tool_errors == []
    window, search = right.seen
    assert window["captions"] == [  # the lines overlapping [6, 12]
        "[5-11] A brown dog runs toward her across the grass.",
        "[11-16] The girl bends down and pats the dog on its head.",
    ]
    assert search["results"][0].startswith("[16-24] The girl throws a yellow ball")
    assert (r1.score, r2.score) == (1.0, 0.0)
    assert [(i["domain"], i["chosen"], i["gold"]) for i in group["rollout_info"]] == [
        ("video_qa", "D", "D"),
        ("video_qa", "A", "D"),
    ]


def test_process_and_evaluate_on_a_scripted_server(tokenizer_dir: str, tmp_path: Path) -> None:
    letters = ["C", "A"]

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][-1]["role"] != "tool":
            return {"content": None, "tool_calls": [tool_call("read_captions", {"start_s": 0, "end_s": 60})]}
        return {"content": f"FINAL ANSWER: {letters.pop(0)}"}

    out = tmp_path / "groups.jsonl"
    with serving_in_a_thread(ScriptedOpenAIServer([reply] * 4)) as server:
        common = [
            "--openai.base_url",
            server.base_url,
            "--openai.model_name",
            "scripted",
            "--env.tokenizer_name",
            tokenizer_dir,
        ]
        proc = run_cli(
            VideoQAEnv, "process", *common, "--env.total_steps", "1", "--env.data_path_to_save_groups", str(out)
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    (group,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(group["scores"]) == [0.0, 1.0]  # the first item's gold is C
    assert exports.main(["trajectory", str(out), str(tmp_path / "t.jsonl")]) == 0
    trajs = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [t["domain"] for t in trajs] == ["video_qa", "video_qa"]
    assert all(t["actions"][0]["tool"] == "read_captions" for t in trajs)

    by_video = {"kitchen": "FINAL ANSWER: C", "dog": "FINAL ANSWER: (D)", "vendor": "FINAL ANSWER: A"}

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        question = next(m["content"] for m in body["messages"] if m["role"] == "user")
        return {"content": next(a for k, a in by_video.items() if k in question)}

    evals = tmp_path / "eval"
    with serving_in_a_thread(ScriptedOpenAIServer([answer] * 3)) as server:
        common = [
            "--openai.base_url",
            server.base_url,
            "--openai.model_name",
            "scripted",
            "--env.tokenizer_name",
            tokenizer_dir,
        ]
        proc = run_cli(VideoQAEnv, "evaluate", *common, "--env.data_dir_to_save_evals", str(evals))
        assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((evals / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/n"] == 3 and metrics["eval/accuracy"] == pytest.approx(2 / 3)
