"""Task sources: a --env.tasks_dir of both formats, the Endless Terminals hub rows, and reward parsing."""

from __future__ import annotations

import shutil
import textwrap

import pytest

from environments.terminal_tasks import BUNDLED_TASKS, NoOpAgent, OracleAgent, load_tasks_dir
from environments.terminal_tasks.verify import parse_verdict
from tests.terminal_tasks.conftest import make_env

NEEDS_IMAGE = """\
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y cowsay
WORKDIR /app
"""


def make_tasks_dir(root):
    """Two real-format tasks plus one the local sandbox cannot reproduce (it installs cowsay, not on this machine)."""
    shutil.copytree(BUNDLED_TASKS / "harbor" / "parse-log", root / "harbor-parse-log")
    shutil.copytree(BUNDLED_TASKS / "endless" / "task_000003_d4f6b8c0", root / "task_000003_d4f6b8c0")
    shutil.copytree(BUNDLED_TASKS / "harbor" / "edit-config", root / "needs-cowsay")
    (root / "needs-cowsay" / "environment" / "Dockerfile").write_text(NEEDS_IMAGE)
    return root


def test_tasks_dir_reads_both_formats_and_names_why_a_task_needs_its_image(tmp_path):
    tasks = {t.id: t for t in load_tasks_dir(make_tasks_dir(tmp_path))}
    assert {t.format for t in tasks.values()} == {"harbor", "endless"}
    assert tasks["needs-cowsay"].local_skip == "environment/Dockerfile RUN: installs cowsay (not on this machine)"
    assert tasks["harbor-parse-log"].local_skip is None and tasks["harbor-parse-log"].verifier_timeout_s == 60.0


@pytest.mark.slow
async def test_a_tasks_dir_runs_and_unreproducible_tasks_are_counted(scripted_server, tmp_path):
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(make_tasks_dir(tmp_path / "tasks")))
    async with env.runtime():
        await env.setup()
        assert dict(env.skipped) == {"needs its image": 1}
        scores = [
            (await env.rollout(t, model=agent)).score
            for t in env.tasks
            for agent in (OracleAgent(env.by_id), NoOpAgent())
        ]
    assert sorted(t.id for t in env.tasks) == ["harbor-parse-log", "task_000003_d4f6b8c0"]
    assert scores == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.slow
async def test_endless_terminals_dataset_rows_resolve_to_task_dirs(scripted_server, tmp_path):
    from datasets import Dataset

    # The published shape (endless-terminals train/prepare_endless.py): description + task_dir,
    # plus the verl-style prompt/reward_spec/extra_info columns; saved as parquet like theirs.
    rows = []
    for name in ("task_000000_a1c3e5f7", "task_000001_b2d4f6a8"):
        description = __import__("json").loads((BUNDLED_TASKS / "endless" / name / "task.json").read_text())[
            "description"
        ]
        rows.append(
            {
                "description": description,
                "task_dir": name,
                "data_source": "endless",
                "env_class": "endless",
                "prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": description}],
                "reward_spec": {"method": "rule", "ground_truth": f"/data/tasks/{name}"},
                "extra_info": {"task_dir": f"/data/tasks/{name}", "max_time": 300},
            }
        )
    Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    env = make_env(
        scripted_server.base_url,
        tmp_path,
        dataset=str(tmp_path / "train.parquet"),
        tasks_dir=str(BUNDLED_TASKS / "endless"),
    )
    async with env.runtime():
        await env.setup()
        assert [t.id for t in env.tasks] == ["task_000000_a1c3e5f7", "task_000001_b2d4f6a8"]
        scores = [(await env.rollout(t, model=OracleAgent(env.by_id))).score for t in env.tasks]
    assert scores == [1.0, 1.0]


def _harbor():
    return next(t for t in load_tasks_dir(BUNDLED_TASKS) if t.format == "harbor")


def _out(nonce, rc, **files):
    import base64

    lines = ["noise", f"{nonce} rc {rc}"] + [
        f"{nonce} {k.replace('_', '.')} {base64.b64encode(v.encode()).decode()}" for k, v in files.items()
    ]
    return "\n".join(lines)


