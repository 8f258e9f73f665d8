"""Rows of a directory written by `datasets`' `save_to_disk` (one Dataset, or a DatasetDict of splits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["saved_rows"]


def saved_rows(path: Path, split: str, error: type[Exception] = ValueError) -> list[Any]:
    """The rows of the saved dataset at `path`, or of its `split` when it holds several; a missing
    split raises `error` naming the splits there are."""
    from datasets import DatasetDict, load_from_disk  # noqa: PLC0415 - heavy import, only for saved dirs

    saved = load_from_disk(str(path))
    if isinstance(saved, DatasetDict):
        if split not in saved:
            raise error(f"{path} has splits {sorted(saved)}, not {split!r}; pass one with --env.split")
        saved = saved[split]
    return list(saved)
