"""The closed loop on CPU: the trainer owns the llama.cpp server the env samples from.

`python -m training.grpo --sync embedded --serve_port P` starts the embedded server on
127.0.0.1:P with the embedded weights in float32 (`embedded_float_gguf`), and after every step
writes the trained weights as a float32 GGUF (`write_float_gguf`) and restarts the server on
the same port with them. The env points at it (`--openai.base_url http://127.0.0.1:P/v1
--env.runtime.token_server llamacpp`), so each batch after step k is sampled from the policy of step k.

Why a restart and not a hot swap: xllamacpp's `Server` takes its model when it starts (it has
no reload; LoRA adapters load at start too, only their scales change at runtime), and a restart of a 135M
float32 model takes about a second. A request that arrives while the server is down fails to
connect: an infrastructure failure, which the env retries (no group is lost, none is scored
on an error). Owning the server in the trainer keeps one process responsible for "which
weights are served", with no second protocol between trainer and server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embedded_llm import EmbeddedLLM, EmbeddedLLMConfig

__all__ = ["PolicyServer"]


class PolicyServer:
    """A llama.cpp server on a fixed port that serves the latest weights `publish` was given."""

    def __init__(self, out: Path, port: int, threads: int, n_parallel: int) -> None:
        self.gguf = out / "policy.F32.gguf"
        self.port = port
        self.threads = threads
        self.n_parallel = n_parallel
        self.llm: EmbeddedLLM | None = None
        self.template: Path | None = None
        self.published = 0  # steps whose weights are being served

    def start(self) -> str:
        """Serve the embedded weights in float32; returns the OpenAI base URL."""
        from training.models import embedded_float_gguf

        self.template = embedded_float_gguf()
        return self._serve(self.template)

    def _serve(self, model_path: Path) -> str:
        config = EmbeddedLLMConfig(
            model_path=model_path,
            model_name="policy",
            port=self.port,
            threads=self.threads,
            n_parallel=self.n_parallel,
            startup_timeout=300,
        )
        self.llm = EmbeddedLLM(config).start()
        self.port = int(self.llm.server_url.rsplit(":", 1)[1])  # port 0 picked one: keep it across restarts
        return self.llm.base_url

    def publish(self, model: Any) -> None:
        """Write `model`'s weights as the served GGUF and restart the server on the same port with them."""
        from training.gguf_export import write_float_gguf

        assert self.template is not None, "start() first"
        write_float_gguf(model.state_dict(), model.config, self.template, self.gguf)
        self.stop()
        self._serve(self.gguf)
        self.published += 1

    @property
    def base_url(self) -> str:
        assert self.llm is not None
        return self.llm.base_url

    def stop(self) -> None:
        if self.llm is not None:
            self.llm.stop()
            self.llm = None
