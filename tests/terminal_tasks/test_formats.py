"""Published task formats and honest local runnability (issue 25, items 2 and 3).

Fixtures under fixtures/ are in the published shapes, each checked against a real task:
- tb2/count-errors: Terminal-Bench 2 as published (`version = "1.0"`, deprecated `memory = "2G"`,
  a `docker_image` next to the Dockerfile, test.sh bootstrapping curl + uv + `uvx pytest`), as in
  terminal-bench-2's chess-best-move / largest-eigenval.
- harbor-1.1/sum-column: Harbor's schema-1.1 export (`schema_version`, `artifacts`, `[task]` with
  `[[task.authors]]`, `memory_mb`/`storage_mb`/`gpus`/`mcp_servers`, `[environment.env]`).
- endless/task_000004_e5a7c9d1: an Endless Terminals task dir (`Bootstrap: localimage`, `%post` with
  backslash continuations and comments, `%files` with a comment, `%environment`, `%runscript`) and its
  sampled solutions in `solutions/o3_summary.json` (kanishkg/endless-terminals generate_solutions.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from environments.terminal_tasks import BUNDLED_TASKS, NoOpAgent, OracleAgent, load_tasks_dir
from environments.terminal_tasks.agents import sampled_solution_script
from environments.terminal_tasks.tasks import replay_command
from tests.terminal_tasks.conftest import make_env

FIXTURES = Path(__file__).parent / "fixtures"
TB2 = FIXTURES / "tb2" / "count-errors"
HARBOR_11 = FIXTURES / "harbor-1.1" / "sum-column"
ENDLESS = FIXTURES / "endless" / "task_000004_e5a7c9d1"
ENDLESS_HARBOR = FIXTURES / "endless-harbor-published" / "task_000000_659a19e1"


def harbor_task(
    tmp_path: Path, dockerfile: str, test_sh: str | None = None, files: dict[str, str] | None = None
) -> Path:
    """A copy of the bundled edit-config task with its Dockerfile (and test.sh / other files) replaced."""
    root = tmp_path / "tasks" / "t"
    shutil.copytree(BUNDLED_TASKS / "harbor" / "edit-config", root)
    (root / "environment" / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    if test_sh is not None:
        (root / "tests" / "test.sh").write_text(textwrap.dedent(test_sh))
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


def endless_task(tmp_path: Path, definition: str, name: str = "task_000009_deadbeef") -> Path:
    root = tmp_path / "tasks" / name
    shutil.copytree(BUNDLED_TASKS / "endless" / "task_000002_c3e5a7b9", root)
    (root / "container.def").write_text(textwrap.dedent(definition))
    return root


def only(tmp_path: Path):
    [task] = load_tasks_dir(tmp_path / "tasks")
    return task


# -- runnability defects: each of these failed on main -----------------------------------------


def test_git_clone_in_the_dockerfile_is_a_download(tmp_path):
    harbor_task(
        tmp_path, "FROM python:3.12\nWORKDIR /app\nRUN git clone https://github.com/psf/requests.git /app/src\n"
    )
    assert "git clone https://github.com/psf/requests.git" in (only(tmp_path).local_skip or "")


def test_apt_install_after_an_env_prefix_is_an_install(tmp_path):
    harbor_task(
        tmp_path, "FROM ubuntu:24.04\nWORKDIR /app\nRUN DEBIAN_FRONTEND=noninteractive apt-get install -y cowsay\n"
    )
    assert "installs cowsay (not on this machine)" in (only(tmp_path).local_skip or "")


def test_installs_in_helper_scripts_under_tests_count(tmp_path):
    harbor_task(
        tmp_path,
        "FROM python:3.12\nWORKDIR /app\n",
        test_sh="#!/bin/bash\nbash /tests/setup_env.sh\npython3 /tests/check_config.py\n",
        files={"tests/setup_env.sh": "#!/bin/bash\npip install --no-cache-dir hermes-rl-no-such-dist==1.0\n"},
    )
    assert "tests/setup_env.sh: installs hermes-rl-no-such-dist" in (only(tmp_path).local_skip or "")


def test_installs_this_machine_already_has_are_not_blockers(tmp_path):
    # Decided against this machine: git and python3 are installed here (dpkg), pytest is in the interpreter.
    harbor_task(tmp_path, "FROM ubuntu:24.04\nWORKDIR /app\nRUN apt-get update && apt-get install -y git python3\n")
    assert only(tmp_path).local_skip is None


def test_curl_of_localhost_is_not_a_download(tmp_path):
    harbor_task(
        tmp_path,
        "FROM python:3.12\nWORKDIR /app\n",
        test_sh="#!/bin/bash\ncurl -s http://localhost:8000/health > /logs/verifier/health.txt\n"
        "python3 /tests/check_config.py\n",
    )
    assert only(tmp_path).local_skip is None


def test_copy_from_another_image_is_not_a_local_copy(tmp_path):
    harbor_task(tmp_path, "FROM python:3.12\nWORKDIR /app\nCOPY --from=ghcr.io/astral-sh/uv:0.9.5 /uv /bin/uv\n")
    task = only(tmp_path)
    assert "COPY --from=ghcr.io/astral-sh/uv:0.9.5" in (task.local_skip or "")
    assert not any(s.kind == "copy" for s in task.setup)


def test_every_problem_is_reported_not_only_the_first(tmp_path):
    harbor_task(
        tmp_path,
        "FROM ubuntu:24.04\nWORKDIR /app\nRUN apt-get install -y cowsay\nRUN wget https://example.org/data.tgz\n",
    )
    skip = only(tmp_path).local_skip or ""
    assert "installs cowsay" in skip and "downloads (wget https://example.org/data.tgz)" in skip


def test_endless_post_with_continuations_loads_and_replays_whole_commands(tmp_path):
    endless_task(
        tmp_path,
        """\
        Bootstrap: localimage
        From: ./ubuntu_22.04.sif

        %post
            apt-get update && apt-get install -y \\
                python3 \\
                python3-pytest
            mkdir -p /home/user
            printf 'web01\\ndb01\\nweb01\\ncache01\\ndb01\\nweb02\\nweb01\\n' \\
                > /home/user/hosts.txt
            chmod -R a+rwX /home/user
        """,
    )
    task = only(tmp_path)  # main: ValueError "No escaped character" from the whole tasks_dir
    assert task.local_skip is None


def test_endless_files_comments_are_not_copy_sources(tmp_path):
    endless_task(
        tmp_path,
        """\
        Bootstrap: localimage
        From: ./ubuntu_22.04.sif

        %files
            # No files to copy

        %post
            mkdir -p /home/user
            printf 'web01\\ndb01\\nweb01\\ncache01\\ndb01\\nweb02\\nweb01\\n' > /home/user/hosts.txt
        """,
    )
    assert [s for s in only(tmp_path).setup if s.kind == "copy"] == []


def test_an_empty_container_def_is_not_reproducible(tmp_path):
    endless_task(tmp_path, "")
    assert "container.def" in (only(tmp_path).local_skip or "")


def test_endless_post_writing_to_etc_needs_the_image(tmp_path):
    endless_task(
        tmp_path,
        """\
        Bootstrap: localimage
        From: ./ubuntu_22.04.sif

        %post
            mkdir -p /home/user
            echo "testuser::19434:0:99999:7:::" >> /etc/shadow
        """,
    )
    assert "writes outside the workspace (/etc/shadow)" in (only(tmp_path).local_skip or "")


def test_chown_the_tests_check_is_not_silently_dropped(tmp_path):
    root = endless_task(
        tmp_path,
        """\
        Bootstrap: localimage
        From: ./ubuntu_22.04.sif

        %post
            useradd -m user || true
            mkdir -p /home/user
            printf 'web01\\n' > /home/user/hosts.txt
            chown user:user /home/user/hosts.txt
        """,
    )
    (root / "test_final_state.py").write_text(
        "import os, pwd\n\ndef test_owner():\n"
        "    assert os.stat('/home/user/hosts.txt').st_uid == pwd.getpwnam('user').pw_uid\n"
    )
    assert "users/owners the tests check" in (only(tmp_path).local_skip or "")


def test_a_malformed_task_does_not_sink_the_tasks_dir(tmp_path):
    harbor_task(tmp_path, "FROM python:3.12\nWORKDIR /app\n")
    bad = tmp_path / "tasks" / "broken-toml"
    shutil.copytree(tmp_path / "tasks" / "t", bad)
    (bad / "task.toml").write_text("[verifier\ntimeout_sec = 1\n")
    errors: list[str] = []
    tasks = load_tasks_dir(tmp_path / "tasks", errors=errors)
    assert [t.id for t in tasks] == ["t"]
    assert len(errors) == 1 and errors[0].startswith("broken-toml: ")


# -- formats -----------------------------------------------------------------------------------


def test_tb2_as_published_needs_only_its_test_tool_bootstrap():
    [task] = load_tasks_dir(TB2)
    assert task.docker_image == "hermes-rl-tests/count-errors:20251031"
    assert task.memory_mb == 2048 and task.agent_timeout_s == 900.0
    assert task.local_problems and all(p.bootstrap for p in task.local_problems)
    assert "downloads (curl https://astral.sh/uv/0.9.5/install.sh)" in (task.local_skip or "")


def test_docker_image_is_preferred_over_rebuilding():
    from environments.terminal_tasks.sandboxes import base_dockerfile

    [task] = load_tasks_dir(TB2)
    assert base_dockerfile(task) == "FROM hermes-rl-tests/count-errors:20251031\n"


def test_harbor_1_1_export_fields_are_honoured_or_reported():
    [task] = load_tasks_dir(HARBOR_11)
    assert task.id == "hermes-rl/sum-column" and task.local_skip is None
    assert task.verifier_env["TOTAL_DECIMALS"] == "2" and task.solution_env["TOTAL_DECIMALS"] == "2"
    assert task.storage_mb == 10240 and task.allow_internet is False
    fields = {line.split(" ", 1)[0] for line in task.unsupported}
    assert {"[environment].cpus", "[environment].memory_mb", "[environment].storage_mb"} <= fields
    assert "[environment.env]" not in fields and task.environment == {"TOTAL_DECIMALS": "2"}  # the agent's too


def test_gpus_and_compose_environments_are_not_runnable_locally(tmp_path):
    root = harbor_task(tmp_path, "FROM python:3.12\nWORKDIR /app\n")
    (root / "task.toml").write_text((root / "task.toml").read_text() + "gpus = 1\n")
    (root / "environment" / "docker-compose.yaml").write_text("services:\n  main:\n    build: .\n")
    skip = only(tmp_path).local_skip or ""
    assert "gpus = 1" in skip and "docker-compose.yaml" in skip


def test_endless_def_is_parsed_as_apptainer_does():
    [task] = load_tasks_dir(ENDLESS.parent)
    assert task.local_skip is None
    copies = [(s.source, s.target) for s in task.setup if s.kind == "copy"]
    assert copies == [("inventory.csv", "/home/user/data/inventory.csv")]
    assert task.verifier_env["REPORT_DIR"] == "/home/user/reports"
    [run] = [s for s in task.setup if s.kind == "run"]
    replayed = replay_command(run, image_has_packages=False)  # whole commands, continuations joined
    assert "apt-get" not in replayed and "python3-pytest" not in replayed
    assert re.search(r"^mkdir -p /home/user/data +/home/user/reports$", replayed, re.M)


def test_endless_solutions_as_published_give_the_oracle_its_commands():
    [task] = load_tasks_dir(ENDLESS.parent)
    assert task.solution_commands is not None
    assert task.solution_commands[0] == "cd /home/user/data"
    assert "echo draft" not in "\n".join(task.solution_commands)  # the last <command> of a turn is the one run


def test_sampled_solution_replays_in_the_harness_shell_pipefail_on_failures_not_fatal(tmp_path):
    """Endless' harness (generator/env.py) sends each command to one bash after `set -o pipefail`; a failing
    command does not stop the next. A pipeline whose first stage fails therefore stops an `&&` chain there."""
    [task] = load_tasks_dir(ENDLESS.parent)
    commands = ["false | true && touch piped", "false", "touch after", "cd sub 2>/dev/null; touch here"]
    task = task.model_copy(update={"solution_commands": commands})
    script = sampled_solution_script(task, str(tmp_path))
    subprocess.run(["bash", "-c", script], cwd="/", check=False, capture_output=True, timeout=60)
    assert not (tmp_path / "piped").exists()
    assert (tmp_path / "after").exists() and (tmp_path / "here").exists()


def test_a_harbor_export_of_an_endless_task_is_one_harbor_task(tmp_path):
    """The generator's Harbor export keeps task.json under environment/: that folder is not a task of its own."""
    shutil.copytree(ENDLESS_HARBOR, tmp_path / "tasks" / ENDLESS_HARBOR.name)
    errors: list[str] = []
    tasks = load_tasks_dir(tmp_path / "tasks", errors=errors)
    assert [(t.id, t.format) for t in tasks] == [(ENDLESS_HARBOR.name, "harbor")] and errors == []
    assert [(t.id, t.format) for t in load_tasks_dir(tmp_path / "tasks" / ENDLESS_HARBOR.name)] == [
        (ENDLESS_HARBOR.name, "harbor")
    ]


