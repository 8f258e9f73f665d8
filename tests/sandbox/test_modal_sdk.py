"""Every call ModalSDKAdapter makes binds to the real modal SDK, at the declared floor and the newest.

The adapter is driven through all its methods against a recorder standing in for the `modal`
module; the recorded calls are then bound (`inspect.signature(...).bind`) inside venvs holding
the real SDK: `.venv-sdk/modal-<floor>` and `.venv-sdk/modal-latest` (made by scripts/setup.sh).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from backends.modal import (
    MODAL_MIN_VERSION,
    RUNTIME_MIN_VERSION,
    ModalBackendConfig,
    ModalSandboxProvider,
    ModalSDKAdapter,
)

ROOT = Path(__file__).resolve().parents[2]
SDK_VENVS = ROOT / ".venv-sdk"


class _Obj:
    """Something the SDK returned (an app, image, secret, sandbox, tunnel)."""

    def __init__(self, recorder: "SDKRecorder", kind: str, **attrs: Any) -> None:
        self._recorder, self._kind = recorder, kind
        self.__dict__.update(attrs)

    def __getattr__(self, method: str) -> "_Callable":
        # instance methods are recorded against the class, with `self` bound first
        return _Callable(self._recorder, f"{self._kind}.{method}", bound=self)


class _Callable:
    def __init__(self, recorder: "SDKRecorder", target: str, bound: _Obj | None = None) -> None:
        self.recorder, self.target, self.bound = recorder, target, bound

    def _record(self, aio: bool, args: tuple, kwargs: dict) -> Any:
        self.recorder.calls.append(
            {
                "target": self.target,
                "aio": aio,
                "self": self.bound is not None,
                "args": [_plain(a) for a in args],
                "kwargs": {k: _plain(v) for k, v in kwargs.items()},
            }
        )
        return self.recorder.answer(self.target, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._record(False, args, kwargs)

    @property
    def aio(self):
        outer = self

        def call(*args: Any, **kwargs: Any):
            result = outer._record(True, args, kwargs)
            if outer.target == "Sandbox.list":

                async def listing():
                    for item in result:
                        yield item

                return listing()

            async def value():
                if isinstance(result, BaseException):
                    raise result
                return result

            return value()

        return call


def _plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return "<sdk object>"


class SDKRecorder:
    """Stands in for the `modal` module (App, Image, Secret, Sandbox, exception)."""

    class _NotFound(Exception):
        pass

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        for name in ("App", "Image", "Secret", "Sandbox", "Probe"):
            setattr(self, name, _Namespace(self, name))
        self.exception = type("exception", (), {"NotFoundError": self._NotFound})

    def answer(self, target: str, args: tuple, kwargs: dict) -> Any:
        if target == "App.lookup":
            return _Obj(self, "App", app_id="ap-1")
        if target in ("Sandbox.create", "Sandbox.from_id"):
            return _Obj(self, "Sandbox", object_id=args[0] if target == "Sandbox.from_id" else "sb-1")
        if target == "Sandbox.get_tags":
            return {"hermes_rl_pool": "default", "hermes_rl_run": "r1"}
        if target == "Sandbox.list":
            return [_Obj(self, "Sandbox", object_id="sb-3")]
        if target == "Sandbox.tunnels":
            return {8080: _Obj(self, "Tunnel", url="https://x.modal.host")}
        return _Obj(self, target.split(".")[0])


class _Namespace:
    def __init__(self, recorder: SDKRecorder, name: str) -> None:
        self._recorder, self._name = recorder, name

    def __getattr__(self, attr: str) -> _Callable:
        return _Callable(self._recorder, f"{self._name}.{attr}")


def adapter_calls(runtime: str | None) -> list[dict[str, Any]]:
    """Every SDK call of the adapter, for the provider's real specs (Dockerfile and registry image)."""
    recorder = SDKRecorder()
    adapter = ModalSDKAdapter(sdk=recorder)

    async def drive() -> None:
        app_id = await adapter.lookup_app("hermes-rl-sandboxes")
        for image, runtime_dir in ((None, None), ("reg.example/hermes:1", None), ("reg.example/any:1", "/rt")):
            config = ModalBackendConfig(image=image, runtime_dir=runtime_dir, idle_timeout_s=60, runtime=runtime)
            provider = ModalSandboxProvider(config, adapter)
            provider.runtime = runtime
            sandbox_id = await adapter.create_sandbox(app_id, provider.spec("default-0"))
            assert await adapter.tunnel_url(sandbox_id, 8080, 30.0) == "https://x.modal.host"
            await adapter.wait_until_ready(sandbox_id, 30.0)
            await adapter.poll(sandbox_id)
            await adapter.terminate(sandbox_id)
        await adapter.poll("sb-unknown")  # looked up with Sandbox.from_id
        assert await adapter.list_sandboxes(app_id, {"hermes_rl_pool": "default"}) == ["sb-3"]
        assert await adapter.sandbox_tags("sb-3") == {"hermes_rl_pool": "default", "hermes_rl_run": "r1"}

    asyncio.run(drive())
    return recorder.calls


