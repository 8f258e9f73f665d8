"""Exports round-trip, from real batch_runner output and from the groups all three envs' `process` writes;
tools survive, SFT splits keep each question on one side, bad input fails in one line."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from atroposlib.envs.base import APIServerConfig
from hypothesis import given, settings
from hypothesis import strategies as st

import exports
from batch_runner import BatchConfig, run_batch
from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer
from environments.gaia.env import GaiaAgentEnv, GaiaAgentEnvConfig
from environments.gsm8k.data import synthetic_gsm8k
from environments.gsm8k.env import GSM8kAgentEnv, GSM8kAgentEnvConfig
from environments.swe_smith.env import SweSmithOracleEnv, SweSmithOracleEnvConfig
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
from tests.batch.batch_helpers import agent_policy, write_prompts
from tests.gaia.solver import GaiaScriptedSolver
from tests.support.scripted_openai import ScriptedOpenAIServer, tool_call
from tests.support.embedded import embedded_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def batch_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("batch")
    dataset = write_prompts(
        tmp / "p.jsonl", [{"id": f"b{i}", "prompt": f"count me {'x' * i}", "domain": "demo"} for i in range(5)]
    )

    async def go() -> None:
        async with ScriptedOpenAIServer([agent_policy()] * 10) as server:
            await run_batch(
                BatchConfig(
                    dataset_file=dataset,
                    run_name="e",
                    model="scripted",
                    base_url=server.base_url,
                    output_dir=tmp,
                    distribution="math",
                    runtime={"model_max_retries": 0},
                )
            )

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
                GaiaAgentEnvConfig(
                    tokenizer_name=tokenizer,
                    use_wandb=False,
                    data_path_to_save_groups=None,
                    runtime={"workspace": {"workspace_root": str(tmp / "ws")}},
                ),
                [APIServerConfig(base_url=server.base_url, model_name="scripted", api_key="k", server_type="openai")],
            )
            await env.setup()
            async with env.runtime():
                groups = []
                for task in env.tasks:
                    rollouts = await asyncio.gather(
                        *(env.rollout(task, model=GaiaScriptedSolver(task)) for _ in range(2))
                    )
                    groups.append(dict(env.build_group(list(rollouts))))
                return groups

    path = tmp / "gaia.jsonl"
    path.write_text("".join(json.dumps(g) + "\n" for g in asyncio.run(go())))
    return path


async def _process(env, tmp: Path, steps: int) -> Path:
    """Run the env's real `process` loop (what the CLI command runs) and return its groups file."""
    env.process_mode = True
    env.n_groups_to_process = steps
    env.group_size_to_process = env.config.group_size
    await env.process_manager()
    return Path(env.config.data_path_to_save_groups)


def _python_then_answer(request: dict) -> dict:
    if request["messages"][-1]["role"] == "tool":
        return {"content": "The answer is \\boxed{7}."}
    return {"tool_calls": [tool_call("python", {"code": "print(3 + 4)"})]}


@pytest.fixture(scope="module")
def gsm8k_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GSM8k groups from `process` over a local JSONL in openai/gsm8k's shape (3 groups of 2 over 2 questions)."""
    tmp = tmp_path_factory.mktemp("gsm8k")
    data = tmp / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in synthetic_gsm8k(2, seed=5)))

    async def go() -> Path:
        async with ScriptedOpenAIServer([_python_then_answer] * 12) as server:
            config = GSM8kAgentEnvConfig(
                tokenizer_name=embedded_tokenizer(),
                use_wandb=False,
                group_size=2,
                total_steps=3,
                dataset=str(data),
                data_path_to_save_groups=str(tmp / "groups.jsonl"),
                ensure_scores_are_not_same=False,
                include_messages=True,
                runtime={"workspace": {"workspace_root": str(tmp / "ws")}},
            )
            env = GSM8kAgentEnv(config, [APIServerConfig(base_url=server.base_url, model_name="scripted", api_key="k")])
            return await _process(env, tmp, 3)

    return asyncio.run(go())


@pytest.fixture(scope="module")
def swe_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("swe")

    async def go() -> Path:
        async with ScriptedOpenAIServer([]) as server:
            config = SweSmithOracleEnvConfig(
                tokenizer_name=embedded_tokenizer(),
                use_wandb=False,
                group_size=2,
                total_steps=1,
                agent="oracle",
                runtime={  # the oracle agent's own diff, not model code: unconfined
                    "tool_backend": "local",
                    "unconfined_tools": True,
                    "workspace": {"workspace_root": str(tmp / "ws")},
                },
                ensure_scores_are_not_same=False,
                data_path_to_save_groups=str(tmp / "groups.jsonl"),
                include_messages=True,
            )
            env = SweSmithOracleEnv(
                config, [APIServerConfig(base_url=server.base_url, model_name="scripted", api_key="k")]
            )
            return await _process(env, tmp, 1)

    return asyncio.run(go())


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


def test_every_env_keeps_its_tool_schemas(gsm8k_output: Path, swe_output: Path, process_output: Path) -> None:
    expected = {
        gsm8k_output: {"python"},
        swe_output: {"terminal"},
        process_output: {"python", "read_file", "terminal", "web_search", "web_extract"},
    }
    for path, must_offer in expected.items():
        conversations = list(read_conversations(path))
        assert conversations and all(c.source == "process" for c in conversations)
        for conv in conversations:
            offered = {t["function"]["name"] for t in conv.tools}
            assert must_offer <= offered, (path, offered)
            assert json.loads(to_sharegpt(conv)["tools"]) == conv.tools == to_openai(conv)["tools"]
            assert to_trajectory(conv)["metadata"]["tools"] == conv.tools
            called = {c["function"]["name"] for m in conv.messages for c in m.get("tool_calls") or []}
            assert called <= offered  # every call the rollout made is to a tool the export describes