async def test_skips_are_printed_with_every_reason_and_the_task_name(scripted_server, tmp_path, capsys):
    harbor_task(
        tmp_path,
        "FROM ubuntu:24.04\nWORKDIR /app\nRUN apt-get install -y cowsay\nRUN wget https://example.org/data.tgz\n",
    )
    shutil.copytree(HARBOR_11, tmp_path / "tasks" / "sum-column")
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tmp_path / "tasks"))
    await env.items()
    err = capsys.readouterr().err
    assert "skipped t: " in err and "installs cowsay" in err and "wget https://example.org/data.tgz" in err
    assert "hermes-rl/sum-column" in err and "[environment].memory_mb" in err


# -- the real thing: oracle 1.0 / no-op 0.0 in real sandboxes ---------------------------------


@pytest.mark.slow
async def test_published_shapes_run_oracle_one_noop_zero(scripted_server, tmp_path):
    tasks = tmp_path / "tasks"
    for src in (TB2, HARBOR_11, ENDLESS):
        shutil.copytree(src, tasks / src.name)
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tasks), bootstrap_tests_with_sandbox_pytest=True)
    async with env.runtime():
        await env.setup()
        assert sorted(t.id for t in env.tasks) == ["count-errors", "hermes-rl/sum-column", "task_000004_e5a7c9d1"]
        rollouts = {
            (t.id, type(agent).__name__): await env.rollout(t, model=agent)
            for t in env.tasks
            for agent in (OracleAgent(env.by_id), NoOpAgent())
        }
    scores = {key: r.score for key, r in rollouts.items()}
    # The opt-in is stated in the results: count-errors' two verdicts came from the sandbox's pytest.
    assert env.eval_metrics(list(rollouts.values()))["eval/tests_bootstrapped_with_sandbox_pytest"] == 2.0
    assert env.eval_sample(rollouts["count-errors", "OracleAgent"])["item"]["tests_bootstrapped_with_sandbox_pytest"]
    assert scores == {
        (t, a): 1.0 if a == "OracleAgent" else 0.0
        for t in ("count-errors", "hermes-rl/sum-column", "task_000004_e5a7c9d1")
        for a in ("OracleAgent", "NoOpAgent")
    }


