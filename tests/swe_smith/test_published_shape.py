"""SWE-smith as published: a local mirror (bare repo per mirror name, branch per instance, base_commit = the
bug commit), a JSONL of instances, rows that name an image or a non-pytest test command, unusable rows."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from atroposlib.envs.base import APIServerConfig

from backends import LocalBackendConfig
from environments.hermes_base_env import HermesEnvError
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.swe_smith.env import (
    NoOpAgent,
    OracleAgent,
    SweSmithOracleEnv,
    SweSmithOracleEnvConfig,
)
from environments.swe_smith.instances import (
    SweSmithInstance,
    build_test_command,
    load_instances,
    load_offline_instances,
    profile_for,
    read_rows,
)
from environments.verifier import parse_junit_statuses, parse_test_statuses, runs_pytest
from slots.pool import SlotPoolConfig
from tests.support.cli import CliRun, run_cli
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread
from tests.swe_smith.conftest import git
from tests.support.embedded import embedded_tokenizer


def make_env(tmp_path, published, base_url: str, **overrides) -> SweSmithOracleEnv:
    pool = SlotPoolConfig(slots_per_sandbox=4, min_sandboxes=1, max_sandboxes=1, health_interval_s=30)
    config = SweSmithOracleEnvConfig(
        tokenizer_name=embedded_tokenizer(),
        use_wandb=False,
        group_size=1,
        total_steps=1,
        runtime={
            "tool_backend": "sandbox",
            "sandbox": SandboxToolBackendConfig(backend=LocalBackendConfig(pool=pool, data_root=str(tmp_path / "sb"))),
        },
        data_path_to_save_groups=str(tmp_path / "out" / "groups.jsonl"),
        ensure_scores_are_not_same=False,
        dataset=str(published["dataset"]),
        mirror_base=str(published["mirrors"]),
        profiles=str(published["profiles"]),
        cache_dir=str(tmp_path / "cache"),
        **overrides,
    )
    return SweSmithOracleEnv(config, [APIServerConfig(base_url=base_url, model_name="scripted", api_key="x")])


def test_rows_parse_in_the_published_shape(published):
    inst = SweSmithInstance.model_validate(published["rows"][1])
    assert inst.FAIL_TO_PASS == ["tests/test_calc.py::test_mean"]  # JSON text, as on the hub
    assert inst.name == "tinycalc" and inst.repo_name.startswith("hermes__tinycalc.")
    assert inst.source("https://github.com") == f"https://github.com/{inst.repo}.git"
    assert inst.source(str(published["mirrors"])) == str(published["mirrors"] / f"{inst.repo}.git")
    # base_commit is the tip of the branch named after the instance: Initial commit -> Bug Patch -> Remove F2P Tests
    bare = published["mirrors"] / f"{inst.repo}.git"
    assert git("rev-parse", f"refs/heads/{inst.instance_id}", cwd=bare) == inst.base_commit
    assert git("log", "--format=%s", inst.base_commit, cwd=bare).splitlines() == [
        "Remove F2P Tests",
        "Bug Patch",
        "Initial commit",
    ]
    assert git("rev-parse", f"{inst.base_commit}~2", cwd=bare) == git("rev-parse", "main", cwd=bare)
    assert git("diff", "--name-status", f"{inst.base_commit}^", inst.base_commit, cwd=bare) == "D\ttests/test_calc.py"


def test_published_profiles_give_the_test_command():
    pygments = profile_for("swesmith/pygments__pygments.27649ebb")
    assert pygments["language"] == "python" and "pytest" in pygments["test_cmd"]
    assert pygments["image_name"] == "swebench/swesmith.x86_64.pygments_1776_pygments.27649ebb"
    inst = SweSmithInstance(
        instance_id="pygments__pygments.27649ebb.x",
        repo="swesmith/pygments__pygments.27649ebb",
        patch="",
        FAIL_TO_PASS=["tests/test_a.py::t"],
        PASS_TO_PASS=["tests/test_b.py::u"],
    )
    on_base = build_test_command(inst, pygments, python="/py/bin/python", on_image=False)
    assert on_base.startswith("/py/bin/python -m pytest --disable-warnings") and "conda" not in on_base
    assert on_base.endswith("tests/test_a.py tests/test_b.py")
    assert build_test_command(inst, pygments, python="python", on_image=True).startswith(
        "source /opt/miniconda3/bin/activate;"
    )
    # SWE-smith's install commands come with the profile; a prepared env's interpreter replaces `python`
    # and `pytest`, and an interpreter path that merely contains "pytest" does not make a command pytest's
    assert profile_for("swesmith/marshmallow-code__apispec.8b421526")["install_cmds"] == ["pip install -e .[dev]"]
    venv = 'PYTHONPATH="$PWD"/src /tmp/pytest-of-root/envs/venv/bin/python'
    assert build_test_command(inst, pygments, python=venv, on_image=False).startswith(f"{venv} -m pytest --disable")
    unittest = build_test_command(inst, {"test_cmd": "python -m unittest -v"}, python=venv, on_image=False)
    assert unittest == f"{venv} -m unittest -v" and not runs_pytest(unittest)
    go = profile_for("swesmith/gin-gonic__gin.3c12d2a8")
    assert go.get("language", "golang") == "golang"
    assert build_test_command(inst, {}, python="python", on_image=False).startswith(
        "python -m pytest --disable-warnings --color=no --tb=no --verbose"
    )


def test_unusable_rows_are_counted_by_reason(tmp_path):
    base = {"patch": "", "FAIL_TO_PASS": ["t"], "problem_statement": "p", "base_commit": "a" * 40}
    rows = [
        base | {"instance_id": "ContentSquare__chproxy.a9364c8b.x", "repo": "swesmith/ContentSquare__chproxy.a9364c8b"},
        base | {"instance_id": "o__n.12345678.a", "repo": "swesmith/o__n.12345678", "image_name": "swebench/x"},
        base | {"instance_id": "o__n.12345678.b", "repo": "swesmith/o__n.12345678", "problem_statement": ""},
        base | {"instance_id": "o__n.12345678.c", "repo": "swesmith/o__n.12345678", "FAIL_TO_PASS": []},
        {"instance_id": "o__n.12345678.d", "repo": "swesmith/o__n.12345678"},
        base | {"instance_id": "o__n.12345678.e", "repo": "swesmith/o__n.12345678"},
        base | {"instance_id": "o__n.12345678.e", "repo": "swesmith/o__n.12345678"},
    ]
    usable, skipped = load_instances(rows, run_images=False, mirror_base="https://github.com")
    assert [i.instance_id for i in usable] == ["o__n.12345678.e"]
    assert dict(skipped) == {
        "golang repository: needs its image, the base environment runs Python": 1,
        "needs its image (image_name); this backend runs only its base environment (--env.image_policy base)": 1,
        "empty problem_statement": 1,
        "no FAIL_TO_PASS tests": 1,
        "invalid row (patch, FAIL_TO_PASS)": 1,
        "duplicate instance_id": 1,
    }
    usable, skipped = load_instances(rows[1:2], run_images=False, mirror_base=str(tmp_path))
    assert not usable and set(skipped) == {
        "needs its image (image_name); this backend runs only its base environment (--env.image_policy base)"
    }
    usable, skipped = load_instances(rows[1:2], run_images=True, mirror_base=str(tmp_path))
    assert not usable and dict(skipped) == {f"no mirror under {tmp_path}": 1}


@pytest.mark.parametrize("as_dict", [False, True])
def test_a_saved_dataset_directory_loads_like_the_jsonl(tmp_path, published, as_dict):
    from datasets import Dataset, DatasetDict

    # On the hub the test lists are JSON text in every row.
    rows = [
        r | {k: r[k] if isinstance(r[k], str) else json.dumps(r[k]) for k in ("FAIL_TO_PASS", "PASS_TO_PASS")}
        for r in published["rows"]
    ]
    saved = Dataset.from_list(rows)
    (DatasetDict({"train": saved}) if as_dict else saved).save_to_disk(str(tmp_path / "saved"))
    from_dir = load_instances(
        read_rows(str(tmp_path / "saved"), "train"), run_images=True, mirror_base=str(published["mirrors"])
    )
    from_jsonl = load_instances(
        read_rows(str(published["dataset"]), "train"), run_images=True, mirror_base=str(published["mirrors"])
    )
    assert from_dir == from_jsonl and len(from_dir[0]) == 3
    if as_dict:
        with pytest.raises(HermesEnvError, match="has splits \\['train'\\], not 'test'"):
            read_rows(str(tmp_path / "saved"), "test")


def test_status_parsers_read_each_runner():
    log = (
        "tests/test_a.py::test_x PASSED                [ 50%]\n"
        "tests/test_a.py::test_y[1-2] FAILED           [100%]\n"
        "PASSED tests/test_b.py::test_z\n"
        "test_len (tests.test_r.RTest.test_len) ... ok\n"
        "test_pop (tests.test_r.RTest.test_pop) ... FAIL\n"
        "--- PASS: TestGo (0.00s)\n"
        "test tests::it_works ... ok\n"
    )
    assert parse_test_statuses(log) == {
        "tests/test_a.py::test_x": "PASSED",
        "tests/test_a.py::test_y[1-2]": "FAILED",
        "tests/test_b.py::test_z": "PASSED",
        "tests.test_r.RTest.test_len": "PASSED",
        "tests.test_r.RTest.test_pop": "FAILED",
        "TestGo": "PASSED",
        "tests::it_works": "PASSED",
    }


def test_junit_report_gives_pytest_node_ids():
    xml = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_x" file="tests/test_a.py" line="3" time="0.001" />
<testcase classname="tests.test_a.TestK" name="test_y[1-2]" file="tests/test_a.py" line="9" time="0.001">
<failure message="assert 1 == 2">...</failure></testcase>
<testcase classname="tests.test_b" name="test_s" file="tests/test_b.py" line="1" time="0"><skipped type="pytest.skip" message="x"/></testcase>
<testcase classname="tests.test_b" name="test_xf" file="tests/test_b.py" line="5" time="0"><skipped type="pytest.xfail" message="x"/></testcase>
<testcase classname="tests.test_b" name="test_e" file="tests/test_b.py" line="7" time="0"><error message="fixture"/></testcase>
</testsuite></testsuites>"""
    assert parse_junit_statuses(xml) == {
        "tests/test_a.py::test_x": "PASSED",
        "tests/test_a.py::TestK::test_y[1-2]": "FAILED",
        "tests/test_b.py::test_s": "SKIPPED",
        "tests/test_b.py::test_xf": "XFAIL",
        "tests/test_b.py::test_e": "ERROR",
    }
    assert parse_junit_statuses("tests/test_a.py::test_x PASSED") == {}


