"""A SWE-smith instance in its own image on the docker backend, the image in SWE-smith's shape.

The fixture image (test-only, built once per session FROM the offline debian:bookworm stand-in, content-tagged
and labelled) has what SWE-smith's images have where the harness looks: the repository at /testbed, and
`/opt/miniconda3/bin/activate` whose `conda activate testbed` puts the `testbed` environment first on PATH,
the repository installed there in editable mode (a .pth naming /testbed/src) beside a dependency found
nowhere else. It is a stand-in for miniconda's layout, not conda: apt's python3 and python3-pytest in a venv
under /opt/miniconda3/envs/testbed, and a `conda` shell function that only activates.

So the oracle scores 1.0 only if the verifier runs the profile's own command (`source ...activate; conda
activate testbed; pytest ...`) in the image with the checkout at /testbed, and the probe loads in the
image's Python; a no-op, or a no-op that tampers with the runner in /testbed, scores 0.
"""

from __future__ import annotations

from tests.support.embedded import embedded_tokenizer
import ast
import json
import textwrap
from pathlib import Path

import pytest
from atroposlib.envs.base import APIServerConfig

from backends.docker import DockerBackendConfig
from environments.hermes_base_env import HermesEnvError
from environments.image_sandboxes import content_tag
from environments.models.base import ModelTurn
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.swe_smith.env import NoOpAgent, OracleAgent, SweSmithOracleEnv, SweSmithOracleEnvConfig
from slots.pool import SlotPoolConfig
from tests.support.cli import run_cli
from tests.support.docker_engine import ENGINE, TEST_LABEL, sandbox_image
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread
from tests.swe_smith.conftest import publish

# SWE-smith's Python profile command (profiles.json, e.g. swesmith/marshmallow-code__apispec.8b421526).
TEST_CMD = "source /opt/miniconda3/bin/activate; conda activate testbed; pytest --disable-warnings --color=no --tb=no --verbose"

METERKIT = {
    "pyproject.toml": '[project]\nname = "meterkit"\nversion = "0.1"\ndependencies = ["unitconv"]\n',
    "src/meterkit/__init__.py": (
        "from unitconv import CM_PER_INCH\n\n\n"
        "def to_cm(inches):\n    return inches * CM_PER_INCH\n\n\n"
        "def area_cm2(width, height):\n    return to_cm(width) * to_cm(height)\n"
    ),
    "tests/test_convert.py": (
        "from meterkit import area_cm2, to_cm\n\n\n"
        "def test_to_cm():\n    assert to_cm(10) == 25.4\n\n\n"
        "def test_area():\n    assert round(area_cm2(1, 2), 4) == 12.9032\n"
    ),
    "tests/test_zero.py": "from meterkit import to_cm\n\n\ndef test_zero():\n    assert to_cm(0) == 0\n",
}
BUG = (
    "src/meterkit/__init__.py",
    "return inches * CM_PER_INCH",
    "return inches / CM_PER_INCH",
    "tests/test_convert.py",
)

ACTIVATE = """\
# Test-only stand-in for miniconda3's bin/activate (hermes-rl, tests/swe_smith/test_docker_image.py): the
# `conda` shell function and environment layout of SWE-smith's images, without conda. Only activates.
conda() {
    case "${1:-}" in
        activate)
            _name="${2:-base}"
            if [ "$_name" = base ]; then _prefix=/opt/miniconda3; else _prefix="/opt/miniconda3/envs/$_name"; fi
            if [ ! -d "$_prefix" ]; then
                echo "EnvironmentNameNotFound: Could not find conda environment: $_name" >&2
                return 1
            fi
            PATH="$_prefix/bin:$PATH"
            CONDA_PREFIX="$_prefix"
            CONDA_DEFAULT_ENV="$_name"
            CONDA_SHLVL=$((${CONDA_SHLVL:-0} + 1))
            export PATH CONDA_PREFIX CONDA_DEFAULT_ENV CONDA_SHLVL
            hash -r
            ;;
        *)
            echo "conda (test stand-in): only 'conda activate ENV' is provided" >&2
            return 1
            ;;
    esac
}
conda activate base
"""

