"""Exports round-trip, from real batch_runner output and from GAIA env groups (what `process` writes)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from atroposlib.envs.base import APIServerConfig
from hypothesis import given, settings
from hypothesis import strategies as st

from batch_runner import BatchConfig, run_batch
from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer
import exports
from exports import (
    Conversation,
    build_tool_sft,
    canonical_messages,
    read_conversations,
    sharegpt_to_messages,
    to_openai,
    to_sharegpt,
    to_trajectory,
    trajectory_to_messages,
)
from environments.gaia.env import GaiaAgentEnv, GaiaAgentEnvConfig
from tests.gaia.solver import GaiaScriptedSolver
from tests.batch.batch_helpers import agent_policy, write_prompts
from tests.support.scripted_openai import ScriptedOpenAIServer


@pytest.fixture(scope="module")
def batch_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("batch")
    dataset = write_prompts(tmp / "p.jsonl", [{"id": f"b{i}", "prompt": f"count me {'x' * i}", "domain": "demo"} for i in range(5)])

    async def go() -> None:
        async with ScriptedOpenAIServer([agent_policy()] * 10) as server:
            await run_batch(BatchConfig(dataset_file=dataset, run_name="e", model="scripted", base_url=server.base_url,
                                        output_dir=tmp, distribution="math", request_retries=0))

    asyncio.run(go())
    return tmp / "e" / "trajectories.jsonl"


@pytest.fixture(scope="module")
def process_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GAIA groups built by the env from scripted-solver rollouts, one JSON line per group as `process` writes them."""
    tmp = tmp_path_factory.mktemp("process")
    cfg = EmbeddedLLMConfig()
    tokenizer = str(ensure_gguf_tokenizer(cfg.model_path, chat_template=cfg.resolved_chat_template()))

    async def go() -> list[dict]:
        async with ScriptedOpenAIServer([]) as server:
            env = GaiaAgentEnv(
                GaiaAgentEnvConfig(tokenizer_name=tokenizer, use_wandb=False, data_path_to_save_groups=None,
                                   workspace_root=str(tmp / "ws")),
                [APIServerConfig(base_url=server.base_url, model_name="scripted", api_key="k", server_type="openai")],
            )
            await env.setup()
            async with env.runtime():
                groups = []
                for task in env.tasks:
                    rollouts = await asyncio.gather(*(env.rollout(task, model=GaiaScriptedSolver(task)) for _ in range(2)))
                    groups.append(dict(env.build_group(list(rollouts))))
                return groups

    path = tmp / "gaia.jsonl"
    path.write_text("".join(json.dumps(g) + "\n" for g in asyncio.run(go())))
    return path


def test_reads_both_sources(batch_output: Path, process_output: Path) -> None:
    batch = list(read_conversations(batch_output))
    assert [c.source for c in batch] == ["batch_runner"] * 5 and batch[0].metadata["domain"] == "demo"
    assert batch[0].tools and batch[0].tools[0]["function"]["name"] == "python"
    process = list(read_conversations(process_output))
    assert len(process) == 24 and all(c.score == 1.0 for c in process)
    assert process[0].id.startswith("offline-") and process[0].tools  # the GAIA env puts the tools in the group


def test_round_trips(batch_output: Path, process_output: Path) -> None:
    for conv in [*read_conversations(batch_output), *read_conversations(process_output)]:
        expected = canonical_messages(conv.messages)
        sharegpt = to_sharegpt(conv)
        assert {t["from"] for t in sharegpt["conversations"]} <= {"system", "human", "gpt", "tool"}
        assert json.loads(sharegpt["tools"]) == conv.tools
        assert canonical_messages(sharegpt_to_messages(json.loads(json.dumps(sharegpt)))) == expected
        openai = to_openai(conv)
        assert canonical_messages(openai["messages"]) == expected and openai["tools"] == conv.tools
        traj = json.loads(json.dumps(to_trajectory(conv)))
        assert canonical_messages(trajectory_to_messages(traj)) == expected
        assert set(traj) == {"task_id", "domain", "question", "actions", "final_answer", "metadata"}
        assert [a["step"] for a in traj["actions"]] == list(range(1, len(traj["actions"]) + 1))