def test_rollouts_of_one_question_never_straddle_the_split(
    gsm8k_output: Path, process_output: Path, tmp_path: Path
) -> None:
    gsm8k = [to_trajectory(c) for c in read_conversations(gsm8k_output)]
    # 3 groups over 2 questions: ids item#1.0/item#1.1 and item#3.x share a question with different ids.
    assert len({t["task_id"] for t in gsm8k}) == 6 and len({t["question"] for t in gsm8k}) == 2
    gaia = [to_trajectory(c) for c in read_conversations(process_output)]
    sides_seen = set()
    for seed in range(12):
        out = tmp_path / f"s{seed}"
        build_tool_sft(gsm8k + gaia, out, val_fraction=0.5, seed=seed)
        questions: dict[str, set[str]] = {"train": set(), "val": set()}
        for split in questions:
            for rows in out.glob(f"*/{split}.jsonl"):
                for row in map(json.loads, rows.read_text().splitlines()):
                    questions[split].add(next(m["content"] for m in row["messages"] if m["role"] == "user"))
        assert not (questions["train"] & questions["val"]), seed
        sides_seen |= {s for s, q in questions.items() if q}
    assert sides_seen == {"train", "val"}


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "is not a file"),
        ("not json\n", ":1 is not JSON"),
        ('{"foo": 1}\n', ":1 is neither a batch_runner result"),
        (
            '{"messages": [[{"role": "user", "content": "q"}]], "scores": [1.0]}\n'
            '{"messages": ["oops"], "scores": [1.0]}\n',
            ":2: messages[0] is not a list",
        ),
        ('{"prompt_id": "p", "messages": [{"role": "assistant", "tool_calls": [{"id": "1"}]}]}\n', "lacks the key"),
    ],
)
@pytest.mark.parametrize("fmt", ["sharegpt", "openai", "trajectory", "sft"])
def test_bad_input_is_one_line_exit_2_and_no_output(tmp_path: Path, capsys, fmt: str, content, message: str) -> None:
    src = tmp_path / "in.jsonl"
    if content is not None:
        src.write_text(content)
    out = tmp_path / "out" / ("sft" if fmt == "sft" else "out.jsonl")
    if "lacks the key" in message:  # each format finds the broken call its own way
        message = {"openai": "has no function name", "sharegpt": "lacks the key"}.get(fmt, "needs a user question")
    assert exports.main([fmt, str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not out.exists() and not out.parent.exists()


def test_bad_cli_input_has_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "exports",
            "openai",
            str(tmp_path / "nope.jsonl"),
            str(tmp_path / "o.jsonl"),
            "--val_fraction",
            "0.2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "o.jsonl").exists()
    assert exports.main(["sft", str(tmp_path / "nope.jsonl"), str(tmp_path / "d"), "--val_fraction", "1.5"]) == 2


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40).filter(lambda s: "<tool_call>" not in s)
_args = st.one_of(st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), _text), max_size=3), _text)


@st.composite
def conversations(draw) -> Conversation:
    messages = [{"role": "system", "content": draw(_text)}, {"role": "user", "content": draw(_text)}]
    for turn in range(draw(st.integers(0, 3))):
        names = draw(st.lists(st.sampled_from(["python", "web_search", "read_file"]), min_size=1, max_size=2))
        calls = [
            {
                "id": f"x{turn}{i}",
                "type": "function",
                "function": {"name": n, "arguments": json.dumps(a) if isinstance(a := draw(_args), dict) else a},
            }
            for i, n in enumerate(names)
        ]
        messages.append({"role": "assistant", "content": draw(st.one_of(st.none(), _text)), "tool_calls": calls})
        messages += [
            {"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": draw(_text)}
            for c in calls
        ]
    messages.append({"role": "assistant", "content": draw(_text)})
    return Conversation("h", messages, [], "batch_runner")


@settings(max_examples=150, deadline=None)
@given(conversations())
def test_round_trips_on_generated_conversations(conv: Conversation) -> None:
    expected = canonical_messages(conv.messages)
    assert canonical_messages(sharegpt_to_messages(to_sharegpt(conv))) == expected
    assert canonical_messages(trajectory_to_messages(to_trajectory(conv))) == expected


def test_sharegpt_from_elsewhere_reads_trailing_calls_and_keeps_malformed_markup_as_text() -> None:
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
    record = {
        "conversations": [
            {"from": "human", "value": "go"},
            {"from": "gpt", "value": f"I will run it.\n{call}"},  # no n_tool_calls: not written by us
            {"from": "tool", "value": '<tool_response>\n{"name": "python", "content": "1"}\n</tool_response>'},
            {"from": "gpt", "value": "odd <tool_call>\n{not json\n</tool_call>"},
        ]
    }
    messages = sharegpt_to_messages(record)
    assert messages[1]["content"] == "I will run it." and messages[1]["tool_calls"][0]["function"]["name"] == "python"
    assert messages[3] == {"role": "assistant", "content": "odd <tool_call>\n{not json\n</tool_call>"}


def test_sft_with_nothing_to_export_says_why_and_fails(batch_output: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "sft"
    assert exports.main(["sft", str(batch_output), str(out), "--min_score", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "nothing to export: none of the 5 trajectories scores at least --min_score 2.0"
    assert not out.exists()  # no manifest that looks like a result
    talk = Conversation("t1", [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], score=1.0)
    with pytest.raises(exports.NothingToExport, match="none of the 1 trajectories calls a tool"):
        build_tool_sft([to_trajectory(talk)], out)
    with pytest.raises(exports.NothingToExport, match="holds no trajectory"):
        build_tool_sft([], out)
    assert not out.exists()