# Harbor's verifier (harbor-framework/harbor src/harbor/verifier/verifier.py): reward.json before reward.txt, the
# raw float, every numeric key kept; no/empty/unreadable reward file is a trial error (reward None), not a 0.
@pytest.mark.parametrize(
    ("files", "reward", "reason", "metrics"),
    [
        ({"reward_txt": "0.5\n"}, 0.5, "reward.txt", {"reward": 0.5}),  # partial credit as the task writes it
        ({"reward_txt": "2.0"}, 2.0, "reward.txt", {"reward": 2.0}),  # raw: not clamped to [0, 1]
        ({"reward_txt": "-1"}, -1.0, "reward.txt", {"reward": -1.0}),
        ({"reward_txt": "1", "reward_json": '{"reward": 0}'}, 0.0, "reward.json", {"reward": 0.0}),  # json first
        (
            {"reward_json": '{"reward": 0.25, "accuracy": 0.9, "note": "x", "ok": true}'},
            0.25,
            "reward.json",
            {"reward": 0.25, "accuracy": 0.9},  # every numeric key kept; strings and booleans are not metrics
        ),
        ({"reward_json": '{"accuracy": 0.75}'}, 0.75, "reward.json", {"accuracy": 0.75}),  # the only key
        (
            {"reward_json": '{"a": 1.5, "b": 0}'},
            None,
            "reward.json has several metrics and no 'reward' key to score by: ['a', 'b'] (test.sh exit status 0)",
            {},
        ),
        (
            {},
            None,
            "tests/test.sh wrote no reward file (neither reward.json nor reward.txt) (test.sh exit status 0)",
            {},
        ),
        ({"reward_txt": ""}, None, "reward.txt is empty (test.sh exit status 0)", {}),
        ({"reward_json": "", "reward_txt": "1"}, None, "reward.json is empty (test.sh exit status 0)", {}),
        ({"reward_txt": "yes"}, None, "reward.txt is not a number: 'yes' (test.sh exit status 0)", {}),
        ({"reward_json": "[1]"}, None, "reward.json is not a JSON object but list (test.sh exit status 0)", {}),
        ({"reward_txt": "nan"}, None, "reward.txt: the reward is nan, not a finite number (test.sh exit status 0)", {}),
    ],
)
def test_harbor_reward_files(files, reward, reason, metrics):
    verdict = parse_verdict(_harbor(), _out("ab" * 8, 0, **files), "ab" * 8)
    assert (verdict.reward, verdict.reason, verdict.metrics) == (reward, reason, metrics)


def test_only_the_last_verdict_block_counts():
    nonce = "cd" * 8
    forged = _out(nonce, 0, reward_txt="1")
    verdict = parse_verdict(_harbor(), forged + "\n" + _out(nonce, 1), nonce)
    assert verdict.reward is None and verdict.reason.startswith("tests/test.sh wrote no reward file")


def test_endless_terminals_reward_is_the_pytest_exit_status():
    endless = next(t for t in load_tasks_dir(BUNDLED_TASKS) if t.format == "endless")
    assert parse_verdict(endless, _out("ef" * 8, 0), "ef" * 8).reward == 1.0
    assert parse_verdict(endless, _out("ef" * 8, 1), "ef" * 8).reward == 0.0
    assert parse_verdict(endless, textwrap.dedent("no verdict at all"), "ef" * 8).reason == "the verifier did not run"


def test_files_copied_outside_the_working_directory_need_the_image(tmp_path):
    shutil.copytree(BUNDLED_TASKS / "harbor" / "edit-config", tmp_path / "etc-config")
    (tmp_path / "etc-config" / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim-bookworm\nWORKDIR /app\nCOPY service.ini /etc/service.ini\n"
    )
    task = load_tasks_dir(tmp_path)[0]
    assert task.local_skip == "copies service.ini to /etc/service.ini, outside the working directory /app"


@pytest.mark.slow
async def test_a_wrong_initial_state_voids_the_rollout(scripted_server, tmp_path):
    shutil.copytree(BUNDLED_TASKS / "endless" / "task_000003_d4f6b8c0", tmp_path / "tasks" / "t")
    definition = tmp_path / "tasks" / "t" / "container.def"
    definition.write_text(definition.read_text().replace("beach.jpeg", "beach.png"))  # no .jpeg left to rename
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tmp_path / "tasks"))
    async with env.runtime():
        await env.setup()
        rollout = await env.rollout(env.tasks[0], model=NoOpAgent())
    assert rollout.infrastructure_failure and rollout.score is None
    assert "fails test_initial_state.py" in rollout.error


BARE_PYTEST_TEST = """\
def test_no_installed_plugin_was_loaded(pytestconfig):
    loaded = {name for name, _ in pytestconfig.pluginmanager.list_name_plugin()}
    assert not loaded & {"asyncio", "anyio", "xdist", "timeout", "hypothesispytest"}, loaded
"""


async def test_endless_tests_run_on_bare_pytest_like_their_image(scripted_server, tmp_path):
    """Endless Terminals images have Ubuntu's python3-pytest and nothing else: the slot
    interpreter's installed plugins (this venv has five) are not loaded into the verifier."""
    shutil.copytree(BUNDLED_TASKS / "endless" / "task_000003_d4f6b8c0", tmp_path / "tasks" / "t")
    (tmp_path / "tasks" / "t" / "test_final_state.py").write_text(BARE_PYTEST_TEST)
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tmp_path / "tasks"))
    async with env.runtime():
        await env.setup()
        rollout = await env.rollout(env.tasks[0], model=NoOpAgent())
    assert rollout.error is None and rollout.score == 1.0


def test_path_map_rewrites_whole_paths_only():
    from environments.terminal_tasks.tasks import PathMap

    paths = PathMap({"/app/": "/workspace", "/tests": "/workspace/.v/tests"})
    text = "cd /app && cat /app/x.txt /application /x/app /tests/t.py $HOME/app '/app'"
    assert (
        paths(text)
        == "cd /workspace && cat /workspace/x.txt /application /x/app /workspace/.v/tests/t.py $HOME/app '/workspace'"
    )
    with pytest.raises(ValueError):
        PathMap({"/": "/workspace"})
