"""What a `--env.dataset` value names, and its one-line error, shared by the envs' data checks."""

from __future__ import annotations

from pathlib import Path

__all__ = ["dataset_error", "looks_local"]

LOCAL_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")


def looks_local(value: str) -> bool:
    """Whether `value` names a local file or directory (one that exists, or a path-shaped one that does not)."""
    path = Path(value).expanduser()
    return path.exists() or value.startswith((".", "/", "~")) or path.suffix in LOCAL_SUFFIXES


def dataset_error(value: str, exc: BaseException) -> str:
    """One line naming the flag and what was wrong; a loader's own message that names the flag already stays as is."""
    text = str(exc)
    return text if text.startswith("--env.dataset") else f"--env.dataset {value!r}: {text}"