async def test_without_the_opt_in_a_bootstrapping_task_is_skipped(scripted_server, tmp_path, capsys):
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(TB2))
    with pytest.raises(Exception, match="no runnable terminal tasks"):
        await env.items()
    assert "--env.bootstrap_tests_with_sandbox_pytest" in capsys.readouterr().err


def test_a_setup_script_the_dockerfile_runs_is_read_too(tmp_path):
    # terminal-bench-2 fix-git's shape: the Dockerfile COPYs setup.sh and RUNs it; the clone is inside.
    harbor_task(
        tmp_path,
        "FROM python:3.13-slim-bookworm\nWORKDIR /app\nCOPY setup.sh ./\nRUN bash /app/setup.sh && rm /app/setup.sh\n",
        files={"environment/setup.sh": "git clone https://github.com/example/site.git\ncd site\n"},
    )
    assert "environment/setup.sh: downloads (git clone https://github.com/example/site.git)" in (
        only(tmp_path).local_skip or ""
    )


def test_uvx_pulling_a_package_this_machine_lacks_is_more_than_a_bootstrap(tmp_path):
    test_sh = (TB2 / "tests" / "test.sh").read_text().replace("-w pytest==8.4.1", "-w pytest==8.4.1 -w no-such-dist==1")
    harbor_task(tmp_path, "FROM python:3.12\nWORKDIR /app\n", test_sh=test_sh)
    task = only(tmp_path)
    assert not task.only_bootstrap_blocks
    assert any("no-such-dist" in p.text and not p.bootstrap for p in task.local_problems)


