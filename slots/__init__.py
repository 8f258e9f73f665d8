"""Slots: isolated workspaces inside sandbox_server instances, pooled per env.

`SlotPool` hands a slot to each trajectory and resets it on release; `SlotExecutor`
runs a trajectory's tools in its slot (calls to one sandbox that arrive together go
as one batch request). Knows nothing of models, parsers or environments.
"""

from slots.client import SandboxAddress, SandboxClient, SandboxError, SandboxUnavailable, Slot, SlotState
from slots.executor import ExecPolicy, SandboxBatcher, SlotExecutor
from slots.pool import SandboxProvider, SlotAcquireTimeout, SlotPool, SlotPoolConfig

__all__ = [
    "SandboxAddress",
    "SandboxClient",
    "SandboxError",
    "SandboxUnavailable",
    "ExecPolicy",
    "SandboxBatcher",
    "SlotExecutor",
    "SandboxProvider",
    "Slot",
    "SlotAcquireTimeout",
    "SlotPool",
    "SlotPoolConfig",
    "SlotState",
]
