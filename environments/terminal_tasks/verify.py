"""Workspace preparation and verification of a terminal task in its slot.

Reward integrity (the agent is assumed hostile, and it shared the workspace with the
verifier): the tests are never in the workspace while the agent works; at verification a
pristine copy goes into a directory with a fresh random name in the verifying command's own
/tmp (a fresh tmpfs, never the workspace), with a fresh log directory for the reward file. The agent's processes are gone by then (each command runs in its own
pid namespace and process group, killed when it returns). The test run gets a fixed
environment: HOME outside anything the agent prepared, no user site-packages
(`.pth`/usercustomize), no script directory or cwd on sys.path (a planted `pytest.py` or
`sitecustomize.py` is not importable), and pytest pinned to the pristine tests' own ini
file, rootdir and conftest boundary (`-c`, `--rootdir`, `--confcutdir`), so a planted
conftest.py, pytest.ini, tox.ini, setup.cfg or pyproject addopts is never read.

The tests run the agent's programs as the same uid as test.sh, so those programs could write
reward.txt = 1 and make it read-only (test.sh's own write then fails), or leave a process
that keeps writing it. test.sh is therefore run under a guard (`_GUARD`, see
docs/security.md): before each of its commands that names reward.txt/reward.json, and when it
exits, every process the tests left outside test.sh's own process tree is killed and any
reward file test.sh's own reward commands did not write is discarded (the reward directory
is put back if it was made read-only or swapped for a link). Git in the verifier reads no
system/global config and runs no fsmonitor, hook, pager or editor the repository configures.
The verifier's own steps and the guard run their programs from the system PATH only (the image's PATH may
name a workspace directory); a test.sh shell killed by a signal, whose guard never ran, scores 0.
Nor may they ptrace that shell or the pytest it runs, in whatever form (make it exit 0 before its guard runs,
through ptrace, /proc/PID/mem, process_vm_writev...): the shell starts with LD_PRELOAD naming hermes-confine.so
(sandbox_server/exec_confine.c, bound read-only at CONFINE_FILE by the sandbox server), and keeps it, so every
dynamically linked program below loads it; its exec and posix_spawn functions start each program in a fresh Landlock
domain nested in its parent's, which cannot reach any ancestor (a parent still traces its children). What a static
program or libc's own spawns (system(), popen()) exec stays in its spawner's domain, exposing that spawner only; pytest run as
`python3 -m pytest` is also non-dumpable (_PYTEST_BOOT). Signals are not scoped: a program can stop test.sh's shell
(the verifier then times out: 0). Where the confinement does not take (no Landlock, library not bound or not
loadable), the verdict's reason says so and `Verdict.confined` is False (docs/security.md).
Nothing of this reaches the programs under test as an import-path change: the pytest that
test.sh starts with `python3 -m pytest` leaves the working directory off sys.path through a
shell function, not PYTHONSAFEPATH (which every program the tests run would inherit).
"""

from __future__ import annotations

import base64
import hashlib
import io
import secrets
import shlex
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from environments.terminal_tasks.guard import GUARD_FAILED, guard_script
from environments.terminal_tasks.reward import RewardError, read_rewards
from environments.terminal_tasks.tasks import PathMap, TerminalTask, replay_command
from sandbox_server.bundle import SYSTEM_PATH
from sandbox_server.isolation import CONFINE_FILE

__all__ = ["Verdict", "pack", "setup_script", "verify_script", "parse_verdict", "solution_script"]

_EMPTY_INI = "[pytest]\n"

# `python -m pytest` without the working directory (a planted pytest.py) on sys.path; the flag
# -P would do it on Python >= 3.11 only, PYTHONSAFEPATH would reach every program the tests run.
# Then pytest makes itself non-dumpable (prctl PR_SET_DUMPABLE 0; after sys.path lost the working directory,
# so a planted ctypes.py is not what it imports): the programs its tests run share its uid and may not
# ptrace it or write its memory to make it exit 0 (its status is Endless Terminals' verdict, and what a
# test.sh decides its reward on). Its own children stay dumpable (exec resets it): tests may trace those.
_PYTEST_BOOT = (
    "import runpy, sys; del sys.path[0]\n"
    "try:\n    import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\nexcept Exception:\n    pass\n"
    "sys.argv[0] = 'pytest'; runpy.run_module('pytest', run_name='__main__', alter_sys=True)"
)

# Git as the tests run it: no system/global config, and none of the commands a repository's own
# config can make git run (core.fsmonitor, hooks, pager, editor, credential helpers, ext::).
GIT_PINNED = {
    "core.fsmonitor": "false",
    "core.hooksPath": "/dev/null",
    "core.pager": "cat",
    "core.editor": "true",
    "core.askPass": "",
    "credential.helper": "",
    "protocol.ext.allow": "never",
}
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_CONFIG_COUNT": str(len(GIT_PINNED)),
    **{f"GIT_CONFIG_KEY_{i}": k for i, k in enumerate(GIT_PINNED)},
    **{f"GIT_CONFIG_VALUE_{i}": v for i, v in enumerate(GIT_PINNED.values())},
}

