"""Clearing integrity flags on files byte-identical to the published ones (issue 34): not yet."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GenuineCheck"]


@dataclass(frozen=True)
class GenuineCheck:
    """Where the verifier fetches the published artefacts a flagged file is compared with."""

    ca_bundle: bytes | None = None
    apt: bool = True
    pypi: bool = True
