"""The sandbox server's settings, as its command line and a caller's code give them."""

from __future__ import annotations

from pydantic import BaseModel, Field

from sandbox_server.isolation import SlotLimits

__all__ = ["ServerConfig"]


class ServerConfig(BaseModel):
    slots: int = Field(4, ge=1, le=256, description="Number of slots (workspaces) this server holds")
    data_dir: str = Field(..., description="Directory holding the slots' workspaces and the shared cache")
    bwrap: str = Field("bwrap", description="bubblewrap executable")
    workspace_mount: str = Field("/workspace", description="Where a slot's workspace appears inside the sandbox")
    cache_mount: str | None = Field(
        "/cache",
        description="Where the server-wide shared cache appears (read-only to slots); None: no cache",
    )
    max_output_bytes: int = Field(1_000_000, gt=0, description="Upper bound on one command's captured output")
    max_timeout_s: float = Field(3600.0, gt=0)
    max_file_bytes: int = Field(64 * 1024 * 1024, gt=0)
    max_command_bytes: int = Field(4 * 1024 * 1024, gt=0, description="Largest command (and stdin) accepted")
    file_op_timeout_s: float = Field(30.0, gt=0, description="Upper bound on one file operation")
    extra_ro_paths: list[str] = Field(default_factory=list, description="More host paths to show read-only")
    spawn_helper: bool = Field(
        True, description="Start commands through hermes-spawn when it is built and runs here (else prlimit + setpriv)"
    )
    limits: SlotLimits = Field(default_factory=SlotLimits)
    allow_root_commands: bool = Field(
        False,
        description="Accept exec calls with as_root (a task's verifier as its image's root): container backends "
        "only, where root is the container's; never on a host",
    )
