import subprocess

REPO = "/app/project"


def git(*args):
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, check=True).stdout


def test_greeting_commit_is_on_main():
    subjects = git("log", "--format=%s", "main").splitlines()
    assert "Add greeting feature" in subjects
    assert "Add license" in subjects and "Initial commit" in subjects


def test_greeting_file_is_committed():
    assert git("show", "main:greeting.txt").strip() == "hello, world"


def test_working_tree_is_clean():
    assert git("status", "--porcelain") == ""
