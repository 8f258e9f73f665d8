"""reach._named: a directory the tests' files name, or one above it below the top level (no engine needed)."""

from environments.terminal_tasks.reach import _named

CONDA_TEST_SH = "source /opt/conda/etc/profile.d/conda.sh\nconda activate base\npytest /tests/test_outputs.py\n"


def test_a_directory_above_the_program_named_by_the_tests_reaches_it():
    assert _named("/opt/conda/bin", CONDA_TEST_SH)  # activation puts /opt/conda/bin on the PATH
    assert _named("/opt/tools/bin", "/opt/tools/bin/python3 -m pytest /tests")


def test_a_server_venv_the_tests_never_name_is_off_their_path():
    pypi_server_tests = 'installcmd = ["python", "-m", "pip", "install", "--index-url", "http://localhost:8080/simple"]'
    assert not _named("/opt/pypiserver/venv/bin", pypi_server_tests)


def test_a_top_level_directory_alone_does_not_count():
    assert not _named("/opt/pypiserver/venv/bin", "ls /opt\n")
