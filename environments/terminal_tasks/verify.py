"""Workspace preparation and verification of a terminal task in its slot.

Reward integrity (the agent is assumed hostile, and it shared the workspace with the
verifier): the tests are never in the workspace while the agent works; at verification a
pristine copy goes into a directory with a fresh random name, with a fresh log directory
for the reward file. The agent's processes are gone by then (each command runs in its own
pid namespace and process group, killed when it returns). The test run gets a fixed
environment: HOME outside anything the agent prepared, no user site-packages
(`.pth`/usercustomize), no script directory or cwd on sys.path (a planted `pytest.py` or
`sitecustomize.py` is not importable), and pytest pinned to the pristine tests' own ini
file, rootdir and conftest boundary (`-c`, `--rootdir`, `--confcutdir`), so a planted
conftest.py, pytest.ini, tox.ini, setup.cfg or pyproject addopts is never read.
"""

from __future__ import annotations

import base64
import io
import json
import secrets
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from environments.terminal_tasks.tasks import PathMap, TerminalTask, replay_command

__all__ = ["Verdict", "pack", "setup_script", "verify_script", "parse_verdict", "solution_script"]

_EMPTY_INI = "[pytest]\n"


def pack(files: dict[str, tuple[bytes, int]]) -> str:
    """A base64 tar.gz of {path: (content, mode)}, to travel on a command's stdin."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


def _mapped_files(root: Path, prefix: str, paths: PathMap, *, only: Path | None = None) -> dict[str, tuple[bytes, int]]:
    """Files under root (or the single file/dir `only`), text rewritten to the workspace's paths."""
    base = only if only is not None else root
    items = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
    out = {}
    for p in items:
        data = p.read_bytes()
        try:
            data = paths(data.decode()).encode()
        except UnicodeDecodeError:
            pass  # binary: left as it is
        out[f"{prefix}/{p.relative_to(root)}"] = (data, p.stat().st_mode & 0o777)
    return out


def _inside(root: Path, rel: str) -> Path:
    target = (root / rel).resolve()
    if target != root.resolve() and not target.is_relative_to(root.resolve()):
        raise ValueError(f"{rel!r} leaves the task's build context {root}")
    return target


def setup_script(task: TerminalTask, workspace: str, *, image_has_packages: bool) -> tuple[str, str]:
    """(script, stdin) that builds the task's initial state in the workspace."""
    paths = PathMap.for_task(task, workspace)
    stage = f"{workspace}/.hermes-env-{secrets.token_hex(6)}"
    files: dict[str, tuple[bytes, int]] = {}
    lines = [
        "set -e",
        f"mkdir -p {shlex.quote(stage)}",
        f"base64 -d | tar -xzf - -C {shlex.quote(stage)}",
        f"cd {shlex.quote(workspace)}",
    ]
    for i, step in enumerate(task.setup):
        if step.kind == "workdir" and step.target:
            lines.append(f"mkdir -p {shlex.quote(paths(step.target))} && cd {shlex.quote(paths(step.target))}")
        elif step.kind == "env":
            lines.append(f"export {step.name}={shlex.quote(paths(step.value or ''))}")
        elif step.kind == "copy":
            assert task.context_dir is not None and step.source and step.target
            src = _inside(task.context_dir, step.source)
            if not src.exists():
                raise ValueError(f"{task.id}: COPY source {step.source} is missing from {task.context_dir}")
            files.update(_mapped_files(task.context_dir, f"c{i}", paths, only=src))
            staged = f"{stage}/c{i}/{src.relative_to(task.context_dir.resolve())}"
            target = paths(step.target)
            if src.is_dir():
                lines.append(f"mkdir -p {shlex.quote(target)} && cp -a {shlex.quote(staged)}/. {shlex.quote(target)}/")
            elif target.endswith("/"):
                lines.append(f"mkdir -p {shlex.quote(target)} && cp -a {shlex.quote(staged)} {shlex.quote(target)}")
            else:
                lines.append(
                    f"mkdir -p {shlex.quote(str(PurePosixPath(target).parent))} && "
                    f"cp -a {shlex.quote(staged)} {shlex.quote(target)}"
                )
        elif step.kind == "run":
            command = replay_command(step, image_has_packages=image_has_packages)
            if command.strip():
                lines.append(f"bash -ec {shlex.quote(paths(command))}")
    lines.append(f"rm -rf {shlex.quote(stage)}")
    lines.append(f"mkdir -p {shlex.quote(paths(task.workdir))}")
    return "\n".join(lines) + "\n", pack(files) if files else pack({".keep": (b"", 0o644)})


def solution_script(task: TerminalTask, workspace: str) -> str:
    """One shell command that runs the task's oracle solution from its working directory, then removes it."""
    if task.solution_dir is None:
        raise ValueError(f"{task.id} has no solution/solve.sh")
    sol = f"{workspace}/.hermes-solution-{secrets.token_hex(6)}"
    paths = PathMap.for_task(task, workspace, solution_dir=sol)
    payload = pack(_mapped_files(task.solution_dir, "solution", paths))
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in task.solution_env.items())
    return (
        f"mkdir -p {sol} && base64 -d <<'HERMES_SOLUTION' | tar -xzf - -C {sol}\n{payload}\nHERMES_SOLUTION\n"
        f"cd {shlex.quote(paths(task.workdir))} && {env} bash {sol}/solution/solve.sh; rc=$?; rm -rf {sol}; exit $rc"
    )


