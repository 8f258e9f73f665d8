"""The registry: names are public API."""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from environments.tool_call_parsers import (
    ToolCallParser,
    UnknownParserError,
    get_parser,
    list_parsers,
)
from environments.tool_call_parsers._registry import ParserRegistry

from . import _conformance
from ._conformance import ParserConformance

# Names users pass to vLLM / SGLang today; removing one is a breaking change.
PUBLIC_NAMES = {
    "hermes",
    "qwen25",
    "qwen3_coder",
    "llama3_json",
    "llama4_json",
    "llama3",
    "mistral",
    "deepseek_v3",
    "deepseekv3",
    "deepseek_v31",
    "deepseek_v3_1",
    "deepseek_v32",
    "kimi_k2",
    "glm45",
    "glm47",
    "longcat",
    "pythonic",
    "gpt_oss",
    "gpt-oss",
    "openai",
}


def test_public_names_are_registered():
    assert PUBLIC_NAMES <= set(list_parsers())


def test_get_parser_returns_a_fresh_parser():
    a, b = get_parser("hermes"), get_parser("hermes")
    assert isinstance(a, ToolCallParser) and a is not b


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownParserError) as info:
        get_parser("no-such-format")
    message = str(info.value)
    assert "'no-such-format'" in message
    for name in list_parsers():
        assert name in message
    assert isinstance(info.value, KeyError)


def test_duplicate_names_raise():
    registry = ParserRegistry()

    @registry.register("mine", "alias")
    class Mine(ToolCallParser):
        pass

    with pytest.raises(ValueError, match="'alias' is already registered"):

        @registry.register("other", "alias")
        class Other(ToolCallParser):
            pass

    # The failed registration took no name at all.
    assert registry.names() == ["alias", "mine"]
    assert registry.get_class("alias") is Mine


def test_only_parser_classes_register():
    with pytest.raises(TypeError):
        ParserRegistry().register("x")(object)
    with pytest.raises(TypeError):
        ParserRegistry().register()


def test_every_registered_name_has_conformance_tests():
    package = importlib.import_module(_conformance.__package__)
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("test_"):
            importlib.import_module(f"{package.__name__}.{info.name}")
    classes, todo = [], [ParserConformance]
    while todo:
        subs = todo.pop().__subclasses__()
        classes += subs
        todo += subs
    covered = {name for cls in classes for name in cls.names}
    missing = set(list_parsers()) - covered
    assert not missing, f"registered names without a conformance test class: {sorted(missing)}"


def test_package_is_vendorable_with_the_standard_library_only(tmp_path):
    # Copy the directory under another name and import it with no site-packages at all (-S):
    # any third-party or project import would fail here.
    package_dir = Path(importlib.import_module("environments.tool_call_parsers").__file__).parent
    shutil.copytree(package_dir, tmp_path / "vendored_parsers", ignore=shutil.ignore_patterns("__pycache__"))
    script = (
        "import sys, vendored_parsers as p\n"
        'content, calls = p.get_parser(\'hermes\').parse(\'hi <tool_call>{"name": "f", "arguments": {}}</tool_call>\')\n'
        "assert content == 'hi' and calls[0]['function']['name'] == 'f'\n"
        "assert len(p.list_parsers()) > 10\n"
        "assert 'environments' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
