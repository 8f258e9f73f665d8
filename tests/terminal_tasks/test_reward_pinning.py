"""Code the tests run cannot pin the reward (issue 22): what the agent leaves behind runs inside
test.sh as the slot's uid, so it could write reward.txt = 1 and make it read-only (test.sh's later
`echo 0 >` then fails), keep rewriting it from a background process, or do either from a git hook
the test's own `git status` runs. Each must score 0; the oracle still scores 1.0 in the same run."""

from __future__ import annotations

import asyncio
import json

import pytest

from environments.terminal_tasks import OracleAgent
from tests.terminal_tasks.conftest import make_env
from tests.terminal_tasks.test_reward_integrity import Commands
from tools.context import ToolContext

# Finds every reward directory the verifier could use (its name is random) and pins reward.txt = 1.
PIN = (
    "for d in $(find / -maxdepth 4 -path /proc -prune -o -type d -name verifier -print 2>/dev/null); do "
    'rm -f "$d/reward.txt"; echo 1 > "$d/reward.txt"; chmod 444 "$d/reward.txt"; chmod 555 "$d"; done'
)
# Detached from the test (stdio closed, new session), it outlives the script and keeps putting a
# reward.txt = 1 in place (renamed over, so a kill never leaves it half written).
SPIN = (
    "setsid bash -c 'd=$(find / -maxdepth 4 -path /proc -prune -o -type d -name verifier -print 2>/dev/null); "
    "end=$((SECONDS + 20)); while [ $SECONDS -lt $end ]; do for x in $d; do "
    'echo 1 > "$x/.r" && mv -f "$x/.r" "$x/reward.txt"; done; done\' </dev/null >/dev/null 2>&1 &'
)


def wordcount_script(payload: str) -> str:
    """fix-script's tests run `bash /app/wordcount.sh FILE`: the agent's version runs the payload first."""
    return f"cat > wordcount.sh <<'EOF'\n#!/bin/bash\n{payload}\nwc -l < \"$1\"\nEOF\nchmod +x wordcount.sh"


def fsmonitor(payload: str) -> str:
    """git-recover's tests run `git status --porcelain` in /app/project: git runs core.fsmonitor, and hooks."""
    hook = f"#!/bin/bash\n{payload}\nexit 1\n"
    return (
        f"cd project && cat > .git/pin.sh <<'EOF'\n{hook}EOF\n"
        'chmod +x .git/pin.sh && git config core.fsmonitor "$PWD/.git/pin.sh"'
        " && mkdir -p .git/hooks && cp .git/pin.sh .git/hooks/post-index-change"
        " && cp .git/pin.sh .git/hooks/reference-transaction"
    )


def clean_filter(payload: str) -> str:
    """A clean filter in the repository's own .git/config and .git/info/attributes (not switched off like
    fsmonitor and hooks): git runs it on every file whose index stat is stale (the agent backdates them all),
    so the tests' own `git status` runs it. Its stdout is the file's content: the payload prints nothing."""
    script = f"#!/bin/bash\n{{ {payload}\n}} >/dev/null 2>&1\ncat\n"
    return (
        f"cd project && cat > .git/clean.sh <<'EOF'\n{script}EOF\n"
        'chmod +x .git/clean.sh && git config filter.p.clean "$PWD/.git/clean.sh" && git config filter.p.smudge cat'
        " && echo '* filter=p' > .git/info/attributes"
        ' && for f in $(git ls-files); do touch -d 2001-01-01 "$f"; done'
    )


ATTACKS = {
    "fix-script": {
        "its script pins reward.txt read-only": Commands(wordcount_script(PIN)),
        "its script leaves a background writer": Commands(wordcount_script(SPIN)),
    },
    "git-recover": {
        "an fsmonitor hook pins reward.txt read-only": Commands(fsmonitor(PIN)),
        "an fsmonitor hook leaves a background writer": Commands(fsmonitor(SPIN)),
        "a clean filter pins reward.txt read-only": Commands(clean_filter(PIN)),
        "a clean filter leaves a background writer": Commands(clean_filter(SPIN)),
    },
}


@pytest.mark.slow
async def test_code_the_tests_run_cannot_pin_the_reward(scripted_server, tmp_path):
    env = make_env(scripted_server.base_url, tmp_path)
    async with env.runtime():
        await env.setup()
        runs = [(task, name, agent) for task, attacks in ATTACKS.items() for name, agent in attacks.items()]
        rollouts = await asyncio.gather(*(env.rollout(env.by_id[t], model=agent) for t, _, agent in runs))
    results = {(t, name): (r.error, r.score) for (t, name, _), r in zip(runs, rollouts)}
    assert all(err is None for err, _ in results.values()), results
    # the attack commands really ran in the slot
    for rollout in rollouts:
        tool = json.loads(next(m for m in rollout.result.messages if m["role"] == "tool")["content"])
        assert tool["exit_code"] == 0, tool
    assert {k: s for k, (_, s) in results.items() if s != 0.0} == {}