def test_the_sandbox_pytest_script_keeps_the_tests_own_arguments():
    [task] = load_tasks_dir(TB2)
    script = task.sandbox_pytest_test_script or ""
    assert "python3 -m pytest /tests/test_outputs.py -rA" in script  # no --ctrf: its plugin is not here
    assert "uvx" not in script and "astral.sh" not in script and "apt-get" not in script
    assert "echo 1 > /logs/verifier/reward.txt" in script


def test_a_dataset_row_whose_task_is_malformed_is_reported_and_the_rest_load(tmp_path):
    from environments.terminal_tasks.loaders import load_endless_rows

    good = endless_task(tmp_path, (ENDLESS / "container.def").read_text(), name="task_000001_aaaaaaaa")
    shutil.copy(ENDLESS / "inventory.csv", good / "inventory.csv")
    bad = endless_task(tmp_path, "", name="task_000002_bbbbbbbb")
    (bad / "task.json").write_text("{not json")
    errors: list[str] = []
    rows = [{"description": "d", "task_dir": f"/data/{p.name}"} for p in (good, bad)]
    tasks = load_endless_rows(rows, tmp_path / "tasks", errors=errors)
    assert [t.id for t in tasks] == ["task_000002_c3e5a7b9"]  # the copied task.json's name
    assert len(errors) == 1 and errors[0].startswith("task_000002_bbbbbbbb: ")