DOCKERFILE = """\
FROM debian:bookworm
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      git python3 python3-pytest python3-venv && rm -rf /var/lib/apt/lists/*
COPY activate /opt/miniconda3/bin/activate
COPY repo /testbed
COPY unitconv.py /tmp/deps/unitconv.py
RUN python3 -m venv --system-site-packages --without-pip /opt/miniconda3/envs/testbed \\
 && env=/opt/miniconda3/envs/testbed \\
 && printf '#!%s/bin/python\\nimport sys\\nfrom pytest import console_main\\nsys.exit(console_main())\\n' $env \\
      > $env/bin/pytest && chmod 755 $env/bin/pytest \\
 && site=$($env/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \\
 && mv /tmp/deps/unitconv.py $site/ \\
 && echo /testbed/src > $site/__editable__.meterkit-0.1.pth \\
 && mkdir $site/meterkit-0.1.dist-info \\
 && printf 'Metadata-Version: 2.1\\nName: meterkit\\nVersion: 0.1\\n' > $site/meterkit-0.1.dist-info/METADATA \\
 && echo '{"url": "file:///testbed", "dir_info": {"editable": true}}' > $site/meterkit-0.1.dist-info/direct_url.json \\
 && cd /testbed && git init -q -b main && git add -A \\
 && git -c user.name=swesmith -c user.email=swesmith@swesmith.ai commit -qm "Initial commit"
"""


@pytest.fixture(scope="session")
def swe_smith_image(docker_engine, tmp_path_factory) -> tuple[str, Path]:
    """(the SWE-smith-shaped image's tag, the sandbox runtime dir): built once, reused by its content tag."""
    import docker

    ctx = tmp_path_factory.mktemp("swe-smith-image")
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    (ctx / "activate").write_text(ACTIVATE)
    (ctx / "unitconv.py").write_text("CM_PER_INCH = 2.54\n")
    for rel, text in METERKIT.items():
        (ctx / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / "repo" / rel).write_text(text)
    tag = content_tag("hermes-rl-test/swesmith.x86_64.hermes_1776_meterkit", DOCKERFILE, ctx)
    client = docker.DockerClient(base_url=ENGINE, version="auto", timeout=900)
    try:
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            client.images.build(path=str(ctx), tag=tag, rm=True, labels={TEST_LABEL: "swe-smith-image"})
    finally:
        client.close()
    return tag, sandbox_image().runtime_dir


@pytest.fixture
def instance(tmp_path, swe_smith_image) -> dict:
    """A mirror in the published branch layout and one row naming the image, with SWE-smith's profile."""
    work = tmp_path / "work" / "meterkit"
    for rel, text in METERKIT.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    mirrors = tmp_path / "mirrors"
    repo, bugs = publish(work, "hermes", mirrors, {"func_pm_op_change__cm": BUG})
    instance_id, (base_commit, patch) = next(iter(bugs.items()))
    row = {
        "instance_id": instance_id,
        "repo": repo,
        "patch": patch,
        "base_commit": base_commit,
        "FAIL_TO_PASS": json.dumps(["tests/test_convert.py::test_to_cm", "tests/test_convert.py::test_area"]),
        "PASS_TO_PASS": json.dumps(["tests/test_zero.py::test_zero"]),
        "problem_statement": "to_cm(10) returns 3.94; ten inches are 25.4 cm.",
        "image_name": swe_smith_image[0],
        "created_at": "2025-01-01T00:00:00",
    }
    (tmp_path / "instances.jsonl").write_text(json.dumps(row) + "\n")
    profile = {"test_cmd": TEST_CMD, "language": "python", "image_name": swe_smith_image[0]}
    (tmp_path / "profiles.json").write_text(json.dumps({repo: profile}))
    return {"row": row, "mirrors": mirrors, "runtime_dir": swe_smith_image[1], "image": swe_smith_image[0]}


def backend_yaml(instance: dict, docker_test_id: str) -> str:
    return textwrap.dedent(
        f"""\
        env:
          runtime:
            tool_backend: sandbox
            sandbox:
              backend:
                kind: docker
                engine: {ENGINE}
                image: {instance["image"]}
                pull: never
                runtime_dir: {instance["runtime_dir"]}
                labels: {{"{TEST_LABEL}": "{docker_test_id}"}}
                pool: {{slots_per_sandbox: 2, min_sandboxes: 1, max_sandboxes: 1, health_interval_s: 30}}
        """
    )


def _oracle_config(tmp_path: Path, instance: dict, backend) -> SweSmithOracleEnvConfig:
    """The oracle env on `instance`'s local data, one group of one, its slots on `backend`."""
    return SweSmithOracleEnvConfig(
        tokenizer_name=embedded_tokenizer(),
        use_wandb=False,
        group_size=1,
        total_steps=1,
        runtime={"tool_backend": "sandbox", "sandbox": SandboxToolBackendConfig(backend=backend)},
        dataset=str(tmp_path / "instances.jsonl"),
        mirror_base=str(instance["mirrors"]),
        profiles=str(tmp_path / "profiles.json"),
        cache_dir=str(tmp_path / "cache"),
        data_path_to_save_groups=str(tmp_path / "groups.jsonl"),
        ensure_scores_are_not_same=False,
    )


