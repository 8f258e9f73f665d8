"""GAIA as published on the Hub, built offline in both layouts and both splits.

2023 layout: `2023/<split>/metadata.jsonl` with `file_name`, attachments named `<task_id>.<ext>`
beside it. 2025 layout (the Hub's parquet conversion): `2023/<split>/metadata.parquet` (written
with pyarrow) with the same columns plus `file_path` relative to the repository root, and the
per-level views `metadata.level{1,2,3}.parquet`. The test split's answers are "?".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from atroposlib.envs.base import APIServerConfig

from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer
from environments.gaia.data import GAIA_SPLITS, load_tasks
from environments.gaia.offline import offline_files, offline_tasks
from environments.gaia.env import GaiaAgentEnv, GaiaAgentEnvConfig
from tests.gaia.solver import GaiaScriptedSolver
from tests.support.scripted_openai import ScriptedOpenAIServer, tool_call

LAYOUTS = ("jsonl-2023", "parquet-2025")
ANNOTATOR = {
    "Steps": "1. Open the file.\n2. Compute.",
    "Number of steps": "2",
    "How long did this take?": "3 minutes",
    "Tools": "1. Python",
    "Number of tools": "1",
}


def published_name(task: dict) -> str:
    return task["task_id"] + Path(task["file_name"]).suffix if task["file_name"] else ""


def write_snapshot(root: Path, layout: str) -> Path:
    """A GAIA snapshot (what `snapshot_download` leaves in --dest) made from the offline tasks."""
    files = offline_files()
    for split in GAIA_SPLITS:
        directory = root / "2023" / split
        directory.mkdir(parents=True)
        rows = []
        for task in offline_tasks():
            name = published_name(task)
            if name:
                (directory / name).write_bytes(files[task["file_name"]])
            row = {
                "task_id": task["task_id"],
                "Question": task["Question"],
                "Level": task["Level"],
                "Final answer": task["Final answer"] if split == "validation" else "?",
                "file_name": name,
            }
            if layout == "parquet-2025":
                row["file_path"] = f"2023/{split}/{name}" if name else ""
            row["Annotator Metadata"] = ANNOTATOR if split == "validation" else {k: "" for k in ANNOTATOR}
            rows.append(row)
        if layout == "jsonl-2023":
            (directory / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            pq.write_table(pa.Table.from_pylist(rows), directory / "metadata.parquet")
            for level in (1, 2, 3):
                view = [r for r in rows if r["Level"] == level]
                pq.write_table(pa.Table.from_pylist(view), directory / f"metadata.level{level}.parquet")
    return root


@pytest.fixture(scope="module", params=LAYOUTS)
def snapshot(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, write_snapshot(tmp_path_factory.mktemp(request.param), request.param)


def test_every_task_and_attachment_loads_in_both_splits(snapshot) -> None:
    layout, root = snapshot
    if layout == "parquet-2025":
        assert not list(root.rglob("metadata.jsonl"))  # really the parquet path
    files, expected = offline_files(), {t["task_id"]: t for t in offline_tasks()}
    for split in GAIA_SPLITS:
        for data_dir in (root, root / "2023" / split):  # the snapshot root or the split directory
            tasks = load_tasks(data_dir, split)
            assert [t["task_id"] for t in tasks] == list(expected)
            for task in tasks:
                original = expected[task["task_id"]]
                assert task["Level"] == original["Level"] and task["Question"] == original["Question"]
                assert task["Final answer"] == (original["Final answer"] if split == "validation" else "?")
                if not original["file_name"]:
                    assert task["file_name"] == "" and task["file_path"] == ""
                    continue
                path = Path(task["file_path"])
                assert path == root / "2023" / split / published_name(original)  # no doubled 2023/<split> prefix
                assert path.read_bytes() == files[original["file_name"]]
    # The rows keep the columns they came with.
    assert load_tasks(root)[0]["Annotator Metadata"]["Number of tools"] == "1"


def test_a_split_directory_is_required(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no metadata.parquet or metadata.jsonl"):
        load_tasks(tmp_path)
    with pytest.raises(ValueError, match="split must be one of"):
        load_tasks(tmp_path, "train")


@pytest.mark.parametrize(
    "file_path, message",
    [
        ("../../../etc/passwd", "stay inside the dataset"),
        ("/etc/passwd", "stay inside the dataset"),
        ("2023/test/x.pdf", "does not lie in"),
    ],
)
def test_file_paths_outside_the_split_are_refused(tmp_path: Path, file_path: str, message: str) -> None:
    directory = tmp_path / "2023" / "validation"
    directory.mkdir(parents=True)
    (directory / "x.pdf").write_bytes(b"%PDF")
    row = {
        "task_id": "t",
        "Question": "q",
        "Level": 1,
        "Final answer": "a",
        "file_name": "x.pdf",
        "file_path": file_path,
    }
    pq.write_table(pa.Table.from_pylist([row]), directory / "metadata.parquet")
    with pytest.raises(ValueError, match=message):
        load_tasks(tmp_path)


def test_a_missing_attachment_is_named(tmp_path: Path) -> None:
    write_snapshot(tmp_path, "parquet-2025")
    victim = next((tmp_path / "2023" / "validation").glob("offline-pdf-invoice.pdf"))
    victim.unlink()
    with pytest.raises(FileNotFoundError, match="offline-pdf-invoice.*missing"):
        load_tasks(tmp_path)


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    cfg = EmbeddedLLMConfig()
    return str(ensure_gguf_tokenizer(cfg.model_path, chat_template=cfg.resolved_chat_template()))


def make_env(tokenizer_dir: str, base_url: str, tmp_path: Path, **overrides) -> GaiaAgentEnv:
    config = GaiaAgentEnvConfig(
        tokenizer_name=tokenizer_dir,
        use_wandb=False,
        data_path_to_save_groups=None,
        runtime={"workspace": {"workspace_root": str(tmp_path / "ws")}},
        **overrides,
    )
    return GaiaAgentEnv(
        config, [APIServerConfig(base_url=base_url, model_name="scripted", api_key="k", server_type="openai")]
    )


async def test_scripted_solver_solves_every_validation_task_from_the_snapshot(
    snapshot, tokenizer_dir, tmp_path
) -> None:
    _, root = snapshot
    async with ScriptedOpenAIServer([]) as server:
        env = make_env(tokenizer_dir, server.base_url, tmp_path, data_dir=str(root), split="validation")
        await env.setup()
        assert len(env.tasks) == 12
        async with env.runtime():
            for task in env.tasks:  # the solver reads the attachment by its published name
                rollout = await env.rollout(task, model=GaiaScriptedSolver(task))
                assert rollout.score == 1.0, (task["task_id"], rollout.error)


def _inspect_attachment(request: dict) -> dict:
    """Policy for evaluate: report the named attachment's size and first bytes, then answer."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        return {"content": "FINAL ANSWER: 0"}
    named = re.search(r"working directory as `([^`]+)`", messages[-1]["content"])
    if not named:
        return {"content": "FINAL ANSWER: 0"}
    return {"tool_calls": [tool_call("terminal", {"command": f"wc -c < {named.group(1)}; echo {named.group(1)}"})]}


async def test_evaluate_on_the_test_split_uploads_every_attachment(snapshot, tokenizer_dir, tmp_path) -> None:
    _, root = snapshot
    tasks = load_tasks(root, "test")
    with_files = [t for t in tasks if t["file_name"]]
    script = [_inspect_attachment] * (len(tasks) + len(with_files))
    async with ScriptedOpenAIServer(script) as server:
        env = make_env(tokenizer_dir, server.base_url, tmp_path, data_dir=str(root), split="test")
        await env.setup()
        async with env.runtime():
            await env.evaluate()
        seen = {}
        for request in server.requests:
            last = request["messages"][-1]
            if last["role"] == "tool":
                size, name = json.loads(last["content"])["output"].split()
                seen[name] = int(size)
    assert seen == {t["file_name"]: Path(t["file_path"]).stat().st_size for t in with_files}
    assert len(server.requests) == len(tasks) + len(with_files)