@pytest.mark.slow
async def test_the_tests_own_git_runs_no_hook_the_agent_configured(scripted_server, tmp_path):
    """The verifier's git ignores the repository's fsmonitor and hooks, and global/system config."""
    env = make_env(scripted_server.base_url, tmp_path)
    async with env.runtime():
        await env.setup()
        task = env.by_id["git-recover"]
        async with env.open_workspace(task, "git-hooks") as executor:
            ctx = ToolContext(executor=executor)
            await env.setup_trajectory_workspace(task, ctx)
            marker = "touch /app/hook-ran"
            (command,) = ATTACKS["git-recover"]["an fsmonitor hook pins reward.txt read-only"].commands
            assert (await ctx.terminal(command.replace(PIN, marker))).exit_code == 0
            # the hook is live: the agent's own git runs it
            assert (await ctx.terminal("cd project && git status --porcelain; test -e ../hook-ran")).exit_code == 0
            assert (await ctx.terminal("rm hook-ran")).exit_code == 0
            assert await env.compute_reward(task, None, ctx) == 0.0
            gone = await ctx.terminal("test ! -e hook-ran")
            assert gone.exit_code == 0, "the verifier's git ran the agent's fsmonitor or hook"


@pytest.mark.slow
async def test_the_repositorys_clean_filter_runs_in_the_tests_git_and_still_cannot_pin_the_reward(
    scripted_server, tmp_path
):
    """Git has no switch for filters the repository configures: the verifier's git really runs this one
    (its marker shows), so what stops it pinning the reward is the guard, which this exercises."""
    env = make_env(scripted_server.base_url, tmp_path)
    async with env.runtime():
        await env.setup()
        task = env.by_id["git-recover"]
        async with env.open_workspace(task, "clean-filter") as executor:
            ctx = ToolContext(executor=executor)
            await env.setup_trajectory_workspace(task, ctx)
            assert (await ctx.terminal(clean_filter(f"touch /app/filter-ran; {PIN}"))).exit_code == 0
            assert (await ctx.terminal("test ! -e filter-ran")).exit_code == 0  # setting it up ran nothing
            assert await env.compute_reward(task, None, ctx) == 0.0
            ran = await ctx.terminal("test -e filter-ran")
            assert ran.exit_code == 0, "the verifier's git did not run the clean filter: this test shows nothing"


GRADED_TASK = {
    "task.toml": 'version = "1.0"\n\n[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 120.0\n',
    "instruction.md": "Make /app/make_answer.sh write 42 to /app/answer.txt.\n",
    "environment/Dockerfile": "FROM ubuntu:22.04\nWORKDIR /app\nCOPY make_answer.sh /app/\n",
    "environment/make_answer.sh": "#!/bin/bash\necho 41 > /app/answer.txt\n",
    "solution/solve.sh": "#!/bin/bash\nsed -i 's/41/42/' /app/make_answer.sh\n",
    # The agent's script runs first; the grader that writes the reward runs after it.
    "tests/test.sh": "#!/bin/bash\nmkdir -p /logs/verifier\nbash /app/make_answer.sh\n"
    "python3 /tests/grade.py > /logs/verifier/reward.txt\n",
    "tests/grade.py": "print(1 if open('/app/answer.txt').read().strip() == '42' else 0)\n",
}
REWRITE_GRADER = (
    "cat > make_answer.sh <<'EOF'\n#!/bin/bash\necho 41 > /app/answer.txt\n"
    "for g in $(find / -maxdepth 5 -path /proc -prune -o -name grade.py -print 2>/dev/null); do "
    "echo 'print(1)' > \"$g\"; done\nEOF"
)


# The same grader writing the reward file itself: no test.sh command names it.
UNNAMED = {
    "tests/test.sh": "#!/bin/bash\nmkdir -p /logs/verifier\nbash /app/make_answer.sh\npython3 /tests/grade.py\n",
    "tests/grade.py": "ok = open('/app/answer.txt').read().strip() == '42'\n"
    "open('/logs/verifier/reward.txt', 'w').write('1' if ok else '0')\n",
}


@pytest.mark.slow
async def test_code_the_tests_run_cannot_rewrite_a_grader_that_runs_after_it(scripted_server, tmp_path):
    for task_dir, files in {"graded": GRADED_TASK, "graded-unnamed": {**GRADED_TASK, **UNNAMED}}.items():
        for name, text in files.items():
            path = tmp_path / "tasks" / task_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tmp_path / "tasks"))
    async with env.runtime():
        await env.setup()
        runs = [(t.id, agent) for t in env.tasks for agent in (Commands(REWRITE_GRADER), OracleAgent(env.by_id))]
        rollouts = await asyncio.gather(*(env.rollout(env.by_id[t], model=agent) for t, agent in runs))
    assert [r.error for r in rollouts] == [None] * 4
    scores = {(t, type(agent).__name__): r.score for (t, agent), r in zip(runs, rollouts)}
    assert scores == {
        ("graded", "Commands"): 0.0,
        ("graded", "OracleAgent"): 1.0,
        ("graded-unnamed", "Commands"): 0.0,
        ("graded-unnamed", "OracleAgent"): 1.0,
    }
