"""Every field of Harbor's current task.toml schema (harbor models/task/config.py `TaskConfig`, schema 1.4 / Harbor
0.21: [task], steps, artifacts, network_mode/allowed_hosts, [verifier] user/environment_mode/collect, os, tpu,
healthcheck, skills_dir...) is honoured, reported once naming the task, or makes the task unrunnable with the
field named; a field Harbor does not have is reported as unknown."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.terminal_tasks import BUNDLED_TASKS
from environments.terminal_tasks.harbor import load_harbor_task
from tests.terminal_tasks.conftest import make_env

TASK_TOML = """schema_version = "1.4"
source = "hermes-rl"
multi_step_reward_strategy = "final"
artifacts = ["/app/out.log"]
colour = "blue"

[task]
name = "hermes-rl/edit-config-full"
version = "1.0.0"
description = "Edit the config"
keywords = ["ini"]
[[task.authors]]
name = "hermes-rl"

[metadata]
difficulty = "easy"

[verifier]
timeout_sec = 60.0
user = "tester"
network_mode = "no-network"
[[verifier.collect]]
command = "cp /app/x /logs/artifacts/x"

[agent]
timeout_sec = 300.0
user = "agent"
network_mode = "allowlist"
allowed_hosts = ["pypi.org"]

[solution]
env = { MODE = "fast" }

[environment]
build_timeout_sec = 120.0
cpus = 2
memory_mb = 512
storage_mb = 1024
gpu_types = ["H100"]
allow_internet = false
skills_dir = "/skills"
workdir = "/app"
os = "linux"
sparkle = true
[environment.healthcheck]
command = "true"
"""


def _task(tmp_path: Path, toml: str) -> Path:
    root = tmp_path / "tasks" / "edit-config-full"
    shutil.copytree(BUNDLED_TASKS / "harbor" / "edit-config", root)
    (root / "task.toml").write_text(toml)
    return root


def test_every_field_is_honoured_or_reported(tmp_path):
    task = load_harbor_task(_task(tmp_path, TASK_TOML))
    assert task.id == "hermes-rl/edit-config-full" and task.local_skip is None and task.image_skip is None
    assert task.solution_env == {"MODE": "fast"} and task.workdir == "/app" and task.verifier_timeout_s == 60.0
    reported = {line.split(" = ", 1)[0]: line for line in task.unsupported}
    assert set(reported) == {
        "multi_step_reward_strategy",
        "artifacts",
        "colour",
        "[verifier].user",
        "[verifier].network_mode",
        "[verifier].collect",
        "[agent].user",
        "[agent].network_mode",
        "[agent].allowed_hosts",
        "[environment].build_timeout_sec",
        "[environment].cpus",
        "[environment].memory_mb",
        "[environment].storage_mb",
        "[environment].gpu_types",
        "[environment].skills_dir",
        "[environment].sparkle",
        "[environment].healthcheck",
    }
    assert reported["colour"] == "colour = 'blue' (unknown task.toml field, ignored)"
    assert reported["[environment].sparkle"] == "[environment].sparkle = True (unknown task.toml field, ignored)"
    assert reported["[agent].allowed_hosts"] == "[agent].allowed_hosts = ['pypi.org'] (no per-host allowlist)"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ('[[steps]]\nname = "one"\n', "steps"),
        ('[verifier]\nenvironment_mode = "separate"\n', "[verifier].environment_mode = 'separate'"),
        ('[environment]\nos = "windows"\n', "[environment].os = 'windows'"),
        ("[environment]\ngpus = 1\n", "[environment].gpus = 1"),
        ('[environment.tpu]\ntype = "v6e"\ntopology = "2x2"\n', "[environment].tpu"),
        ('[[environment.mcp_servers]]\nname = "search"\nurl = "http://x"\n', "[environment].mcp_servers = [search]"),
    ],
)
def test_fields_no_backend_here_runs_skip_the_task_with_the_field_named(tmp_path, extra, field):
    task = load_harbor_task(_task(tmp_path, 'version = "1.0"\n' + extra))
    for skip in (task.local_skip, task.image_skip):
        assert skip is not None and f"task.toml {field}" in skip, skip


async def test_unknown_and_unhonoured_fields_are_printed_once_with_the_task(scripted_server, tmp_path, capsys):
    _task(tmp_path, TASK_TOML)
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tmp_path / "tasks"))
    await env.items()
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("[hermes-rl] colour not honoured"))
    assert line.endswith("(unknown task.toml field, ignored): hermes-rl/edit-config-full = 'blue'")
    assert err.count("[environment].sparkle not honoured") == 1