def verify_script(task: TerminalTask, workspace: str, *, initial: bool = False) -> tuple[str, str, str]:
    """(script, stdin, nonce): run the pristine tests in a fresh directory and print the verdict after the nonce.

    `initial`: Endless Terminals' test_initial_state.py instead, to check the built initial state.
    """
    nonce = secrets.token_hex(8)
    vdir = f"{workspace}/.hermes-verify-{secrets.token_hex(8)}"
    paths = PathMap.for_task(task, workspace, verify_dir=vdir)
    if task.format == "harbor":
        assert task.tests_dir is not None
        files = _mapped_files(task.tests_dir, "tests", paths)
        if task.test_script is not None:  # --env.bootstrap_tests_with_sandbox_pytest: the sandbox's own pytest
            files["tests/test.sh"] = (paths(task.test_script).encode(), 0o755)
        ini = f"{vdir}/tests/pytest.ini" if (task.tests_dir / "pytest.ini").is_file() else f"{vdir}/pytest.ini"
        run = f"bash {vdir}/tests/test.sh"
    else:
        test = task.initial_test if initial else task.final_test
        assert test is not None
        files = _mapped_files(test.parent, "tests", paths, only=test)
        ini = f"{vdir}/pytest.ini"
        run = f"python3 -m pytest -q {vdir}/tests/{test.name}"
    files["pytest.ini"] = (_EMPTY_INI.encode(), 0o644)
    addopts = f"-p no:cacheprovider --rootdir={vdir}/tests -c {ini} --confcutdir={vdir}/tests"
    # Endless Terminals images carry Ubuntu's bare python3-pytest, so its tests need no plugin, and
    # whatever the slot's interpreter has installed (xdist, hypothesis...) only costs a start-up each
    # run. Harbor's test.sh is the task's own and may install and use plugins: left alone.
    plugins = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"} if task.format == "endless" else {}
    env = {
        "HOME": f"{vdir}/home",
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONNOUSERSITE": "1",
        "PYTHONSAFEPATH": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_ADDOPTS": addopts,
        **plugins,
        **{k: paths(v) for k, v in task.verifier_env.items()},  # the task's paths, as in its test files
    }
    env_words = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    workdir = paths(task.workdir)
    q = shlex.quote
    script = f"""chmod u+rwx {q(workspace)} 2>/dev/null
rm -rf {q(vdir)} && mkdir -p {q(vdir)}/logs/verifier {q(vdir)}/logs/agent {q(vdir)}/home || exit 90
base64 -d | tar -xzf - -C {q(vdir)} || exit 91
cd {q(workdir)} 2>/dev/null || cd {q(workspace)}
env -i PATH="$PATH" {env_words} {run} > {q(vdir)}/logs/verifier/test-stdout.txt 2>&1
rc=$?
# Whatever the tested code left running dies before the verdict is read (only inside the
# sandbox's own pid namespace, whose init is bubblewrap: there `kill -1` reaches nothing else).
[ "$(cat /proc/1/comm 2>/dev/null)" = bwrap ] && kill -KILL -1 2>/dev/null
echo "{nonce} rc $rc"
for f in reward.txt reward.json; do
  p={q(vdir)}/logs/verifier/$f
  if [ -f "$p" ] && [ ! -L "$p" ]; then echo "{nonce} $f $(head -c 65536 "$p" | base64 -w0)"; fi
done
echo "{nonce} log $(tail -c 4000 {q(vdir)}/logs/verifier/test-stdout.txt | base64 -w0)"
rm -rf {q(vdir)}
"""
    return script, pack(files), nonce


@dataclass(frozen=True)
class Verdict:
    reward: float
    reason: str  # how the reward was decided (reward file, exit status, or what went wrong)
    exit_code: int | None
    metrics: dict[str, float]
    log: str = ""


def parse_verdict(task: TerminalTask, output: str, nonce: str) -> Verdict:
    fields: dict[str, str] = {}
    # Only the last block counts: anything printed before the final "rc" line is not the verifier's.
    lines = output.splitlines()
    last_rc = max((i for i, line in enumerate(lines) if line.startswith(f"{nonce} rc ")), default=len(lines))
    for line in lines[last_rc:]:
        if line.startswith(nonce + " "):
            _, key, *rest = line.split(" ", 2)
            fields[key] = rest[0] if rest else ""
    rc = int(fields["rc"]) if fields.get("rc", "").lstrip("-").isdigit() else None
    log = base64.b64decode(fields.get("log", "")).decode(errors="replace")
    if rc is None:
        return Verdict(0.0, "the verifier did not run", None, {}, output[-2000:])
    if task.format == "endless":
        # Endless Terminals: the final-state tests pass or they do not; no partial credit.
        return Verdict(1.0 if rc == 0 else 0.0, f"pytest exit status {rc}", rc, {}, log)
    # Harbor reads reward.txt first and falls back to reward.json (Harbor docs, "Tests").
    if "reward.txt" in fields:
        text = base64.b64decode(fields["reward.txt"]).decode(errors="replace").strip()
        try:
            value = float(text)
        except ValueError:
            return Verdict(0.0, f"reward.txt is not a number: {text[:40]!r}", rc, {}, log)
        return Verdict(_clamp(value), "reward.txt", rc, {"reward": value}, log)
    if "reward.json" in fields:
        try:
            data = json.loads(base64.b64decode(fields["reward.json"]))
        except ValueError:
            return Verdict(0.0, "reward.json is not JSON", rc, {}, log)
        metrics = (
            {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if isinstance(data, dict)
            else {}
        )
        if "reward" in metrics:
            return Verdict(_clamp(metrics["reward"]), "reward.json", rc, metrics, log)
        if len(metrics) == 1:
            return Verdict(_clamp(next(iter(metrics.values()))), "reward.json", rc, metrics, log)
        return Verdict(0.0, f"reward.json has no 'reward' among {sorted(metrics)}", rc, metrics, log)
    return Verdict(0.0, f"tests/test.sh wrote no reward file (exit status {rc})", rc, {}, log)


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, value)) if value == value else 0.0  # NaN -> 0
