"""Where sandbox_server instances run: local processes, Docker/Podman containers, Nomad allocations, Modal sandboxes.

Each backend is a `SandboxProvider`; `make_backend(config)` picks it from the config's `kind`
and returns a `SlotPool` (slots/pool.py) over it. Nomad is spoken
over its HTTP API (httpx); the Docker and Modal SDKs are imported only when chosen (extras `docker`, `modal`).

Every config answers `in_containers`: whether each sandbox is a container of an image of its own
(docker, Nomad's docker/singularity drivers, Modal) rather than processes on a machine (local, Nomad
raw_exec). It alone decides what follows from that: one pool per item image with the workspace where
the item expects it (environments/image_sandboxes.py), and servers that accept a verifier's root
commands (`--allow-root-commands`: root there is the container's).
"""

from __future__ import annotations

import os
from typing import Annotated, Union

from pydantic import Field

from backends.docker import DockerBackendConfig, docker_backend
from backends.local import LocalBackendConfig, local_backend
from backends.modal import ModalBackendConfig, modal_backend
from backends.nomad import NomadBackendConfig, NomadHTTP, nomad_backend
from slots.pool import SlotPool

__all__ = [
    "BackendConfig",
    "LocalBackendConfig",
    "DockerBackendConfig",
    "NomadBackendConfig",
    "ModalBackendConfig",
    "make_backend",
]

BackendConfig = Annotated[
    Union[LocalBackendConfig, DockerBackendConfig, NomadBackendConfig, ModalBackendConfig], Field(discriminator="kind")
]


def make_backend(
    config: LocalBackendConfig | DockerBackendConfig | NomadBackendConfig | ModalBackendConfig,
) -> SlotPool:
    if isinstance(config, LocalBackendConfig):
        return local_backend(config)
    if isinstance(config, DockerBackendConfig):
        return docker_backend(config)
    if isinstance(config, NomadBackendConfig):
        # The ACL token is a secret: read from the environment here only, never logged.
        return nomad_backend(config, NomadHTTP(config, acl_token=os.environ.get("NOMAD_TOKEN")))
    if isinstance(config, ModalBackendConfig):
        return modal_backend(config)
    raise TypeError(f"unknown backend config {type(config).__name__}; use kind local, docker, nomad or modal")