@pytest.mark.slow
async def test_oracle_one_noop_zero_skips_counted_and_preds_round_trip(tmp_path, published, capfd):
    async with (
        ScriptedOpenAIServer([]) as server,
        make_env(tmp_path, published, server.base_url, image_policy="base").runtime() as env,
    ):
        await env.setup()
        ids = [i.instance_id for i in env.instances]
        assert ids == [published["rows"][i]["instance_id"] for i in (0, 1, 3)]
        assert dict(env.skipped) == {"empty problem_statement": 1, f"no mirror under {published['mirrors']}": 1}
        oracle, noop = OracleAgent(env.by_id), NoOpAgent()
        rollouts = await asyncio.gather(*(env.rollout(i, model=oracle) for i in env.instances))
        rollouts += await asyncio.gather(*(env.rollout(i, model=noop) for i in env.instances))
    assert (
        "3 usable instances of 5 rows; skipped: 1 empty problem_statement; 1 no mirror under" in capfd.readouterr().err
    )
    assert [r.error for r in rollouts] == [None] * 6
    assert [r.score for r in rollouts] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    # the unittest repository really ran its own command
    assert any("RingBufferTest" in t for v in env.verdicts.values() for t in v.statuses)

    preds = [json.loads(line) for line in (tmp_path / "out" / "preds.jsonl").read_text().splitlines()]
    assert len(preds) == 6 and {p["model_name_or_path"] for p in preds} == {"scripted"}
    rows = {r["instance_id"]: r for r in published["rows"]}
    for n, pred in enumerate(preds):
        assert set(pred) >= {"instance_id", "model_name_or_path", "model_patch"}
        row = rows[pred["instance_id"]]
        assert (
            _score_independently(tmp_path / str(n), published, row, pred["model_patch"]) == pred["hermes"]["score"]
        ), pred
    assert sorted(p["hermes"]["score"] for p in preds) == [0.0] * 3 + [1.0] * 3


