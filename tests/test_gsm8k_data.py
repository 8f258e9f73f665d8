"""GSM8k sources: the offline generator, a hub name, or a local file in openai/gsm8k's shape
(a JSONL of {question, answer} rows, or a directory written by `datasets`' save_to_disk)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from atroposlib.envs.base import APIServerConfig
from datasets import Dataset, DatasetDict

from environments.gsm8k.data import dataset_kind, load_local_gsm8k, synthetic_gsm8k
from environments.gsm8k.env import GSM8kAgentEnv, GSM8kAgentEnvConfig
from environments.hermes_base_env import HermesEnvError
from tests.support.cli import run_cli
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread
from tests.support.embedded import embedded_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def make_env(dataset: str, **kw) -> GSM8kAgentEnv:
    config = GSM8kAgentEnvConfig(tokenizer_name=embedded_tokenizer(), use_wandb=False, dataset=dataset, **kw)
    return GSM8kAgentEnv(config, [APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name="m", api_key="k")])


def test_kinds_of_dataset_value(tmp_path: Path) -> None:
    (tmp_path / "mine.jsonl").write_text("")
    assert dataset_kind("synthetic") == dataset_kind("offline") == "offline"
    assert dataset_kind("openai/gsm8k") == "hub"
    assert dataset_kind(str(tmp_path / "mine.jsonl")) == dataset_kind(str(tmp_path)) == "local"
    for missing in ("data/gsm8k.jsonl", "./gsm8k", str(tmp_path / "nope"), "gsm8k"):
        with pytest.raises(ValueError, match="neither 'synthetic', a hub dataset name"):
            dataset_kind(missing)


async def test_a_jsonl_in_openai_gsm8k_shape_is_the_dataset(tmp_path: Path) -> None:
    rows = synthetic_gsm8k(5, seed=9)
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r | {"extra": 1}) + "\n" for r in rows) + "\n")
    env = make_env(str(path), eval_size=2)
    await env.setup()
    assert await env.items() == rows and await env.eval_items() == rows[:2]
    assert await env.get_next_item() == rows[0]


async def test_a_save_to_disk_directory_gives_its_train_and_test_splits(tmp_path: Path) -> None:
    train, test = synthetic_gsm8k(4, seed=1), synthetic_gsm8k(3, seed=2)
    DatasetDict({"train": Dataset.from_list(train), "test": Dataset.from_list(test)}).save_to_disk(str(tmp_path / "dd"))
    env = make_env(str(tmp_path / "dd"))
    await env.setup()
    assert await env.items() == train and await env.eval_items() == test
    Dataset.from_list(train).save_to_disk(str(tmp_path / "one"))
    assert load_local_gsm8k(tmp_path / "one") == (train, train)


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"question": "q", "answer": "42"}\n', "row 1: the answer has no final '#### N' line"),
        ('{"question": "q"}\n', "row 1: expected openai/gsm8k's shape"),
        ('{"question": "q", "answer": "x\\n#### 1"}\nnot json\n', ":2 is not JSON"),
        ("\n", "has no problems"),
    ],
)
async def test_bad_rows_are_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(HermesEnvError, match=message.replace("(", r"\(")):
        await make_env(str(path)).setup()


def test_the_cli_refuses_a_missing_file_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "groups.jsonl"
    with serving_in_a_thread(ScriptedOpenAIServer([])) as server:  # reachable, so the dataset is what fails
        proc = run_cli(
            GSM8kAgentEnv,
            "process",
            "--env.dataset",
            str(tmp_path / "x.jsonl"),
            "--openai.base_url",
            server.base_url,
            "--openai.model_name",
            "scripted",
            "--env.tokenizer_name",
            embedded_tokenizer(),
            "--env.data_path_to_save_groups",
            str(out),
        )
    err = proc.stderr
    assert proc.returncode == 2, err[-2000:]
    assert "Traceback" not in err and not out.exists()
    assert "x.jsonl' is neither 'synthetic'" in err.splitlines()[-1]
