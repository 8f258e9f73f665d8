"""The `sandbox` section of an env config: where sandbox slots come from.

Selected in the env config with `tool_backend: sandbox`; `sandbox.backend.kind` picks
where the sandbox_server instances run (local processes, Docker/Podman containers, Nomad, Modal). The tool backend
itself is the `SlotPool` that `make_backend` returns (slots/pool.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from backends import BackendConfig, LocalBackendConfig

__all__ = ["SandboxToolBackendConfig"]


class SandboxToolBackendConfig(BaseModel):
    kind: Literal["sandbox"] = "sandbox"
    backend: BackendConfig = Field(default_factory=LocalBackendConfig, description="local | docker | nomad | modal")
    acquire_timeout_s: float | None = Field(None, gt=0, description="Override of the pool's acquire timeout")

    def resolved_backend(self) -> BackendConfig:
        """`backend` with this section's acquire-timeout override folded into its pool config."""
        if self.acquire_timeout_s is None:
            return self.backend
        pool = self.backend.pool.model_copy(update={"acquire_timeout_s": self.acquire_timeout_s})
        return self.backend.model_copy(update={"pool": pool})
