"""The embedded llama.cpp server and its offline tokenizer, against the real model (SmolLM2-135M)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI
from transformers import AutoTokenizer

from embedded_llm import (
    HERMES_TOOLS_CHAT_TEMPLATE,
    EmbeddedLLM,
    EmbeddedLLMConfig,
    EmbeddedLLMError,
    default_model_path,
    ensure_gguf_tokenizer,
)

pytestmark = pytest.mark.llm

PROJECT = Path(__file__).resolve().parents[1]

TERMINAL_TOOL = {
    "type": "function",
    "function": {
        "name": "terminal",
        "description": "Run a shell command – ünïcode in the description",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    },
}

CONVERSATIONS = {
    "no_system": [{"role": "user", "content": "What is 2+2?"}],
    "system_multi_turn": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?  Answer with digits\n\tonly."},
    ],
    "tool_round_trip": [
        {"role": "user", "content": "List /tmp"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "terminal", "arguments": '{"command": "ls /tmp"}'},
                },
                {"id": "c2", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls -a"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
        {"role": "tool", "tool_call_id": "c2", "content": ".\n..\n日本.txt"},
        {"role": "user", "content": "thanks"},
    ],
    "content_and_call": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Where am I?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "pwd"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "/work"},
    ],
}

TOKENIZER_CORPUS = [
    "Hello world",
    "",
    " ",
    "  leading spaces and trailing   ",
    "def f(x):\n    return x**2  # square\n\n\n\tindented\ttabs",
    "12345 67.89 1,000,000 3.14159e-10 0x1F 2024-11-26",
    "naïve café – “quotes” — 日本語のテキスト 🤖🎉 Ελληνικά ру́сский عربى",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "a<|endoftext|>b<repo_name>c<file_sep>d",
    "don't can't I'm we'll they've she'd IT'S",
    "   \n\n   \r\n\t\t  x\n\n\n",
    "\u00a0nbsp\u200bzero-width\ufeffbom",
    '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls -la /tmp | wc -l"}}\n</tool_call>',
    "x" * 300,
    "1" * 40,
    "ĠĠ looks like BPE Ġ bytes Ċ",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. #### 72",
]


def _server_children() -> list[int]:
    """PIDs of embedded-server child processes started by this test process."""
    me, pids = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and b"embedded_llm" in cmdline and b"_child" in cmdline:
            pids.append(int(entry.name))
    return pids


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_refused(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/health", timeout=1.0)
        except httpx.TransportError:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def tokenizer(embedded_llm):
    return AutoTokenizer.from_pretrained(str(embedded_llm.tokenizer_dir))


# -- lifecycle -------------------------------------------------------------------------------------


def test_sync_start_stop_leaves_no_process():
    before = _server_children()
    llm = EmbeddedLLM(EmbeddedLLMConfig(n_parallel=1, ctx_size=512, omp_spin_count=250))
    llm.start()
    try:
        assert llm.running
        # its OpenMP threads spin briefly, then sleep (see EmbeddedLLMConfig.omp_spin_count)
        assert b"GOMP_SPINCOUNT=250" in Path(f"/proc/{llm.pid}/environ").read_bytes().split(b"\0")
        assert llm.server_url.startswith("http://127.0.0.1:")
        assert llm.base_url == llm.server_url + "/v1"
        assert httpx.get(llm.server_url + "/health").status_code == 200
        assert sorted(_server_children()) == sorted(before + [llm.pid])
        pid, url = llm.pid, llm.server_url
    finally:
        llm.stop()
    assert not llm.running and llm.pid is None
    assert not _pid_alive(pid)
    assert sorted(_server_children()) == sorted(before)
    assert _wait_refused(url, timeout=0.5)
    with pytest.raises(EmbeddedLLMError, match="not running"):
        _ = llm.base_url
    llm.stop()  # idempotent


async def test_async_context_manager_and_fixed_port():
    with socket.socket() as s:  # a free port for the explicit-port case
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = _server_children()
    async with EmbeddedLLM(EmbeddedLLMConfig(port=port, n_parallel=1, ctx_size=512)) as llm:
        assert llm.server_url == f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as c:
            models = (await c.get(llm.base_url + "/models")).json()
        assert [m["id"] for m in models["data"]] == ["SmolLM2-135M-Instruct"]
        pid = llm.pid
    assert not _pid_alive(pid)
    assert sorted(_server_children()) == sorted(before)


async def test_cancelled_startup_leaves_no_process():
    before = _server_children()
    entered = asyncio.Event()

    async def use_server() -> None:
        async with EmbeddedLLM(EmbeddedLLMConfig(n_parallel=1, ctx_size=512)):
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(use_server())
    for _ in range(100):  # cancel while the child is being spawned or loading the model
        await asyncio.sleep(0.01)
        if len(_server_children()) > len(before):
            break
    assert not entered.is_set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _server_children() == before


def test_missing_model_gives_clear_error(tmp_path):
    missing = tmp_path / "nope.gguf"
    before = _server_children()
    with pytest.raises(EmbeddedLLMError, match=r"model file not found: .*nope\.gguf"):
        EmbeddedLLM(EmbeddedLLMConfig(model_path=missing)).start()
    assert _server_children() == before


def test_corrupt_model_error_carries_server_log(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00garbage" * 64)
    before = _server_children()
    with pytest.raises(EmbeddedLLMError) as info:
        EmbeddedLLM(EmbeddedLLMConfig(model_path=bad, startup_timeout=300)).start()  # ends on its own
    message = str(info.value)
    assert "broken.gguf" in message and "before listening" in message
    assert "Last server output:" in message
    # The errors come from the server's own log, not our text: llama.cpp names the file it failed to load.
    errors = message.split("Server errors:")[1].split("Last server output:")[0]
    assert "failed to load model" in errors and "broken.gguf" in errors
    assert _server_children() == before


def test_startup_timeout_kills_the_server():
    before = _server_children()
    with pytest.raises(EmbeddedLLMError, match="did not start within"):
        EmbeddedLLM(EmbeddedLLMConfig(startup_timeout=0.01, n_parallel=1, ctx_size=512)).start()
    assert _server_children() == before


def test_cli_serve_runs_until_ctrl_c():
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedded_llm", "serve", "--parallel", "1", "--ctx-size", "512"],
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert "serving at http://127.0.0.1:" in line, line + proc.stderr.read()
        base_url = line.split("serving at ")[1].strip()
        assert base_url.endswith("/v1")
        server_url = base_url.removesuffix("/v1")
        assert httpx.get(server_url + "/health").status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
        assert _wait_refused(server_url, timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_server_exits_when_its_parent_is_killed():
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedded_llm", "serve", "--parallel", "1", "--ctx-size", "512"],
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        server_url = line.split("serving at ")[1].strip().removesuffix("/v1")
        assert httpx.get(server_url + "/health").status_code == 200
        proc.kill()  # SIGKILL: no cleanup code runs in the parent
        proc.wait()
        assert _wait_refused(server_url, timeout=10), "the orphaned server kept running"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- endpoints -------------------------------------------------------------------------------------


async def test_chat_completion_with_tools_in_prompt(embedded_llm, tokenizer):
    client = AsyncOpenAI(base_url=embedded_llm.base_url, api_key="unused")
    messages = [{"role": "user", "content": "Say hello."}]
    plain = await client.chat.completions.create(
        model=embedded_llm.model_name, messages=messages, max_tokens=8, temperature=0
    )
    assert plain.choices[0].message.content
    assert plain.usage.completion_tokens <= 8
    with_tools = await client.chat.completions.create(
        model=embedded_llm.model_name, messages=messages, tools=[TERMINAL_TOOL], max_tokens=8, temperature=0
    )
    # The server's prompt is exactly our tokenizer's rendering, tools included.
    for response, tools in ((plain, None), (with_tools, [TERMINAL_TOOL])):
        ids = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert response.usage.prompt_tokens == len(ids)
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 50
    # atroposlib asks for a whole group in one request (n=group_size).
    group = await client.chat.completions.create(
        model=embedded_llm.model_name, messages=messages, max_tokens=4, temperature=1.0, n=3
    )
    assert sorted(c.index for c in group.choices) == [0, 1, 2]


async def test_completion_with_token_ids_returns_ids_and_logprobs(embedded_llm, tokenizer):
    prompt = tokenizer.apply_chat_template(CONVERSATIONS["no_system"], tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    async with httpx.AsyncClient(base_url=embedded_llm.server_url, timeout=60) as c:
        r = await c.post(
            "/completion",
            json={"prompt": prompt_ids, "n_predict": 12, "n_probs": 1, "return_tokens": True, "temperature": 0},
        )
        r.raise_for_status()
        body = r.json()
        ids = body["tokens"]
        probs = body["completion_probabilities"]
        assert body["tokens_evaluated"] == len(prompt_ids)
        assert 1 <= len(ids) <= 12 and all(isinstance(i, int) for i in ids)
        assert [p["id"] for p in probs] == ids
        for p in probs:
            assert p["logprob"] <= 0.0
            # Greedy decoding picks the most likely token, which is the single top_logprobs entry.
            assert p["top_logprobs"][0]["id"] == p["id"]
        # `tokens` includes the end-of-turn token when generation stops on it; `content` does not.
        text_ids = ids
        if body["stop_type"] == "eos":
            assert ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
            text_ids = ids[:-1]
        assert tokenizer.decode(text_ids) == body["content"]
        detok = (await c.post("/detokenize", json={"tokens": text_ids})).json()["content"]
        assert detok == body["content"]
        # Deterministic at temperature 0: the same ids again (prompt cache or not).
        again = (
            await c.post(
                "/completion", json={"prompt": prompt_ids, "n_predict": 12, "temperature": 0, "return_tokens": True}
            )
        ).json()
        assert again["tokens"] == ids


async def test_json_schema_constrained_chat(embedded_llm):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pet": {"enum": ["cat", "dog", "none"]},
        },
        "required": ["name", "age", "pet"],
        "additionalProperties": False,
    }
    async with httpx.AsyncClient(base_url=embedded_llm.base_url, timeout=60) as c:
        r = await c.post(
            "/chat/completions",
            json={
                "model": embedded_llm.model_name,
                "messages": [{"role": "user", "content": "Describe a person as JSON."}],
                "json_schema": schema,
                "max_tokens": 80,
                "temperature": 0.7,
                "seed": 3,
            },
        )
        r.raise_for_status()
    data = json.loads(r.json()["choices"][0]["message"]["content"])
    assert set(data) == {"name", "age", "pet"}
    assert isinstance(data["name"], str) and len(data["name"]) <= 20
    assert isinstance(data["age"], int) and 0 <= data["age"] <= 120
    assert data["pet"] in ("cat", "dog", "none")


async def test_gbnf_grammar_on_native_completion(embedded_llm):
    async with httpx.AsyncClient(base_url=embedded_llm.server_url, timeout=60) as c:
        for seed in (1, 2):
            r = await c.post(
                "/completion",
                json={
                    "prompt": "Is the sky green? Answer:",
                    "grammar": 'root ::= ("yes" | "no") " because " [a-z]{1,12} "."',
                    "n_predict": 24,
                    "temperature": 1.0,
                    "seed": seed,
                },
            )
            r.raise_for_status()
            content = r.json()["content"]
            head, _, rest = content.partition(" because ")
            assert head in ("yes", "no"), content
            assert rest.endswith(".") and rest[:-1].isascii() and rest[:-1].isalpha() and rest[:-1].islower(), content


# -- tokenizer -------------------------------------------------------------------------------------


def test_tokenizer_ids_match_server(embedded_llm, tokenizer):
    with httpx.Client(base_url=embedded_llm.server_url, timeout=30) as c:
        for text in TOKENIZER_CORPUS:
            server_ids = c.post("/tokenize", json={"content": text}).json()["tokens"]
            ours = tokenizer(text, add_special_tokens=True)["input_ids"]
            assert ours == server_ids, f"tokenizer mismatch for {text!r}"
            assert c.post("/detokenize", json={"tokens": server_ids}).json()["content"] == tokenizer.decode(ours)
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 1
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    assert tokenizer.decode([1, 19556, 2], skip_special_tokens=True) == "Hello"


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [False, True])
def test_chat_template_matches_server(embedded_llm, tokenizer, name, with_tools):
    messages = CONVERSATIONS[name]
    tools = [TERMINAL_TOOL] if with_tools else None
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    server = httpx.post(embedded_llm.server_url + "/apply-template", json=body, timeout=30).json()["prompt"]
    ours = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert ours == server
    if with_tools:
        assert '"name": "terminal"' in ours and "<tools>" in ours
    if name == "tool_round_trip":
        assert '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls -a"}}\n</tool_call>' in ours
        assert "<tool_response>\n.\n..\n日本.txt\n</tool_response>" in ours


def test_hermes_template_without_tools_equals_the_models_own(embedded_llm, tokenizer):
    # The GGUF's own template, via the user cache (one build per machine).
    gguf_dir = ensure_gguf_tokenizer(default_model_path())
    assert gguf_dir.parent == embedded_llm.tokenizer_dir.parent  # same cache ...
    assert gguf_dir != embedded_llm.tokenizer_dir  # ... keyed by chat template
    gguf_tok = AutoTokenizer.from_pretrained(str(gguf_dir))
    assert "tools" not in gguf_tok.chat_template
    assert tokenizer.chat_template == HERMES_TOOLS_CHAT_TEMPLATE
    for name in ("no_system", "system_multi_turn"):
        for gen in (True, False):
            a = gguf_tok.apply_chat_template(CONVERSATIONS[name], tokenize=False, add_generation_prompt=gen)
            b = tokenizer.apply_chat_template(CONVERSATIONS[name], tokenize=False, add_generation_prompt=gen)
            assert a == b


def test_cli_tokenizer_builds_a_loadable_dir_once(tmp_path):
    template_file = tmp_path / "template.jinja"
    template_file.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    out = tmp_path / "tok"
    result = subprocess.run(
        [sys.executable, "-m", "embedded_llm", "tokenizer", "--out", str(out), "--chat-template", str(template_file)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == out
    assert sorted(p.name for p in out.iterdir()) == [
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["template.jinja", "tok"]  # no temp dirs left behind
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok("Hello world")["input_ids"] == [19556, 905]
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "[user] hi\n"
    assert json.loads((out / "special_tokens_map.json").read_text()) == {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|im_end|>",
    }
    # Idempotent: a complete directory is reused, not rewritten (a build reads the whole vocabulary).
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert ensure_gguf_tokenizer(default_model_path(), out) == out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes


def test_unreadable_gguf_for_tokenizer(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(EmbeddedLLMError, match="cannot read GGUF metadata"):
        ensure_gguf_tokenizer(bad, tmp_path / "out")
    with pytest.raises(EmbeddedLLMError, match="GGUF file not found"):
        ensure_gguf_tokenizer(tmp_path / "missing.gguf")