def test_trajectory_fields_from_a_gaia_rollout(process_output: Path) -> None:
    conv = next(c for c in read_conversations(process_output) if c.id.startswith("offline-web-architect-town"))
    traj = to_trajectory(conv, domain="gaia")
    assert traj["domain"] == "gaia" and traj["question"].startswith("In which town")
    assert [a["tool"] for a in traj["actions"]] == ["web_search", "web_extract", "web_search", "web_extract"]
    assert traj["actions"][0]["arguments"]["query"] and "Tromvik" in traj["actions"][3]["result"]
    assert traj["final_answer"].endswith("FINAL ANSWER: Tromvik") and traj["metadata"]["correct"] is True


def test_per_tool_sft_sets(process_output: Path, tmp_path: Path) -> None:
    trajectories = [to_trajectory(c) for c in read_conversations(process_output)]
    manifest = build_tool_sft(trajectories, tmp_path, val_fraction=0.3, seed=1)
    assert set(manifest) == {"python", "read_file", "terminal", "web_search", "web_extract"}
    assert manifest == json.loads((tmp_path / "manifest.json").read_text())
    train_tasks, val_tasks = set(), set()
    for tool, counts in manifest.items():
        for split in ("train", "val"):
            rows = [json.loads(x) for x in (tmp_path / tool / f"{split}.jsonl").read_text().splitlines()]
            assert len(rows) == counts[split]
            for row in rows:
                last = row["messages"][-1]
                assert last["role"] == "assistant" and tool in [c["function"]["name"] for c in last["tool_calls"]]
                assert row["messages"][1]["role"] == "user" and row["tools"]
                (train_tasks if split == "train" else val_tasks).add(row["task_id"])
    assert train_tasks and val_tasks and not (train_tasks & val_tasks)
    assert sum(c["train"] + c["val"] for c in manifest.values()) == sum(len(t["actions"]) for t in trajectories)


def test_cli(batch_output: Path, tmp_path: Path) -> None:
    assert exports.main(["sharegpt", str(batch_output), str(tmp_path / "s.jsonl")]) == 0
    assert len((tmp_path / "s.jsonl").read_text().splitlines()) == 5
    assert exports.main(["trajectory", str(batch_output), str(tmp_path / "t.jsonl"), "--domain", "arith"]) == 0
    assert {json.loads(x)["domain"] for x in (tmp_path / "t.jsonl").read_text().splitlines()} == {"arith"}
    assert exports.main(["sft", str(batch_output), str(tmp_path / "sft"), "--val_fraction", "0"]) == 0
    assert json.loads((tmp_path / "sft/manifest.json").read_text()) == {"python": {"train": 5, "val": 0}}


def test_unknown_input_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"foo": 1}\n')
    with pytest.raises(ValueError, match="x.jsonl:1 is neither"):
        list(read_conversations(bad))


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40).filter(lambda s: "<tool_call>" not in s)
_args = st.one_of(st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), _text), max_size=3), _text)


@st.composite
def conversations(draw) -> Conversation:
    messages = [{"role": "system", "content": draw(_text)}, {"role": "user", "content": draw(_text)}]
    for turn in range(draw(st.integers(0, 3))):
        names = draw(st.lists(st.sampled_from(["python", "web_search", "read_file"]), min_size=1, max_size=2))
        calls = [{"id": f"x{turn}{i}", "type": "function",
                  "function": {"name": n, "arguments": json.dumps(a) if isinstance(a := draw(_args), dict) else a}}
                 for i, n in enumerate(names)]
        messages.append({"role": "assistant", "content": draw(st.one_of(st.none(), _text)), "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": draw(_text)} for c in calls]
    messages.append({"role": "assistant", "content": draw(_text)})
    return Conversation("h", messages, [], "batch_runner")


@settings(max_examples=150, deadline=None)
@given(conversations())
def test_round_trips_on_generated_conversations(conv: Conversation) -> None:
    expected = canonical_messages(conv.messages)
    assert canonical_messages(sharegpt_to_messages(to_sharegpt(conv))) == expected
    assert canonical_messages(trajectory_to_messages(to_trajectory(conv))) == expected