def _score_independently(tmp_path: Path, published: dict, row: dict, model_patch: str) -> float:
    """As SWE-smith's harness: the instance branch, `git checkout HEAD~1` (the tests back), the prediction
    applied with git, the test files checked out again, the tests run with pytest/unittest."""
    work = tmp_path / "replay" / row["instance_id"]
    git("clone", "-q", "--branch", row["instance_id"], str(published["mirrors"] / f"{row['repo']}.git"), str(work))
    assert git("rev-parse", "HEAD", cwd=work) == row["base_commit"]
    git("-c", "advice.detachedHead=false", "checkout", "-q", "HEAD~1", cwd=work)
    if model_patch:
        git("apply", "-", cwd=work, stdin=model_patch)
    git("checkout", "-q", "--", "tests", cwd=work)
    f2p = row["FAIL_TO_PASS"] if isinstance(row["FAIL_TO_PASS"], list) else json.loads(row["FAIL_TO_PASS"])
    p2p = row["PASS_TO_PASS"] if isinstance(row["PASS_TO_PASS"], list) else json.loads(row["PASS_TO_PASS"])
    runner = (
        ["-m", "unittest"]
        if row["repo"] == published["ring_repo"]
        else ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
    )
    proc = subprocess.run([sys.executable, *runner, *f2p, *p2p], cwd=work, capture_output=True, text=True, check=False)
    return 1.0 if proc.returncode == 0 else 0.0