# Whether pid 1 is bubblewrap, i.e. this runs in the sandbox's own pid namespace: bwrap run as it
# is, or by the sandbox runtime's own loader (`LOADER --library-path LIB .../bwrap`, the container
# backends), whose /proc/1/comm is the loader's name. A builtin read: no fork per check.
_PID1_IS_BWRAP = r"""__hermes_pid1_is_bwrap() {
  local a=()
  mapfile -d '' -n 4 a < /proc/1/cmdline 2>/dev/null
  [ "${a[0]##*/}" = bwrap ] || { [ "${a[1]-}" = --library-path ] && [ "${a[3]##*/}" = bwrap ]; }
}
"""

# Preloaded into every program of the verifier's tree (exec_confine.c; the sandbox server binds it read-only at
# CONFINE_FILE): each program exec'd starts in a Landlock domain nested in its parent's, which cannot ptrace it.
UNCONFINED = (
    f"the tested programs could ptrace the verifier's shell and pytest ({CONFINE_FILE} absent: the sandbox server "
    "has no hermes-confine.so (run scripts/setup.sh, rebuild the runtime), or the image's bash does not load it, "
    "or no Landlock in the sandbox's kernel)"
)
# The verifier's own steps (and the guard's) find their programs on SYSTEM_PATH, as the sandbox server
# finds bash: never on the image's PATH, which may name a workspace directory the agent planted programs in.


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


def _manifest(files: dict[str, tuple[bytes, int]], root: str) -> str:
    """`sha256sum -c` lines for the packed files as they will be under `root`."""
    return "\n".join(f"{hashlib.sha256(data).hexdigest()}  {root}/{name}" for name, (data, _) in sorted(files.items()))


def _inside(root: Path, rel: str) -> Path:
    target = (root / rel).resolve()
    if target != root.resolve() and not target.is_relative_to(root.resolve()):
        raise ValueError(f"{rel!r} leaves the task's build context {root}")
    return target


