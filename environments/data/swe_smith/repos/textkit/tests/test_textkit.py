from textkit import slugify, truncate, word_count


def test_slugify():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_numbers():
    assert slugify("Top 10 Tips") == "top-10-tips"


def test_word_count():
    assert word_count("one two  three") == 3


def test_truncate_short():
    assert truncate("abc", 5) == "abc"


def test_truncate_long():
    assert truncate("abcdefghij", 6) == "abc..."
