"""`process` on a mirror in the real SWE-smith history shape, with the repository's dependency given the
documented way (--env.deps.mode venv: a per-repository venv prepared once from the profile's install
command). The dependency is a small wheel built here; the project has a src layout, so the checkout is
importable only through the interpreter the prepared env names (PYTHONPATH at src/)."""

from __future__ import annotations

from tests.support.embedded import embedded_tokenizer
import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from environments.swe_smith.env import SweSmithOracleEnv
from tests.support.cli import CliRun, run_cli
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread
from tests.swe_smith.conftest import git, publish

QUADLIB = {
    "requirements.txt": "tinydep\n",
    "src/quadlib/__init__.py": (
        "from tinydep import double\n\n\ndef quad(x):\n    return double(double(x))\n\n\n"
        "def half(x):\n    return x / 2\n"
    ),
    "tests/__init__.py": "",
    "tests/test_quad.py": (
        "import unittest\n\nfrom quadlib import quad\n\n\nclass QuadTest(unittest.TestCase):\n"
        "    def test_quad(self):\n        self.assertEqual(quad(3), 12)\n"
    ),
    "tests/test_half.py": (
        "import unittest\n\nfrom quadlib import half\n\n\nclass HalfTest(unittest.TestCase):\n"
        "    def test_half(self):\n        self.assertEqual(half(3), 1.5)\n"
    ),
}


def build_wheel(out: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel (PEP 427) written directly: pip installs it with no index and no build backend."""
    dist_info = f"{name}-{version}.dist-info"
    contents = files | {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hermes-rl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in contents.items():
            z.writestr(path, text)
        z.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel


@pytest.fixture
def quadlib(tmp_path) -> dict:
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "tinydep", "1.0", {"tinydep/__init__.py": "def double(x):\n    return 2 * x\n"})
    work = tmp_path / "work" / "quadlib"
    for rel, text in QUADLIB.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    mirrors = tmp_path / "mirrors"
    bug = ("src/quadlib/__init__.py", "return double(double(x))", "return double(x)", "tests/test_quad.py")
    repo, bugs = publish(work, "hermes", mirrors, {"func_pm_remove_wrapper__quad": bug})
    instance_id, (base_commit, patch) = next(iter(bugs.items()))
    row = {
        "instance_id": instance_id,
        "repo": repo,
        "patch": patch,
        "base_commit": base_commit,
        "FAIL_TO_PASS": ["tests.test_quad.QuadTest.test_quad"],
        "PASS_TO_PASS": ["tests.test_half.HalfTest.test_half"],
        "problem_statement": "quad(3) returns 6; it should multiply by four.",
        "image_name": f"swebench/swesmith.x86_64.{repo.split('/')[1].replace('__', '_1776_')}",
    }
    (tmp_path / "instances.jsonl").write_text(json.dumps(row) + "\n")
    install = f"python -m pip install --no-index --find-links {wheels} -r requirements.txt"
    profile = {"test_cmd": "python -m unittest -v", "language": "python", "install_cmds": [install]}
    (tmp_path / "profiles.json").write_text(json.dumps({repo: profile}))
    return {"row": row, "mirrors": mirrors, "repo": repo}


@pytest.mark.slow
def test_process_scores_the_real_layout_with_the_dependency_from_a_prepared_env(tmp_path, quadlib):
    # The mirror has the real branch's history: three commits, the F2P test file deleted at the head.
    bare = quadlib["mirrors"] / f"{quadlib['repo']}.git"
    head = quadlib["row"]["base_commit"]
    assert git("log", "--format=%s|%an <%ae>", head, cwd=bare).splitlines() == [
        "Remove F2P Tests|swesmith <swesmith@swesmith.ai>",
        "Bug Patch|swesmith <swesmith@swesmith.ai>",
        "Initial commit|swesmith <swesmith@swesmith.ai>",
    ]
    assert git("diff", "--name-status", f"{head}^", head, cwd=bare) == "D\ttests/test_quad.py"

    def process(run: str, agent: str, *flags: str) -> tuple[CliRun, list[float]]:
        out = tmp_path / run / "groups.jsonl"
        proc = run_cli(
            SweSmithOracleEnv,
            "process",
            *("--openai.base_url", server.base_url, "--openai.model_name", "scripted", "--openai.api_key", "x"),
            *("--env.tokenizer_name", embedded_tokenizer()),
            *("--env.agent", agent, "--env.total_steps", "1", "--env.group_size", "2"),
            *("--env.ensure_scores_are_not_same", "False", "--env.data_path_to_save_groups", str(out)),
            *("--env.dataset", str(tmp_path / "instances.jsonl"), "--env.mirror_base", str(quadlib["mirrors"])),
            *("--env.profiles", str(tmp_path / "profiles.json")),
            *("--env.cache_dir", str(tmp_path / "cache"), "--env.include_messages", "True"),
            *flags,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        groups = [json.loads(line) for line in out.read_text().splitlines()]
        return proc, [s for g in groups for s in g["scores"]]

    venv = ("--env.deps.mode", "venv")  # the row names an image: with its dependencies provided, it runs here
    with serving_in_a_thread(ScriptedOpenAIServer([])) as server:
        fixed, fixed_scores = process("fixed", "oracle", *venv)
        _, untouched_scores = process("untouched", "noop", *venv)
        _, without_deps_scores = process("without_deps", "oracle", "--env.image_policy", "base")
    assert fixed_scores == [1.0, 1.0]
    assert untouched_scores == [0.0, 0.0]
    assert without_deps_scores == [0.0, 0.0]  # the same fix, but tinydep is not importable
    # prepared once, reused by the second run; the agent is told which interpreter has the dependencies
    envs = list((tmp_path / "cache" / "envs").glob("*/hermes-env.json"))
    assert len(envs) == 1 and json.loads(envs[0].read_text())["source_root"] == "src"
    assert "preparing" in fixed.stderr and (envs[0].parent / "venv" / "lib").exists()
    assert "1 usable instances of 1 rows\n" in fixed.stderr
    groups = [json.loads(x) for x in (tmp_path / "fixed" / "groups.jsonl").read_text().splitlines()]
    prompt = next(m for m in groups[0]["messages"][0] if m["role"] == "user")["content"]
    assert "Failing tests: 1 in tests.test_quad.QuadTest.test_quad" in prompt
    assert f'PYTHONPATH="$PWD"/src {envs[0].parent}/venv/bin/python' in prompt