def setup_script(task: TerminalTask, workspace: str, *, image_has_packages: bool) -> tuple[str, str]:
    """(script, stdin) that builds the task's initial state in the workspace."""
    paths = PathMap.for_task(task, workspace)
    stage = f"/tmp/hermes-env-{secrets.token_hex(6)}"  # the command's private /tmp: never in the workspace
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
    sol = f"/tmp/hermes-solution-{secrets.token_hex(6)}"
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
    # In the command's private /tmp (a fresh tmpfs): nothing the agent left is there, and tests that
    # list or hash the working directory do not see the verifier's files.
    vdir = f"/tmp/hermes-verify-{secrets.token_hex(8)}"
    paths = PathMap.for_task(task, workspace, verify_dir=vdir)
    so = shlex.quote(CONFINE_FILE)
    if task.format == "harbor":
        assert task.tests_dir is not None
        files = _mapped_files(task.tests_dir, "tests", paths)
        if task.test_script is not None:  # --env.bootstrap_tests_with_sandbox_pytest: the sandbox's own pytest
            files["tests/test.sh"] = (paths(task.test_script).encode(), 0o755)
        ini = f"{vdir}/tests/pytest.ini" if (task.tests_dir / "pytest.ini").is_file() else f"{vdir}/pytest.ini"
        guard = guard_script(
            reward_dir=f"{vdir}/logs/verifier",
            chain=["/tmp", vdir, f"{vdir}/logs", f"{vdir}/logs/verifier"],
            pytest_boot=_PYTEST_BOOT,
            manifest=_manifest(files, vdir),
            own_pid_ns=_PID1_IS_BWRAP + "__hermes_own_pid_ns() { __hermes_pid1_is_bwrap; }",
        )
        run = f'$preload "$sys_bash" -c {shlex.quote(guard)} {vdir}/tests/test.sh'
    else:
        test = task.initial_test if initial else task.final_test
        assert test is not None
        files = _mapped_files(test.parent, "tests", paths, only=test)
        ini = f"{vdir}/pytest.ini"
        # pytest's own status is the verdict: it starts confined (exec'd by a shell that preloads the library),
        # so the programs its tests run cannot ptrace this script, nor pytest (their domains nest in its own);
        # it is non-dumpable too (_PYTEST_BOOT), for what a static program or libc's own spawns run.
        pytest_run = f"exec python3 -c {shlex.quote(_PYTEST_BOOT)} -q {vdir}/tests/{test.name}"
        run = f'$preload "$sys_bash" -c {shlex.quote(pytest_run)}'
    # Whether the programs the tests run start confined (the library bound and loadable, Landlock here): one
    # run by a shell that preloads the library must fail to open that shell's memory.
    confine = (
        f'preload=\n[ -f {so} ] && env -i PATH={SYSTEM_PATH} LD_PRELOAD={so} "$sys_bash" -c '
        """'unset LD_PRELOAD; ! bash -c "exec 3</proc/\\$PPID/mem" 2>/dev/null' 2>/dev/null"""
        f" && preload=LD_PRELOAD={so}\n"
    )
    report = f'[ -z "$preload" ] && echo "{nonce} unconfined"\n'
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
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_ADDOPTS": addopts,
        **GIT_ENV,
        **plugins,
        **{k: paths(v) for k, v in task.verifier_env.items()},  # the task's paths, as in its test files
    }
    env_words = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    workdir = paths(task.workdir)
    q = shlex.quote
    # The shell that runs test.sh (or pytest) is the system's bash by absolute path: env would look `bash` up on
    # the image's PATH, where a workspace directory may hold one the agent planted (it would be the guard itself).
    script = f"""{_PID1_IS_BWRAP}image_path="$PATH" PATH={SYSTEM_PATH}
sys_bash=$(type -P bash) || exit 92
chmod u+rwx {q(workspace)} 2>/dev/null
rm -rf {q(vdir)} && mkdir -p {q(vdir)}/logs/verifier {q(vdir)}/logs/agent {q(vdir)}/home || exit 90
base64 -d | tar -xzf - -C {q(vdir)} || exit 91
cd {q(workdir)} 2>/dev/null || cd {q(workspace)}
{confine}env -i PATH="$image_path" {env_words} {run} > {q(vdir)}/logs/verifier/test-stdout.txt 2>&1
rc=$?
# test.sh's shell died by a signal (its tested programs run as its uid and may SIGKILL it): its guard
# never ran, so a reward file they wrote is still there. No reward.
[ {int(task.format == "harbor")} = 1 ] && [ $rc -gt 128 ] && rc={GUARD_FAILED}
# Whatever the tested code left running dies before the verdict is read (only inside the
# sandbox's own pid namespace, whose init is bubblewrap: there `kill -1` reaches nothing else).
__hermes_pid1_is_bwrap && kill -KILL -1 2>/dev/null
echo "{nonce} rc $rc"
[ $rc = {GUARD_FAILED} ] && echo "{nonce} guard failed"
{report}for f in reward.txt reward.json; do
  p={q(vdir)}/logs/verifier/$f
  if [ -f "$p" ] && [ ! -L "$p" ]; then echo "{nonce} $f $(head -c 65536 "$p" | base64 -w0)"; fi
done
echo "{nonce} log $(tail -c 4000 {q(vdir)}/logs/verifier/test-stdout.txt | base64 -w0)"
rm -rf {q(vdir)}
exit 0
"""
    return script, pack(files), nonce


@dataclass(frozen=True)
class Verdict:
    reward: float | None  # None: no reward (Harbor's trial error: a missing, empty or unreadable reward file)
    reason: str  # how the reward was decided (reward file, exit status, or what went wrong)
    exit_code: int | None
    metrics: dict[str, float]
    log: str = ""
    # Whether the programs the tests ran could not ptrace the verifier's processes (test.sh's shell, pytest).
    confined: bool | None = None


def parse_verdict(task: TerminalTask, output: str, nonce: str, exit_code: int | None = 0) -> Verdict:
    """`exit_code`: the verifying script's own; only a script that ran to its end (0) prints the verdict
    last, so any other status (killed, timed out) scores 0 whatever lines its output holds."""
    if exit_code != 0:
        return Verdict(0.0, f"the verifying script did not finish (exit status {exit_code})", None, {}, output[-2000:])
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
        verdict = Verdict(1.0 if rc == 0 else 0.0, f"pytest exit status {rc}", rc, {}, log)
    else:
        verdict = _harbor_verdict(fields, rc, log)
    if "unconfined" in fields:
        return replace(verdict, reason=f"{verdict.reason}; {UNCONFINED}", confined=False)
    return replace(verdict, confined=True)


def _harbor_verdict(fields: dict[str, str], rc: int, log: str) -> Verdict:
    if "guard" in fields:
        return Verdict(
            0.0, "processes the tests left running could not be stopped, or the tests' files were changed", rc, {}, log
        )
    files = {f: base64.b64decode(fields[f]) if f in fields else None for f in ("reward.json", "reward.txt")}
    try:
        read = read_rewards(files["reward.json"], files["reward.txt"])
    except RewardError as exc:  # Harbor: a trial error, not a 0
        return Verdict(None, f"{exc} (test.sh exit status {rc})", rc, {}, log)
    return Verdict(read.reward, read.source, rc, read.metrics, log)
