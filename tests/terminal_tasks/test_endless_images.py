"""Published Endless Terminals tasks in the image their container.def builds, on the real engine.

The fixtures (fixtures/endless-published, see its README) are the tasks of github.com/kanishkg/endless-terminals as
published. Each image is built as Apptainer builds the definition (environments/terminal_tasks/apptainer.py:
`%post` as root at build time, its users, chowns and writes outside /home/user kept), then run as Endless
Terminals' harness runs it (generator/env.py), here with `endless_user="root"` (the image as %post left it; the
default invoking user is test_endless_invoking_user.py's): a shell as root in /home/user with `%environment` sourced, the
agent's commands in that one shell, then test_final_state.py copied in and run with pytest (pass = 1).
The oracle replays the first solved run of the published sampled solutions; the no-op does nothing.
"""

from __future__ import annotations

import asyncio
import io
import os
import shlex
import tarfile
import uuid
from pathlib import Path

import pytest

from environments.image_sandboxes import DockerImages
from environments.terminal_tasks.agents import sampled_solution_script
from environments.terminal_tasks.apptainer import Unreproducible, def_dockerfile, environment_prefix, parse_def
from environments.terminal_tasks.endless import load_endless_task
from environments.terminal_tasks.sandboxes import endless_recipe
from tests.support.docker_engine import ENGINE, TEST_LABEL, engine_problem

FIXTURES = Path(__file__).parent / "fixtures" / "endless-published"
TASKS = sorted(p.name for p in FIXTURES.iterdir() if (p / "task.json").is_file())
EMPTY_DEF = "task_000000_19c3c4b9"  # published with an empty container.def
BUILT = [t for t in TASKS if t != EMPTY_DEF]
REGISTRY = "hermes-rl-test-endless"
# Published tasks whose own files decide their scores whatever the harness does (measured here, read in the files):
# (oracle, no-op) scores, a line the final test's output holds, and why.
PUBLISHED_DEFECTS = {
    "task_000000_3bb4337a": (
        (0.0, 0.0),
        "NameError: name 'TODAY' is not defined",
        "its test_final_state.py formats TODAY, which it never defines: pytest fails collecting it",
    ),
    "task_000000_7ca8fc9c": (
        (1.0, 1.0),
        "passed",
        "its %post already writes the region_cost_summary.log the task asks for: the initial state passes",
    ),
    "task_000000_9cc1e5be": (
        (1.0, 1.0),
        "passed",
        "its %post already makes the latest_alert links and alert_setup.log the task asks for",
    ),
}


def _host_ca() -> bytes | None:
    # This machine's TLS-intercepting proxy CA is in the host's bundle only; %post's `pip3 install pytest` needs it.
    path = os.environ.get("SSL_CERT_FILE")
    return Path(path).read_bytes() if path and Path(path).is_file() else None


@pytest.fixture(scope="module")
def engine() -> str:
    problem = engine_problem(ENGINE)
    if problem is not None:
        pytest.skip(problem)
    return ENGINE


def _tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class _Container:
    """One trajectory's container: the task's image, root, no network (Endless tasks ask for none)."""

    def __init__(self, engine: str, image: str, label: str) -> None:
        import docker

        self.client = docker.DockerClient(base_url=engine, version="auto", timeout=300)
        self.c = self.client.containers.run(
            image, ["sleep", "infinity"], detach=True, network_disabled=True, labels={TEST_LABEL: label}
        )

    def shell(self, script: str) -> tuple[int, str]:
        """`script` in one bash as the harness's shell: Apptainer's clean environment, %environment, /home/user."""
        rc, out = self.c.exec_run(["bash", "-c", environment_prefix() + script], user="root")
        return rc, out.decode(errors="replace")

    def pytest(self, test: Path) -> tuple[int, str]:
        """The task's test file copied in after the agent, run with pytest as the harness runs it."""
        self.c.exec_run(["mkdir", "-p", "/tmp/hermes-tests"])
        self.c.put_archive("/tmp/hermes-tests", _tar(test.name, test.read_bytes()))
        rc, out = self.shell(f"python3 -m pytest -q -p no:cacheprovider /tmp/hermes-tests/{shlex.quote(test.name)}")
        self.c.exec_run(["rm", "-rf", "/tmp/hermes-tests"])
        return rc, out

    def close(self) -> None:
        self.c.remove(force=True)
        self.client.close()