BIND = r"""
import inspect, json, sys
import modal
calls = json.load(sys.stdin)
problems = []
for call in calls:
    target = modal
    for part in call["target"].split("."):
        target = getattr(target, part)
    if call["aio"]:
        target = target.aio
    args = (["<self>"] if call["self"] else []) + call["args"]
    try:
        inspect.signature(target).bind(*args, **call["kwargs"])
    except TypeError as exc:
        problems.append(f"{call['target']}: {exc}")
assert issubclass(modal.exception.NotFoundError, Exception)
print(json.dumps({"version": modal.__version__, "problems": problems}))
"""


def bind_in(venv: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    python = SDK_VENVS / venv / "bin" / "python"
    if not python.exists():
        pytest.skip(
            f"{python} is missing: run scripts/setup.sh (it installs modal=={MODAL_MIN_VERSION} and the newest there)"
        )
    proc = subprocess.run(
        [str(python), "-c", BIND], input=json.dumps(calls), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:3])


def test_the_declared_floor_is_the_adapters_floor() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["modal"] == [f"modal>={MODAL_MIN_VERSION}"]


@pytest.mark.parametrize("venv", [f"modal-{MODAL_MIN_VERSION}", "modal-latest"])
def test_every_adapter_call_binds_to_the_real_sdk(venv: str) -> None:
    calls = adapter_calls(runtime=None)
    targets = {c["target"] for c in calls}
    assert targets == {
        "App.lookup",
        "Image.from_dockerfile",
        "Image.from_registry",
        "Image.add_local_dir",
        "Secret.from_dict",
        "Sandbox.create",
        "Sandbox.tunnels",
        "Sandbox.poll",
        "Sandbox.terminate",
        "Sandbox.from_id",
        "Sandbox.list",
        "Sandbox.get_tags",
        "Sandbox.wait_until_ready",
        "Probe.with_tcp",
    }
    create = next(c for c in calls if c["target"] == "Sandbox.create")
    assert create["kwargs"]["tags"]["hermes_rl_pool"] == "default" and "runtime" not in create["kwargs"]
    assert create["kwargs"]["readiness_probe"] == "<sdk object>"  # Probe.with_tcp(8080), recorded above
    assert create["kwargs"]["timeout"] <= 24 * 3600
    result = bind_in(venv, calls)
    if venv != "modal-latest":
        assert result["version"] == MODAL_MIN_VERSION
    assert result["problems"] == [], result


@pytest.mark.parametrize("venv", [f"modal-{MODAL_MIN_VERSION}", "modal-latest"])
def test_the_vm_runtime_binds_from_its_own_floor(venv: str) -> None:
    result = bind_in(venv, adapter_calls(runtime="vm"))
    if _version(result["version"]) >= _version(RUNTIME_MIN_VERSION):
        assert result["problems"] == [], result
    else:  # why runtime= is passed only when set, and the error names the version
        assert result["problems"] and all("runtime" in p for p in result["problems"]), result