@pytest.mark.slow
async def test_instances_naming_an_image_are_skipped_on_the_local_backend(tmp_path, published):
    async with ScriptedOpenAIServer([]) as server, make_env(tmp_path, published, server.base_url).runtime() as env:
        await env.setup()
        assert [i.instance_id for i in env.instances] == [published["rows"][0]["instance_id"]]
        reasons = dict(env.skipped)
        fixed = await env.rollout(env.instances[0], model=OracleAgent(env.by_id))
    assert sum(reasons.values()) == 4 and any("image" in why and n == 2 for why, n in reasons.items())
    assert fixed.score == 1.0


@pytest.mark.slow
def test_cli_evaluate_through_mirror_base_and_dataset_path(tmp_path, published):
    def evaluate(agent: str) -> CliRun:
        return run_cli(
            SweSmithOracleEnv,
            "evaluate",
            "--openai.base_url",
            server.base_url,
            "--openai.model_name",
            "scripted",
            "--openai.api_key",
            "x",
            "--env.tokenizer_name",
            embedded_tokenizer(),
            "--env.agent",
            agent,
            "--env.dataset",
            str(published["dataset"]),
            "--env.mirror_base",
            str(published["mirrors"]),
            "--env.profiles",
            str(published["profiles"]),
            "--env.image_policy",
            "base",
            "--env.cache_dir",
            str(tmp_path / "cache"),
            "--env.data_path_to_save_groups",
            str(tmp_path / agent / "groups.jsonl"),
            "--env.data_dir_to_save_evals",
            str(tmp_path / agent / "eval"),
        )

    with serving_in_a_thread(ScriptedOpenAIServer([])) as server:
        oracle, noop = evaluate("oracle"), evaluate("noop")
    for proc, resolved in ((oracle, 1.0), (noop, 0.0)):
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "3 usable instances of 5 rows; skipped: 1 empty problem_statement; 1 no mirror" in proc.stderr
        assert f"'eval/resolved': {resolved}" in proc.stdout and "'eval/skipped': 2" in proc.stdout
    preds = [json.loads(x) for x in (tmp_path / "oracle" / "preds.jsonl").read_text().splitlines()]
    assert len(preds) == 3 and all(p["model_patch"].startswith("diff --git") for p in preds)


