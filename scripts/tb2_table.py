"""Oracle and no-op on every published Terminal-Bench 2 task, on the docker engine: a markdown table.

    .venv/bin/python -m scripts.tb2_table --out docs/tb2_table.md [--only a,b] [--limit N] [--astral-mirror]

Each task goes through what the terminal env runs on the docker backend (environments/terminal_tasks/
container_run.py): its image resolved (docker_image if the engine has it, else its Dockerfile built with the
host CA bundle), one task container for the oracle (solution/solve.sh as root from the workdir, under the
task's agent timeout) and one for the no-op agent, each verified as Harbor does. A row says: built or why
not, the oracle's and no-op's rewards, wall time, and an `infrastructure: <cause>` where a need of this
machine's network (a host that does not resolve, a registry) decided it: those rows are not scores.
Before a task runs, the hosts its files name are resolved here; the ones that do not resolve are listed.

--astral-mirror serves astral.sh (uv's installer, from the uv wheel) on the task containers' network
(tests/support/astral_mirror.py): every published test.sh fetches uv from there. The table states it.
The tasks come from the mirror of yujianll/skill-usage (terminal-bench-2/), exported with git.
The table is rewritten after every task, so a partial run leaves a partial table.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from backends.docker import DockerBackendConfig
from backends.task_container import TaskContainerConfig, TaskContainers
from environments.image_sandboxes import DockerImages, ImageUnavailable, infrastructure_cause
from environments.terminal_tasks.container_run import (
    task_container,
    task_spec,
    unresolved_hosts,
    verify_in_container,
)
from environments.terminal_tasks.genuine import GenuineCheck
from environments.terminal_tasks.harbor import load_harbor_task
from environments.terminal_tasks.sandboxes import task_recipe
from environments.terminal_tasks.verify import solution_script

MIRROR = Path("/work/.mirror/yujianll+skill-usage/repo")

ENGINE = "unix:///var/run/docker.sock"
LABEL = {"hermes-rl.tb2-table": "1"}


def _unreadable(mirror: Path, path: str, stderr: str) -> str:
    """The files of `path` whose blob git said it cannot read ("error: cannot read '<sha>'")."""
    shas = set(re.findall(r"cannot read '([0-9a-f]{40})'", stderr))
    tree = subprocess.run(
        ["git", "-C", str(mirror), "ls-tree", "-r", "HEAD", path], capture_output=True, text=True, check=False
    )
    files = [ln.split("\t", 1)[1].removeprefix(path + "/") for ln in tree.stdout.splitlines() if ln.split()[2] in shas]
    if files:
        return f"{', '.join(files)} not in the mirror"
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else ""


def export_tasks(dest: Path, mirror: Path = MIRROR) -> tuple[Path, dict[str, str]]:
    """terminal-bench-2/ of the mirror, as files, one task at a time (a blob the mirror lacks spoils one task only).

    Also returns the tasks whose `git archive` failed, with git's first error line: such an archive is empty, so
    without this the task would have no directory and no row."""
    listing = subprocess.run(
        ["git", "-C", str(mirror), "ls-tree", "-d", "--name-only", "HEAD", "terminal-bench-2/"],
        capture_output=True,
        text=True,
        check=True,
    )
    broken: dict[str, str] = {}
    for path in listing.stdout.split():
        archive = subprocess.run(["git", "-C", str(mirror), "archive", "HEAD", path], capture_output=True, check=False)
        if archive.returncode != 0:
            broken[Path(path).name] = _unreadable(mirror, path, archive.stderr.decode(errors="replace"))
            continue
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, capture_output=True, check=False)
    return dest / "terminal-bench-2", broken


_DOWNLOAD = re.compile(r"Failed to download:? `?https?://([\w.-]+)")


def network_cause(log: str) -> str | None:
    """`infrastructure: ...` where a test log failed on a host this machine cannot resolve (curl's message, or
    uv's when it fetches a CPython the image lacks from github.com), else None."""
    cause = infrastructure_cause(log)
    if not cause or "does not resolve" not in cause:
        return None
    uv = _DOWNLOAD.search(log)
    if uv and "(" not in cause:
        why = ": uv fetches a CPython the image lacks" if "python-build-standalone" in log else ""
        return f"{cause} ({uv.group(1)}{why})"
    return cause


def failed_tests(log: str) -> str:
    """What a test log says went wrong, briefly: pytest's FAILED/ERROR summary lines, else its last line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    failed = [ln[:120] for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    return "; ".join(failed[:3]) if failed else (lines[-1][:160] if lines else "no output")


async def run_agent(
    engines: TaskContainers, task, image: str, oracle: bool, logs: Path | None, genuine: GenuineCheck
) -> tuple[str, str]:
    """(reward or `infrastructure: ...`, note) of one agent on one task; its logs to `logs` when given."""
    agent = "oracle" if oracle else "noop"
    async with task_container(engines, task_spec(task, image, network=task.allow_internet), task.id) as ex:
        if oracle:
            ran = await ex.exec(
                solution_script(task, task.workdir_root), timeout=task.agent_timeout_s, max_output_bytes=200_000
            )
            if logs:
                (logs / f"{task.id}.solve.txt").write_text(ran.output)
            if ran.timed_out:
                return "0", f"solve.sh ran over {task.agent_timeout_s:g}s"
        verdict = await verify_in_container(ex, task, genuine)
    if logs:
        (logs / f"{task.id}.{agent}.test.txt").write_text(verdict.log)
    cause = network_cause(verdict.log) if verdict.reward != 1.0 else None
    if cause:
        return cause, verdict.reason
    note = "FLAGGED " + "; ".join(verdict.flags[:2]) if verdict.flags else verdict.reason
    if not verdict.flags and verdict.reward != (1.0 if oracle else 0.0):
        note += f" [{failed_tests(verdict.log)}]"
    return f"{verdict.reward:g}" if verdict.reward is not None else "none", note


def _base(task_dir: Path) -> str:
    dockerfile = task_dir / "environment" / "Dockerfile"
    text = dockerfile.read_text(errors="replace") if dockerfile.is_file() else ""
    return next((ln.split()[1] for ln in text.splitlines() if ln.strip().upper().startswith("FROM ")), "")


def _base_present(task_dir: Path) -> bool:
    found = subprocess.run(["docker", "image", "inspect", _base(task_dir)], capture_output=True, check=False)
    return found.returncode == 0


def built_on(task_dir: Path) -> str:
    """`yes`, or `yes, on a stand-in for <base>` where the base image is one scripts/base_images.sh made."""
    base = _base(task_dir)
    label = subprocess.run(
        ["docker", "image", "inspect", "-f", '{{index .Config.Labels "hermes-rl.stand-in"}}', base],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"yes, on a stand-in for {base}" if label and label != "<no value>" else "yes"


def row(name: str, built: str, oracle: str, noop: str, wall: float, notes: str) -> str:
    cells = [name, built, oracle, noop, f"{wall:.0f}", notes.replace("|", "/").replace("\n", " ")[:300]]
    return "| " + " | ".join(cells) + " |"


async def main_async(args: argparse.Namespace) -> None:
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tb2-table-")))
        root, broken = (args.tasks, {}) if args.tasks else export_tasks(tmp)
        names = sorted({p.name for p in root.iterdir() if p.is_dir()} | set(broken))
        if args.only:
            names = [n for n in names if n in args.only.split(",")]
        if args.skip:
            names = [n for n in names if n not in args.skip.split(",")]
        names = names[: args.limit] if args.limit else names
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
        # Tasks whose base image the engine lacks fail at once: their rows first, then the long builds.
        names.sort(key=lambda n: (_base_present(root / n), n))
        network, bundle, how = None, None, "the machine's network as it is"
        if args.astral_mirror:
            from tests.support.astral_mirror import astral_mirror  # noqa: PLC0415 - run from the repo root (-m)

            # One CA across runs (build/tb2-table-ca): the image tags carry the bundle's hash, so a second run
            # reuses the first one's images.
            mirror = stack.enter_context(astral_mirror(tmp, ca_dir=Path("build/tb2-table-ca")))
            network, bundle = mirror.network, str(mirror.ca_bundle)
            how = "astral.sh served by tests/support/astral_mirror.py (uv from its wheel); the rest as it is"
        backend = DockerBackendConfig(engine=ENGINE, ca_bundle=bundle or "host")
        images = DockerImages(ENGINE, labels=LABEL, ca_bundle=backend.ca_bundle_bytes())
        genuine = GenuineCheck(ca_bundle=backend.ca_bundle_bytes())  # PyPI from the host, as the builds reach it
        config = TaskContainerConfig(engine=ENGINE, storage="unenforced", labels=LABEL, network=network)
        header = [
            f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on this machine ({how}); storage_mb not "
            "enforced (no per-container quota here). Rewards are Harbor's (reward.txt/json); `infrastructure:` "
            "rows are not scores.",
            "",
            "| task | built | oracle | no-op | wall s | notes |",
            "|---|---|---|---|---|---|",
        ]
        rows: list[str] = []
        done: set[str] = set()
        async with TaskContainers(config) as engines:
            for name in names:
                started = time.monotonic()
                task_dir = root / name
                if name in broken or not (task_dir / "task.toml").is_file():
                    why = f": {broken[name]}" if broken.get(name) else ""
                    rows.append(
                        row(name, f"no: the mirror lacks some of its files (git archive failed{why})", "-", "-", 0, "")
                    )
                    print(rows[-1], flush=True)
                    done.add(name)
                    continue
                missing = unresolved_hosts(task_dir)
                pre = f"hosts not resolving here: {', '.join(missing)}; " if missing else ""
                try:
                    task = load_harbor_task(task_dir)
                    image = await images.resolve(task_recipe(task, "hermes-rl-tb2"))
                except ImageUnavailable as exc:
                    text = str(exc)
                    cause = network_cause(text) or infrastructure_cause(text) or text.splitlines()[0]
                    rows.append(row(name, f"no: {cause}", "-", "-", time.monotonic() - started, pre))
                except Exception as exc:  # noqa: BLE001 - one task's failure is its row
                    rows.append(row(name, f"no: {exc}", "-", "-", time.monotonic() - started, pre))
                else:
                    try:
                        oracle, o_note = await run_agent(
                            engines, task, image, oracle=True, logs=args.logs, genuine=genuine
                        )
                        noop, n_note = await run_agent(
                            engines, task, image, oracle=False, logs=args.logs, genuine=genuine
                        )
                        notes = f"{pre}oracle: {o_note}; no-op: {n_note}"
                    except Exception as exc:  # noqa: BLE001
                        oracle, noop, notes = "error", "error", f"{pre}{type(exc).__name__}: {exc}"
                    rows.append(row(name, built_on(task_dir), oracle, noop, time.monotonic() - started, notes))
                print(rows[-1], flush=True)
                done.add(name)
                not_run = [n for n in names if n not in done]
                tail = ["", f"Not run (time ran out): {', '.join(not_run)}"] if not_run else []
                args.out.write_text("\n".join(header + rows + tail) + "\n")
            # The last tasks' rows may be ones that `continue`d before the write above.
            args.out.write_text("\n".join(header + rows) + "\n")
        images.close()


def _interrupted(signum: int, frame: object) -> None:
    # `kill` (SIGTERM) ends the run like Ctrl-C, so the astral mirror and the task containers are removed
    # on the way out instead of outliving the script.
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupted)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", type=Path, help="A directory of TB2 task dirs (default: export the mirror)")
    parser.add_argument("--only", help="Comma-separated task names")
    parser.add_argument("--skip", help="Comma-separated task names to leave out")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--astral-mirror", action="store_true", help="Serve astral.sh's uv installer locally")
    parser.add_argument("--logs", type=Path, help="A directory for each task's solve.sh and test.sh output")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
