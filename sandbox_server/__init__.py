"""A small HTTP server holding slots of bubblewrap-isolated workspaces.

Runs inside a sandbox container (see the Dockerfile) or as a plain local process. It
depends on aiohttp and pydantic only (requirements.txt) and imports nothing else of
the project, so it can be copied into an image on its own.
"""

from sandbox_server.config import ServerConfig
from sandbox_server.routes import build_app
from sandbox_server.server import SandboxServer

__all__ = ["SandboxServer", "ServerConfig", "build_app"]
