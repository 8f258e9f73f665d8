"""Parser names are public API: users pass the name they already give vLLM or SGLang.

Renaming or removing a name is a breaking change; registering a taken name raises.
Family modules are imported on first lookup, so importing the package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable, Mapping, TypeVar

from ._core import ToolCallParser

__all__ = ["ParserRegistry", "UnknownParserError", "get_parser", "list_parsers", "register_parser"]

P = TypeVar("P", bound=type[ToolCallParser])

# The modules that register the built-in families (each module one family or a set of
# variants of one format).
_BUILTIN_MODULES = (
    "hermes",
    "longcat",
    "qwen3_coder",
    "glm",
    "deepseek",
    "deepseek_v32",
    "kimi_k2",
    "llama",
    "mistral",
    "pythonic",
    "gpt_oss",
)


class UnknownParserError(KeyError):
    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = sorted(known)
        super().__init__(name)

    def __str__(self) -> str:
        return (
            f"no tool-call parser named {self.name!r}; known parsers: {', '.join(self.known)}. "
            "Register a new family with @register_parser(name)."
        )


class ParserRegistry:
    def __init__(self, builtin_modules: Iterable[str] = ()) -> None:
        self._classes: dict[str, type[ToolCallParser]] = {}
        self._pending = list(builtin_modules)

    def register(self, *names: str) -> Callable[[P], P]:
        if not names:
            raise TypeError("register_parser needs at least one name")

        def decorator(cls: P) -> P:
            if not (isinstance(cls, type) and issubclass(cls, ToolCallParser)):
                raise TypeError(f"{cls!r} is not a ToolCallParser subclass")
            for name in names:
                if not isinstance(name, str) or not name:
                    raise ValueError(f"parser names must be non-empty strings, got {name!r}")
                taken = self._classes.get(name)
                if taken is not None and taken is not cls:
                    raise ValueError(
                        f"parser name {name!r} is already registered to {taken.__module__}.{taken.__qualname__}; "
                        "choose another name (names are public API and never reassigned)"
                    )
            for name in names:
                self._classes[name] = cls
            return cls

        return decorator

    def _load_builtins(self) -> None:
        while self._pending:
            # Dropped from the list only once imported: a broken module keeps raising its
            # own error instead of turning into "unknown parser" on the next lookup.
            importlib.import_module(f"{__package__}.{self._pending[0]}")
            self._pending.pop(0)

    def get_class(self, name: str) -> type[ToolCallParser]:
        self._load_builtins()
        try:
            return self._classes[name]
        except KeyError:
            raise UnknownParserError(name, self._classes) from None

    def get(self, name: str, tools: Iterable[Mapping[str, Any]] | None = None) -> ToolCallParser:
        return self.get_class(name)(tools=tools)

    def names(self) -> list[str]:
        self._load_builtins()
        return sorted(self._classes)


_REGISTRY = ParserRegistry(_BUILTIN_MODULES)


def register_parser(*names: str) -> Callable[[P], P]:
    """Class decorator: `@register_parser("hermes", "qwen25")`; one class may carry several names."""
    return _REGISTRY.register(*names)


def get_parser(name: str, tools: Iterable[Mapping[str, Any]] | None = None) -> ToolCallParser:
    """A fresh parser for `name`; `tools` (OpenAI tool definitions) enables typed parameter values."""
    return _REGISTRY.get(name, tools)


def list_parsers() -> list[str]:
    """Every registered name (aliases included), sorted."""
    return _REGISTRY.names()
