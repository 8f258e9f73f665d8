"""docs/training.md's train path, run as written: run-api, training.grpo and serve, read from the docs.

The three commands are parsed from the docs' first bash block, so the docs and this test cannot
drift. Only the port (8000: a free one, this machine is shared) and the trainer's output
directory (a temporary one) are substituted; every other argument is the documented one. It
passes when the trainer takes its last step and exits 0, serve ends by itself after it, and
every group serve produced was received by run-api (none lost).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.support.run_api import ROOT, free_port, start_process, stop_process

DOC = ROOT / "docs" / "training.md"
COMMANDS = ("run-api", "training.grpo", "environments.gsm8k_agent_env serve")


def documented_train_path(doc: Path = DOC) -> list[list[str]]:
    """[run-api, training.grpo, serve] argv lists as docs/training.md shows them (first bash block)."""
    block = re.search(r"```bash\n(.*?)```", doc.read_text(), re.S)
    assert block, f"{doc} has no bash block"
    found: dict[str, list[str]] = {}
    for line in block.group(1).replace("\\\n", " ").splitlines():  # continuation lines joined
        line = line.split("#", 1)[0].strip().removesuffix("&").strip()
        for name in COMMANDS:
            if name in line and name not in found:
                found[name] = shlex.split(line)
    missing = [n for n in COMMANDS if n not in found]
    assert not missing, f"{doc}: the train path lacks {missing}"
    return [found[n] for n in COMMANDS]


def _localise(argv: list[str], port: int, out: Path) -> list[str]:
    venv_bin = Path(sys.executable).parent
    cmd = [str(venv_bin / a.removeprefix(".venv/bin/")) if a.startswith(".venv/bin/") else a for a in argv]
    return [a.replace("8000", str(port)).replace("runs/grpo", str(out)) for a in cmd]


def test_the_docs_show_the_whole_train_path_on_loopback():
    api, grpo, serve = documented_train_path()
    assert api[api.index("--host") + 1] == "127.0.0.1"  # docs/security.md: loopback only
    url = grpo[grpo.index("--api_url") + 1]
    assert serve[serve.index("--env.rollout_server_url") + 1] == url
    assert serve[-1] == "96"  # the continuation line was read too
    assert url.endswith(":" + api[api.index("--port") + 1])


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_the_documented_train_path_runs_to_the_last_step_with_every_group_received(tmp_path):
    port, out = free_port(), tmp_path / "grpo"
    api_cmd, grpo_cmd, serve_cmd = (_localise(c, port, out) for c in documented_train_path())
    steps = int(grpo_cmd[grpo_cmd.index("--steps") + 1])
    api = start_process(api_cmd, tmp_path / "api.log")
    grpo = serve = None
    try:
        grpo = start_process(grpo_cmd, tmp_path / "grpo.log")
        serve = start_process(serve_cmd, tmp_path / "serve.log")
        serve_rc = serve.wait(2700)  # serve ends by itself once the trainer took its last step
        grpo_rc = grpo.wait(600)
        serve_log, grpo_log = (tmp_path / "serve.log").read_text(), (tmp_path / "grpo.log").read_text()
        assert grpo_rc == 0, grpo_log[-3000:]
        assert serve_rc == 0, serve_log[-3000:]
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == list(range(1, steps + 1))
        assert all(m["sequences"] >= 4 for m in metrics)
        sent = re.findall(r"group \d+ sent to the trainer: (\S+ \S+)", serve_log)
        assert sent and all(s == "run-api received;" for s in sent), sent
        assert "lost" not in serve_log and "Traceback" not in serve_log
        batches = (out / "batches.jsonl").read_text().splitlines()
        assert sum(len(json.loads(b)["batch"]) for b in batches) <= len(sent)
    finally:
        for p in (serve, grpo, api):
            if p is not None:
                stop_process(p)
