import subprocess
from pathlib import Path

SAMPLES = Path(__file__).parent / "samples"


def count(path):
    out = subprocess.run(["bash", "/app/wordcount.sh", str(path)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_one_line_many_words():
    assert count(SAMPLES / "one_line.txt") == "9"


def test_many_lines():
    assert count(SAMPLES / "poem.txt") == "12"