def test_environment_env_templated_on_harbors_host_or_owned_by_the_sandbox_is_reported_not_set(tmp_path):
    root = tmp_path / "tasks" / "sum-column"
    shutil.copytree(HARBOR_11, root)
    toml = (root / "task.toml").read_text()
    extra = 'TOTAL_DECIMALS = "2"\nDATA_ROOT = "${DATA_ROOT:-/srv}"\nPATH = "/opt/venv/bin:/usr/bin:/bin"'
    (root / "task.toml").write_text(toml.replace('TOTAL_DECIMALS = "2"', extra))
    task = only(tmp_path)
    assert task.verifier_env == {"TOTAL_DECIMALS": "2"} == task.solution_env
    assert "[environment.env] = DATA_ROOT (templated on Harbor's host environment: not set)" in task.unsupported
    assert "[environment.env] = PATH (kept as the sandbox sets them)" in task.unsupported


def test_post_with_its_shell_named_is_still_replayed(tmp_path):
    endless_task(
        tmp_path,
        """\
        Bootstrap: localimage
        From: ./ubuntu_22.04.sif

        %post -c /bin/bash
            mkdir -p /home/user
            printf 'web01\\ndb01\\nweb01\\ncache01\\ndb01\\nweb02\\nweb01\\n' > /home/user/hosts.txt
        """,
    )
    task = only(tmp_path)
    assert task.local_skip is None and [s.kind for s in task.setup] == ["run"]


def test_scripts_are_cut_into_commands_as_the_shell_reads_them():
    from environments.terminal_tasks.runnability import logical_lines

    script = (
        "# c\napt-get install -y \\\n  jq\ncat <<< 'x'\necho $((1<<2))\ncat > f <<'EOF'\n$body \\\nEOF\necho done\n"
    )
    assert logical_lines(script) == [
        "apt-get install -y    jq",
        "cat <<< 'x'",
        "echo $((1<<2))",
        "cat > f <<'EOF'\n$body \\\nEOF",
        "echo done",
    ]
