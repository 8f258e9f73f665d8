"""The host CA bundle in task image builds, and build failures that name this machine's network."""

from __future__ import annotations

import io
import tarfile

from environments.image_sandboxes import (
    CA_CONTEXT_NAME,
    CA_FILE,
    ImageRecipe,
    _context_tar,
    infrastructure_cause,
    with_ca,
)


def test_the_bundle_is_trusted_in_every_stage_right_after_its_from():
    dockerfile = "ARG V=1\nFROM python:3.13-slim AS build\nRUN pip install x\nFROM debian:bookworm\nRUN curl -O y\n"
    lines = with_ca(dockerfile).splitlines()
    froms = [i for i, line in enumerate(lines) if line.startswith("FROM")]
    for i in froms:
        assert lines[i + 1] == f"COPY {CA_CONTEXT_NAME} {CA_FILE}"
        assert lines[i + 2].startswith("ENV ") and f"PIP_CERT={CA_FILE}" in lines[i + 2]
        assert f"SSL_CERT_FILE={CA_FILE}" in lines[i + 2] and f"CURL_CA_BUNDLE={CA_FILE}" in lines[i + 2]
    assert lines[0] == "ARG V=1" and len(froms) == 2
    assert [ln for ln in lines if ln.startswith("RUN")] == ["RUN pip install x", "RUN curl -O y"]


def test_the_context_carries_the_bundle_and_the_rewritten_dockerfile(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM debian:bookworm\n")
    (tmp_path / "data.txt").write_text("d")
    recipe = ImageRecipe(owner="t", dockerfile="FROM debian:bookworm\nWORKDIR /app\n", context_dir=tmp_path, tag="x:1")
    with tarfile.open(fileobj=io.BytesIO(_context_tar(recipe, b"PEM"))) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert files[CA_CONTEXT_NAME] == b"PEM" and files["data.txt"] == b"d"
    assert files["Dockerfile"].decode().startswith(f"FROM debian:bookworm\nCOPY {CA_CONTEXT_NAME} {CA_FILE}\n")
    with tarfile.open(fileobj=io.BytesIO(_context_tar(recipe))) as tar:
        assert CA_CONTEXT_NAME not in tar.getnames()


def test_build_logs_name_the_machines_network_needs():
    assert infrastructure_cause(
        "fatal: unable to access 'https://github.com/x/': Could not resolve host: github.com"
    ) == ("infrastructure: a host it downloads from does not resolve here (github.com)")
    assert "base image is not on the engine" in (
        infrastructure_cause("pull access denied for python, repository does not exist") or ""
    )
    assert "TLS" in (infrastructure_cause("SSL: CERTIFICATE_VERIFY_FAILED self-signed certificate in chain") or "")
    assert infrastructure_cause("E: Unable to locate package nosuchpkg") is None


def test_a_python_tree_apt_adds_where_the_image_had_none_is_not_tampering():
    from environments.terminal_tasks.container_run import integrity_problems

    new_tree = [
        ("added", "/usr/lib/python3.11"),
        ("added", "/usr/lib/python3.11/dataclasses.py"),
        ("added", "/usr/lib/python3"),
        ("added", "/usr/lib/python3/dist-packages/distutils-precedence.pth"),
    ]
    assert integrity_problems(new_tree) == []
    # The same files where the image had the tree (it shows as changed, not added) are flagged.
    existing = [("modified", "/usr/lib/python3.11"), ("added", "/usr/lib/python3.11/dataclasses.py")]
    assert integrity_problems(existing) == [
        "added /usr/lib/python3.11/dataclasses.py (a module in Python's own tree, before every site directory)"
    ]
    # A user site directory the image lacked is read by the image's own Python: never exempt.
    user_site = [("added", "/root/.local/lib/python3.13/site-packages/usercustomize.py")]
    assert len(integrity_problems(user_site)) == 1


def test_a_workdir_module_named_like_a_standard_one_is_flagged_only_for_python_m_pytest():
    """`python -m pytest` from the workdir imports argparse, inspect, ... after the workdir went first on sys.path:
    a module, package, sourceless .pyc or extension there of such a name is the agent's; other names are its work."""
    from environments.terminal_tasks.container_run import PYTHON_M_PYTEST, integrity_flags

    planted = ["/app/argparse.py", "/app/inspect/__init__.py", "/app/argparse.pyc", "/app/json.cpython-311-x86_64.so"]
    honest = ["/app/eigen.py", "/app/test/test_more.py", "/app/__pycache__/argparse.cpython-311.pyc", "/app/sub/os.py"]
    changes = [("added", p) for p in planted + honest]
    assert [p for p, _ in integrity_flags(changes, "/app", python_m_pytest=True)] == planted
    assert integrity_flags(changes, "/app", python_m_pytest=False) == []
    runs = ["python -m pytest -rA", "python3 -m pytest /tests", "python3.12 -u -m pytest", "uv run python -m pytest"]
    assert all(PYTHON_M_PYTEST.search(line) for line in runs)
    assert not any(PYTHON_M_PYTEST.search(line) for line in ["pytest /tests", "uvx -w pytest pytest", "python -m pip"])