@pytest.mark.slow
def test_oracle_scores_1_and_noop_0_in_the_instances_image(tmp_path, instance, docker_test_id):
    config = tmp_path / "docker.yaml"
    config.write_text(backend_yaml(instance, docker_test_id))

    def evaluate(agent: str):
        proc = run_cli(
            SweSmithOracleEnv,
            "evaluate",
            *("--config", str(config)),
            *("--openai.base_url", server.base_url, "--openai.model_name", "scripted", "--openai.api_key", "x"),
            *("--env.tokenizer_name", embedded_tokenizer()),
            *("--env.agent", agent, "--env.dataset", str(tmp_path / "instances.jsonl")),
            *("--env.mirror_base", str(instance["mirrors"]), "--env.profiles", str(tmp_path / "profiles.json")),
            *("--env.cache_dir", str(tmp_path / "cache")),
            *("--env.data_path_to_save_groups", str(tmp_path / agent / "groups.jsonl")),
            *("--env.data_dir_to_save_evals", str(tmp_path / agent / "eval")),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    with serving_in_a_thread(ScriptedOpenAIServer([])) as server:
        oracle, noop = evaluate("oracle"), evaluate("noop")
    # The row names an image: on docker it runs there (the local backend would skip it).
    assert "1 usable instances of 1 rows\n" in oracle.stderr
    assert "'eval/resolved': 1.0" in oracle.stdout, oracle.stdout[-2000:]
    assert "'eval/resolved': 0.0" in noop.stdout, noop.stdout[-2000:]
    preds = [json.loads(x) for x in (tmp_path / "oracle" / "preds.jsonl").read_text().splitlines()]
    assert [p["hermes"]["changed_files"] for p in preds] == [["src/meterkit/__init__.py"]]
    assert preds[0]["hermes"]["score"] == 1.0 and not preds[0]["hermes"]["flagged"]


class TerminalAgent:
    """Runs one scripted shell command through the terminal tool, then says it is done."""

    def __init__(self, command: str) -> None:
        self.command = command

    async def chat(self, messages, tools, options) -> ModelTurn:
        if any(m.get("role") == "tool" for m in messages):
            return ModelTurn(content="All tests pass now.")
        args = json.dumps({"command": self.command, "timeout": 120})
        call = {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": args}}
        return ModelTurn(content=None, tool_calls=[call])


# In /testbed, with the image's environment: a failing copy of the hidden test file and a conftest.py that
# turns every outcome into a pass (the hack works in the agent's slot), then writes into the image's env.
TAMPER = f"""\
pwd; id -u
python3 -c 'import socket; print("IFACES", [n for _, n in socket.if_nameindex()])'
/usr/bin/python3 -c 'import unitconv' 2>/dev/null && echo BASE-HAS-DEP || echo BASE-LACKS-DEP
cat > conftest.py <<'EOF'
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
EOF
printf 'from meterkit import to_cm\\n\\n\\ndef test_to_cm():\\n    assert to_cm(10) == 25.4\\n' > tests/test_convert.py
{TEST_CMD} -p no:cacheprovider tests/test_convert.py 2>&1 | tail -3
site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo 'import sys' > "$site/zz_force.pth" && echo ENV-WRITABLE || echo ENV-READ-ONLY
"""


@pytest.mark.slow
async def test_a_noop_that_tampers_with_the_runner_in_testbed_scores_0(tmp_path, instance, docker_test_id):
    pool = SlotPoolConfig(slots_per_sandbox=2, min_sandboxes=1, max_sandboxes=1, health_interval_s=30)
    backend = DockerBackendConfig(
        engine=ENGINE,
        image=instance["image"],
        pull="never",
        runtime_dir=str(instance["runtime_dir"]),
        labels={TEST_LABEL: docker_test_id},
        pool=pool,
    )
    config = _oracle_config(tmp_path, instance, backend)
    async with ScriptedOpenAIServer([]) as server:
        env = SweSmithOracleEnv(config, [APIServerConfig(base_url=server.base_url, model_name="scripted", api_key="x")])
        async with env.runtime():
            await env.setup()
            item = env.instances[0]
            hack = await env.rollout(item, model=TerminalAgent(TAMPER))
            fixed = await env.rollout(item, model=OracleAgent(env.by_id))
    output = json.loads(next(m for m in hack.result.messages if m["role"] == "tool")["content"])["output"]
    prompt = next(m for m in hack.result.messages if m["role"] == "user")["content"]
    assert "\nRepository path: /testbed\n" in prompt
    assert "\nThe repository's environment: source /opt/miniconda3/bin/activate; conda activate testbed" in prompt
    lines = output.splitlines()
    assert lines[0] == "/testbed" and lines[1] != "0", output  # the repository's place, not root
    assert "1 passed" in output, output  # the tampered runner passes the bug in the agent's own slot
    assert "IFACES ['lo']" in output, output  # offline: no interface but loopback
    assert "BASE-LACKS-DEP" in output, output  # the dependency is only in the activated env
    assert "ENV-READ-ONLY" in output, output  # the image's environment is not the agent's to change
    verdict = next(iter(env.verdicts.values()))  # the hack's (rollouts ran one after the other)
    assert fixed.score == 1.0, list(env.verdicts.values())[-1]
    assert hack.score == 0.0 and verdict.statuses["tests/test_convert.py::test_to_cm"] == "FAILED", verdict
    assert sorted((f.path, f.reason) for f in verdict.dropped) == [
        ("conftest.py", "test configuration"),
        ("tests/test_convert.py", "test file"),
    ]
    assert fixed.score == 1.0, list(env.verdicts.values())[-1]


def test_verifying_in_the_agents_slot_is_refused_on_images():
    backend = DockerBackendConfig(image="debian:bookworm", pull="never")
    config = SweSmithOracleEnvConfig(
        tokenizer_name=embedded_tokenizer(),
        use_wandb=False,
        runtime={"tool_backend": "sandbox", "sandbox": SandboxToolBackendConfig(backend=backend)},
        verify_in="same_slot",
    )
    with pytest.raises(HermesEnvError, match="same_slot cannot verify in the instance's image"):
        SweSmithOracleEnv(config, [APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name="m", api_key="x")])


def test_the_probe_parses_as_python_39():
    """The probe runs in the image's own Python: SWE-smith's images have 3.10 to 3.12 (its constants'
    "python" specs); the 3.9 grammar leaves a margin. The e2e tests above load it on bookworm's 3.11 and pytest 7.2."""
    for shipped in ("verifier_probe.py", "verifier_watch.py"):  # the watch is shipped beside the probe
        source = (Path(__file__).resolve().parents[2] / "environments" / shipped).read_text()
        ast.parse(source, feature_version=(3, 9))


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_oracle_scores_1_and_noop_0_in_the_instances_image_on_modal(tmp_path, instance, project_sandbox_image):
    """On the Modal double the row runs in its `image_name` as the registry has it (SWE-smith's published image,
    no runtime in it) with the runtime layered on as Modal builds it, the repository at /testbed."""
    from backends.modal import DOCKERFILE, ModalBackendConfig, modal_backend  # noqa: PLC0415
    from environments.image_sandboxes import ImageSandboxes  # noqa: PLC0415
    from tests.support.nomad_modal_doubles import ModalTestDouble  # noqa: PLC0415

    registry = {instance["image"]: instance["image"], f"dockerfile:{DOCKERFILE}": project_sandbox_image}
    double = ModalTestDouble(tmp_path / "modal", images=registry)

    def on_modal(config):
        return modal_backend(config, double)

    class OnModal(SweSmithOracleEnv):
        def make_tool_backend(self):
            if super().make_tool_backend() is None:  # one pool over the backend's image
                return on_modal(self.config.runtime.sandbox.resolved_backend())
            return ImageSandboxes(self.config.runtime.sandbox, factory=on_modal)

    pool = SlotPoolConfig(slots_per_sandbox=2, min_sandboxes=1, max_sandboxes=1, health_interval_s=30)
    backend = ModalBackendConfig(
        pool=pool, create_rate_per_s=50, startup_timeout_s=120, runtime_dir=str(instance["runtime_dir"])
    )
    config = _oracle_config(tmp_path, instance, backend)
    try:
        async with ScriptedOpenAIServer([]) as server:
            env = OnModal(config, [APIServerConfig(base_url=server.base_url, model_name="scripted", api_key="x")])
            async with env.runtime():
                await env.setup()
                item = env.instances[0]
                fixed = await env.rollout(item, model=OracleAgent(env.by_id))
                noop = await env.rollout(item, model=NoOpAgent())
    finally:
        await double.close()
    assert (fixed.error, fixed.score) == (None, 1.0), list(env.verdicts.values())
    assert (noop.error, noop.score) == (None, 0.0), list(env.verdicts.values())
    created = [c for name, c in double.calls if name == "create_sandbox"]
    assert created and {c["image"] for c in created} == {instance["image"]}  # the instance's image, no other
    assert all("/testbed" in c["args"] for c in created)