@pytest.mark.slow
def test_a_bad_dataset_path_is_one_line_and_exit_2(tmp_path):
    proc = run_cli(
        SweSmithOracleEnv,
        "evaluate",
        "--openai.base_url",
        "http://127.0.0.1:9/v1",
        "--env.dataset",
        str(tmp_path / "missing.jsonl"),
        "--env.data_path_to_save_groups",
        str(tmp_path / "g.jsonl"),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "is neither 'offline', an existing JSONL/JSON file" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("mode", ["files", "ids", "none"])
def test_the_prompt_names_the_failing_test_files_by_default(tmp_path, published, mode):
    env = make_env(tmp_path, published, "http://127.0.0.1:9/v1", prompt_tests=mode)
    f2p = [f"tests/test_{i % 3}.py::TestK::test_case_{i}[param-{i}]" for i in range(400)]
    inst = SweSmithInstance.model_validate(published["rows"][0] | {"FAIL_TO_PASS": f2p})
    prompt = env.format_prompt(inst)
    assert f"Instance: {inst.instance_id}\nRepository path: tinycalc\n" in prompt  # what OracleAgent reads
    expected = {
        "files": "\nFailing tests: 400 in tests/test_0.py, tests/test_1.py, tests/test_2.py",
        "ids": f"\nFailing tests: {', '.join(f2p)}",
        "none": "(relative to your working directory)",
    }[mode]
    assert prompt.endswith(expected)
    assert len(prompt) < 600 if mode != "ids" else len(prompt) > 15_000


REAL_BRANCH = json.loads((Path(__file__).parent / "data" / "real_branch_shape.json").read_text())


def _branch_shape(bare: Path, head: str) -> dict:
    log = [line.split("|") for line in git("log", "--format=%s|%P", head, cwd=bare).splitlines()]
    return {
        "commits": [(subject, len(parents.split())) for subject, parents in log],
        "main_is_initial_commit": git("rev-parse", f"{head}~2", cwd=bare) == git("rev-parse", "main", cwd=bare),
        "removal_statuses": {
            line.split("\t")[0] for line in git("diff", "--name-status", f"{head}^", head, cwd=bare).splitlines()
        },
        "bug_statuses": {
            line.split("\t")[0] for line in git("diff", "--name-status", f"{head}~2", f"{head}^", cwd=bare).splitlines()
        },
    }


def test_fixture_and_offline_mirrors_have_the_real_branch_shape(tmp_path, published):
    """Both mirror builders (the tests' and the env's offline one) against a real SWE-smith task branch's
    history, recorded in tests/swe_smith/data/real_branch_shape.json."""
    real = {
        "commits": [(c["subject"], c["parents"]) for c in REAL_BRANCH["commits"]],
        "main_is_initial_commit": True,
        "removal_statuses": {line.split("\t")[0] for line in REAL_BRANCH["remove_f2p_tests"]},
        "bug_statuses": {line.split("\t")[0] for line in REAL_BRANCH["bug_patch"]},
    }
    assert real["commits"] == [("Remove F2P Tests", 1), ("Bug Patch", 1), ("Initial commit", 0)]
    assert REAL_BRANCH["task_branches_with_this_history"] == REAL_BRANCH["task_branches"] == 301
    row = published["rows"][0]
    assert _branch_shape(published["mirrors"] / f"{row['repo']}.git", row["base_commit"]) == real
    mirror_base, offline = load_offline_instances(cache_dir=tmp_path)
    for inst in offline:
        assert _branch_shape(Path(inst.source(str(mirror_base))), inst.base_commit) == real, inst.instance_id