@pytest.fixture(scope="module")
def images(engine, tmp_path_factory) -> dict[str, str]:
    """Each published task's image, built from its container.def (content tags: a later session reuses them)."""
    ca = _host_ca()

    async def build() -> dict[str, str]:
        docker_images = DockerImages(engine, labels={TEST_LABEL: "endless-images"})
        try:
            out = {}
            for name in BUILT:
                task = load_endless_task(FIXTURES / name)
                recipe = endless_recipe(
                    task, REGISTRY, tmp_path_factory.mktemp(name), ca_bundle=ca, endless_user="root"
                )
                out[name] = await docker_images.resolve(recipe)
            return out
        finally:
            docker_images.close()

    return asyncio.run(build())


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", BUILT)
def test_published_task_oracle_one_noop_zero(engine, images, name) -> None:
    task = load_endless_task(FIXTURES / name)
    assert task.image_skip is None and task.solution_commands
    label = f"endless-{uuid.uuid4().hex[:8]}"
    scores, outputs = {}, {}
    for agent in ("oracle", "noop"):
        box = _Container(engine, images[name], label)
        try:
            assert task.initial_test is not None
            rc, out = box.pytest(task.initial_test)
            assert rc == 0, f"{name}: the built image fails its test_initial_state.py:\n{out[-3000:]}"
            if agent == "oracle":
                box.shell(sampled_solution_script(task, task.workdir) + "\n")
            assert task.final_test is not None
            rc, outputs[agent] = box.pytest(task.final_test)
            scores[agent] = 1.0 if rc == 0 else 0.0
        finally:
            box.close()
    if name in PUBLISHED_DEFECTS:
        (oracle, noop), line, _why = PUBLISHED_DEFECTS[name]
        assert scores == {"oracle": oracle, "noop": noop} and line in outputs["noop"], (scores, outputs)
    else:
        assert scores == {"oracle": 1.0, "noop": 0.0}, (scores, outputs)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_post_accounts_ownership_and_writes_outside_home_are_the_images(engine, images) -> None:
    """`%post` ran as root: its users exist, its chowns hold, its writes under /var are there."""
    box = _Container(engine, images["task_000000_6eba56f8"], f"endless-{uuid.uuid4().hex[:8]}")
    try:
        rc, out = box.shell("stat -c %U:%G /home/user/artifacts /home/user; id artifactmgr")
        assert rc == 0, out
        assert out.splitlines()[:2] == ["artifactmgr:artifactmgr", "artifactmgr:artifactmgr"], out
    finally:
        box.close()
    box = _Container(engine, images["task_000000_7ccae1fb"], f"endless-{uuid.uuid4().hex[:8]}")
    try:
        rc, out = box.shell("stat -c %U:%a /var/log/syslog; head -c 60 /var/log/syslog")
        assert rc == 0 and out.startswith("root:644\nApr  5 16:00:15 host systemd"), out
    finally:
        box.close()


def test_empty_definition_is_a_named_skip() -> None:
    task = load_endless_task(FIXTURES / EMPTY_DEF)
    assert task.image_skip == f"{EMPTY_DEF}: container.def is empty: its initial state cannot be built"


@pytest.mark.parametrize("name", BUILT)
def test_post_and_environment_are_kept_byte_for_byte(name, tmp_path) -> None:
    text = (FIXTURES / name / "container.def").read_text()
    dockerfile, files = def_dockerfile(name, text, FIXTURES / name)
    d = parse_def(text)
    # Every line of %post, indentation and heredoc bodies included, is the script's: nothing re-formatted.
    assert files["post.script"][0].decode() == d.body("post")
    if d.has("environment"):
        assert files["environment.sh"][0].decode() == d.body("environment")
    assert 'HOME=/root \\"$@\\" /bin/sh -ex /.post.script; rc=$?; rm -f /.post.script' in dockerfile


def test_whitespace_inside_quoted_multiline_strings_survives(tmp_path) -> None:
    text = (
        "Bootstrap: docker\nFrom: ubuntu:22.04\n\n%post\n"
        "    printf '%s\\n' \"a  b\n\t  tabbed   line  \n  \" > /home/user/x\n"
        "    cat <<'EOF' > /home/user/y\n  indented\n\ttab\nEOF\n"
        "%environment\n    export GREETING='two  spaces'\n"
    )
    _, files = def_dockerfile("t", text, tmp_path)
    body = files["post.script"][0].decode()
    assert '"a  b\n\t  tabbed   line  \n  "' in body and "\n  indented\n\ttab\nEOF\n" in body
    assert files["environment.sh"][0].decode() == "    export GREETING='two  spaces'\n"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Bootstrap: library\nFrom: alpine\n%post\n  true\n", "Bootstrap: library From: alpine is not a Docker image"),
        (
            "Bootstrap: docker\nFrom: ubuntu:22.04\n%setup\n  touch $APPTAINER_ROOTFS/x\n",
            "%setup: runs on the build host",
        ),
        (
            "Bootstrap: docker\nFrom: ubuntu:22.04\n%startscript\n  nginx\n",
            "%startscript: runs on the build host or at",
        ),
        (
            "Bootstrap: docker\nFrom: ubuntu:22.04\n%files from build\n  /a /a\n",
            "%files from build: files from another",
        ),
        ("Bootstrap: docker\nFrom: ubuntu:22.04\n%post -u\n  true\n", "%post -u: section arguments"),
        ("Bootstrap: docker\nFrom: ubuntu:22.04\n%files\n  missing.txt /x\n", "%files missing.txt: not a file"),
    ],
)
def test_unreproducible_definitions_are_named_skips(text, reason, tmp_path) -> None:
    with pytest.raises(Unreproducible) as err:
        def_dockerfile("some-task", text, tmp_path)
    assert str(err.value).startswith("some-task: container.def ") and reason in str(err.value)


def test_post_shell_argument_and_test_section(tmp_path) -> None:
    (tmp_path / "data.csv").write_text("a,b\n")
    text = (
        "Bootstrap: docker\nFrom: ubuntu:22.04\n%files\n    data.csv /home/user/data.csv  # the data\n"
        "%post -c /bin/bash\n    [[ -f /home/user/data.csv ]]\n%test\n    test -f /home/user/data.csv\n"
    )
    dockerfile, files = def_dockerfile("t", text, tmp_path)
    lines = dockerfile.splitlines()
    assert lines[0] == "FROM ubuntu:22.04"
    assert lines[1] == 'COPY ["files/0", "/home/user/data.csv"]' and files["files/0"][0] == b"a,b\n"
    assert "/bin/sh -ex -c '/bin/bash /.post.script'" in dockerfile  # Apptainer: `-c SHELL` runs the script with it
    assert files["test.script"][0] == b"    test -f /home/user/data.csv\n"
    # %files before %post, %test after it.
    assert dockerfile.index("files/0") < dockerfile.index("post.script") < dockerfile.index("test.script")
