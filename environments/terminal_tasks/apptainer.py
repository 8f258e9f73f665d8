"""An Apptainer definition file (`container.def`) built on a Docker engine the way `apptainer build` builds it.

Read from Apptainer's own source (internal/pkg/build/stage.go, util.go; pkg/build/types/parser) and its docs on
definition files:

- the header (`Bootstrap:`, `From:`) names the base: `docker` bootstraps start from that image; Endless Terminals'
  `localimage ./ubuntu_22.04.sif` is the SIF its scripts/get_ubuntu_sif.sh pulls from docker://ubuntu:22.04;
- `%files` (`src [dest]`, `#` comments) are copied from the definition's directory before `%post`;
- `%post` is one script, written byte for byte to `/.post.script` and run as root with `/bin/sh -ex` from `/`
  (`%post -c SHELL` runs it with that shell instead), with a clean environment; users it adds, files it chowns
  and writes anywhere in the filesystem are the image's;
- `%environment` is written byte for byte to `/.singularity.d/env/90-environment.sh`; every command sources it
  at start (`environment_prefix`), as Apptainer's action scripts do;
- `%test` runs after `%post` (a build without `--notest`); `%labels`, `%help`, `%runscript` do not change what a
  command sees. `%setup`/`%pre` (run on the build host), `%startscript`, `%files from STAGE`, other bootstraps
  and apps (`%app*`) are not reproduced: `Unreproducible` names the task and the section.

The definition is built as published: Endless Terminals' harness (generator/env.py, generate_solutions.py) edits
a definition lacking `chmod 755 /home/user` before its own rebuild and writes the edit back, so a published file
already holds what it ran. Its shell runs with `--containall --cleanenv --writable-tmpfs` in `/home/user` with
`HOME=/home/user`, as the invoking user: Apptainer without setuid shows every file of the image as that user's
(uid/gid 1000 on the publisher's EC2 host, `ec2-user`) and appends the user's passwd/group entries. `invoking_user`
reproduces that after the generator's initial-state check (as root, on the owners `%post` set, run in the build and
kept in `INITIAL_STATE_FILE`): every file of the image chowned to `INVOKING_UID`, an `ec2-user` entry appended.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

__all__ = [
    "DefFile",
    "Unreproducible",
    "parse_def",
    "def_dockerfile",
    "write_def_context",
    "environment_prefix",
    "endless_pytest_command",
    "APPTAINER_ENV_FILE",
    "INITIAL_STATE_FILE",
    "INVOKING_UID",
    "INVOKING_USER",
    "EndlessUser",
]

APPTAINER_ENV_FILE = "/.singularity.d/env/90-environment.sh"
# Apptainer's base environment (01-base.sh) after --cleanenv: only this PATH.
_BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The account Apptainer appends for the invoking user (Amazon Linux's default account: the published runs list
# files as `ec2-user ec2-user`); names of uid 1000 come first from the image's own entries (`useradd` in %post).
INVOKING_UID = 1000
# Who an Endless task's commands and final test run as: that invoking user, or root on the owners %post set.
EndlessUser = Literal["invoking", "root"]
INVOKING_USER = f"{INVOKING_UID}:{INVOKING_UID}"
_PASSWD_LINE = f"ec2-user:x:{INVOKING_UID}:{INVOKING_UID}:EC2 Default User:/home/ec2-user:/bin/bash"
_GROUP_LINE = f"ec2-user:x:{INVOKING_UID}:ec2-user"
# The initial-state check's exit status and output, written at build as root (read and removed before the agent).
INITIAL_STATE_FILE = "/.hermes-initial-state"
_INITIAL_DIR = "/.hermes-initial"
# What the chown leaves alone: kernel filesystems and the engine's per-container bind mounts (the host's files).
_NOT_IMAGE = ("/proc", "/sys", "/dev", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf")

# Apptainer's section names (the parser only starts a section on one of these).
_SECTIONS = {"help", "setup", "files", "labels", "environment", "pre", "post", "runscript", "test", "startscript"}
_APP_SECTION = re.compile(r"^%app(install|help|files|labels|env|run|test|start)\b", re.I)
_SECTION_LINE = re.compile(r"^%(\w+)(.*)$")
_LOCAL_UBUNTU = re.compile(r"^\./ubuntu_([\d.]+)\.sif$")


class Unreproducible(ValueError):
    """What of a definition file a Docker build cannot reproduce (one line naming the task and the section)."""


@dataclass(frozen=True)
class Section:
    args: str  # what follows `%name` on its line (`-c /bin/bash`, `from stage`)
    body: str  # the lines up to the next section, exactly as written


@dataclass(frozen=True)
class DefFile:
    header: dict[str, str]
    sections: dict[str, list[Section]] = field(default_factory=dict)

    def body(self, name: str) -> str:
        """A section's text; a section given twice is the two bodies in order."""
        return "".join(s.body for s in self.sections.get(name, []))

    def has(self, name: str) -> bool:
        """Whether the section holds anything but comments and blank lines."""
        return any(line.strip() and not line.strip().startswith("#") for line in self.body(name).splitlines())


def parse_def(text: str) -> DefFile:
    """Header `Key: value` lines before the first section; then sections, each body kept byte for byte."""
    header: dict[str, str] = {}
    sections: dict[str, list[Section]] = {}
    name: str | None = None  # the section being read
    args = ""
    body: list[str] = []
    for line in [*text.splitlines(keepends=True), None]:
        m = _SECTION_LINE.match(line.strip()) if line is not None and line.lstrip().startswith("%") else None
        starts = m is not None and (m.group(1).lower() in _SECTIONS or bool(_APP_SECTION.match(m.group(0))))
        if line is None or starts:
            if name is not None:
                sections.setdefault(name, []).append(Section(args=args, body="".join(body)))
            if m is not None and starts:
                name, args, body = m.group(1).lower(), m.group(2).strip(), []
            continue
        if name is not None:
            body.append(line)
            continue
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            key, sep, value = stripped.partition(":")
            if sep:
                header[key.strip().lower()] = value.strip()
    return DefFile(header=header, sections=sections)


_POST = "/.post.script"
_TEST = "/.test.script"
_CA = "/.hermes-build-ca.crt"
# Where a TLS client finds the CA bundle of a network that intercepts TLS (pip, requests, curl, node, git, openssl).
_CA_VARIABLES = (
    "SSL_CERT_FILE",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
)


def _base_image(task: str, header: dict[str, str]) -> str:
    bootstrap = header.get("bootstrap", "").lower()
    base = header.get("from", "")
    if bootstrap == "docker" and base:
        return base.removeprefix("docker://")
    local = _LOCAL_UBUNTU.match(base)
    if bootstrap == "localimage" and local:
        return f"ubuntu:{local.group(1)}"  # Endless Terminals' scripts/get_ubuntu_sif.sh: docker://ubuntu:VERSION
    raise Unreproducible(
        f"{task}: container.def Bootstrap: {bootstrap or '(none)'} From: {base or '(none)'} is not a "
        "Docker image (docker bootstraps and Endless Terminals' ./ubuntu_VERSION.sif are)"
    )


def _script_args(task: str, section: str, path: str, args: str) -> list[str]:
    """The command Apptainer runs a section script with: `/bin/sh -ex PATH`, or `/bin/sh -ex -c "SHELL PATH"`."""
    words = args.split("#")[0].split()
    if not words:
        return ["/bin/sh", "-ex", path]
    if words[0] == "-c" and len(words) > 1:
        return ["/bin/sh", "-ex", "-c", " ".join(words[1:]) + " " + path]
    raise Unreproducible(f"{task}: container.def %{section} {args}: section arguments other than -c SHELL")


def _run(argv: list[str], env: dict[str, str], cleanup: list[str]) -> str:
    """A RUN that starts `argv` with exactly `env` (Apptainer's --cleanenv) and removes `cleanup` after it.

    The CA variables the build sets for its own network (an image builder that trusts the host's CA bundle in
    every stage) pass through: they are the machine's network, not the definition's environment."""
    keep = " ".join(_CA_VARIABLES)
    passthrough = f'set --; for v in {keep}; do eval "x=\\${{$v-}}"; [ -n "$x" ] && set -- "$@" "$v=$x"; done; '
    words = " ".join(shlex.quote(w) for w in ["env", "-i", *(f"{k}={v}" for k, v in env.items())])
    command = " ".join(shlex.quote(w) for w in argv)
    script = f'{passthrough}{words} "$@" {command}; rc=$?; rm -f {" ".join(cleanup)}; exit $rc'
    return "RUN " + json_list(["/bin/sh", "-c", script]) + "\n"


def json_list(words: list[str]) -> str:
    """Exec form of RUN/COPY: no shell re-reads the words."""
    return json.dumps(words)


def def_dockerfile(
    task: str,
    text: str,
    task_dir: Path,
    *,
    ca_bundle: bytes | None = None,
    invoking_user: bool = False,
    initial_test: Path | None = None,
) -> tuple[str, dict[str, tuple[bytes, int]]]:
    """(Dockerfile, {context path: (content, mode)}) building `text` as Apptainer does; `Unreproducible` if it cannot.

    `ca_bundle`: the host's CA bundle, given to `%post` and `%test` only (a TLS-intercepting network), then removed.
    `invoking_user`: then the image as the publisher's non-setuid Apptainer showed it to its runs (`_invoking_layer`),
    `initial_test` checked as root before that.
    """
    d = parse_def(text)
    if not d.header and not any(s.body.strip() for bodies in d.sections.values() for s in bodies):
        raise Unreproducible(f"{task}: container.def is empty: its initial state cannot be built")
    base = _base_image(task, d.header)
    for name in ("setup", "pre", "startscript"):
        if d.has(name):
            raise Unreproducible(f"{task}: container.def %{name}: runs on the build host or at instance start")
    apps = sorted(n for n in d.sections if n.startswith("app"))
    if apps:
        raise Unreproducible(f"{task}: container.def %{apps[0]}: SCIF apps are not reproduced")
    context: dict[str, tuple[bytes, int]] = {}
    lines = [f"FROM {base}\n"]
    for section in d.sections.get("files", []):
        if section.args.split("#")[0].strip():
            raise Unreproducible(f"{task}: container.def %files {section.args}: files from another stage")
        for line in section.body.splitlines():
            words = line.split("#")[0].split()
            if not words:
                continue
            if len(words) > 2:
                raise Unreproducible(f"{task}: container.def %files line {line.strip()!r}: more than SRC DEST")
            src = (task_dir / words[0]).resolve()
            if not src.is_relative_to(task_dir.resolve()) or not src.is_file():
                raise Unreproducible(f"{task}: container.def %files {words[0]}: not a file in the task directory")
            dest = words[-1]
            key = f"files/{len(context)}"
            context[key] = (src.read_bytes(), src.stat().st_mode & 0o777)
            target = dest if not dest.endswith("/") else str(PurePosixPath(dest) / src.name)
            lines.append(f"COPY {json_list([key, target])}\n")
    env = {"PATH": _BASE_PATH, "HOME": "/root"}
    build_env = dict(env)
    cleanup_ca: list[str] = []
    if ca_bundle is not None:
        context["ca.crt"] = (ca_bundle, 0o644)
        lines.append(f"COPY {json_list(['ca.crt', _CA])}\n")
        build_env |= {k: _CA for k in _CA_VARIABLES}
        cleanup_ca = [_CA]
    if d.has("environment"):
        context["environment.sh"] = (d.body("environment").encode(), 0o644)
        lines.append(f"COPY {json_list(['environment.sh', APPTAINER_ENV_FILE])}\n")
    post = d.sections.get("post", [])
    if any(s.body.strip() for s in post):
        context["post.script"] = (d.body("post").encode(), 0o755)
        lines.append(f"COPY {json_list(['post.script', _POST])}\n")
        argv = _script_args(task, "post", _POST, post[0].args)
        last = not d.has("test")
        lines.append(_run(argv, build_env, [_POST, *(cleanup_ca if last else [])]))
    if d.has("test"):
        context["test.script"] = (d.body("test").encode(), 0o755)
        lines.append(f"COPY {json_list(['test.script', _TEST])}\n")
        argv = _script_args(task, "test", _TEST, d.sections["test"][0].args)
        lines.append(
            _run(
                ["/bin/sh", "-c", f'. {APPTAINER_ENV_FILE} 2>/dev/null; exec "$@"', "sh", *argv],
                build_env,
                [_TEST, *cleanup_ca],
            )
        )
    elif cleanup_ca and not any(s.body.strip() for s in post):
        lines.append(f"RUN rm -f {_CA}\n")
    if invoking_user:
        lines.extend(_invoking_layer(initial_test, context))
    return "".join(lines), context


def _invoking_layer(initial_test: Path | None, context: dict[str, tuple[bytes, int]]) -> list[str]:
    """The generator's initial-state check as root on the owners %post set (result kept in INITIAL_STATE_FILE),
    then what Apptainer without setuid shows its runs: every file the invoking user's, its passwd/group entries.

    One RUN on top of the unchanged %post layers (their build cache is shared with the root image)."""
    steps = []
    lines = []
    if initial_test is not None:
        context["initial/" + initial_test.name] = (initial_test.read_bytes(), 0o644)
        context["initial/pytest.ini"] = (b"[pytest]\n", 0o644)
        lines.append(f"COPY {json_list(['initial', _INITIAL_DIR])}\n")
        check = shlex.quote(environment_prefix() + endless_pytest_command(initial_test.name, _INITIAL_DIR))
        steps.append(
            f"rc=0; out=$(/usr/bin/env -i PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 /bin/bash --noprofile --norc -c {check} 2>&1)"
            f" || rc=$?; {{ echo $rc; printf '%s\\n' \"$out\" | tail -c 8000; }} > {INITIAL_STATE_FILE}; "
            f"rm -rf {_INITIAL_DIR}"
        )
    for path, line in (("/etc/passwd", _PASSWD_LINE), ("/etc/group", _GROUP_LINE)):
        # Apptainer's passwd/group templates: the image's file, a newline where it lacks one, the entry appended.
        steps.append(f'[ -z "$(tail -c1 {path})" ] || echo >> {path}; echo {shlex.quote(line)} >> {path}')
    steps.append("mkdir -p /home/ec2-user")  # the account's home (Apptainer makes it in the session)
    prune = " -o ".join(f"-path {p}" for p in _NOT_IMAGE)
    steps.append(f"find / -xdev \\( {prune} \\) -prune -o -print0 | xargs -0 chown -h {INVOKING_USER}")
    steps.append(f"chown 0:0 {INITIAL_STATE_FILE} 2>/dev/null; chmod 600 {INITIAL_STATE_FILE} 2>/dev/null; true")
    lines.append("RUN " + json_list(["/bin/sh", "-c", "set -e; " + " && ".join(f"{{ {s}; }}" for s in steps)]) + "\n")
    return lines


def write_def_context(
    task: str,
    text: str,
    task_dir: Path,
    out_dir: Path,
    *,
    ca_bundle: bytes | None = None,
    invoking_user: bool = False,
    initial_test: Path | None = None,
) -> Path:
    """A docker build context for `text` in `out_dir` (made empty first): its Dockerfile and files."""
    dockerfile, files = def_dockerfile(
        task, text, task_dir, ca_bundle=ca_bundle, invoking_user=invoking_user, initial_test=initial_test
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in sorted(out_dir.rglob("*"), reverse=True):
        old.unlink() if old.is_file() or old.is_symlink() else old.rmdir()
    for rel, (data, mode) in {**files, "Dockerfile": (dockerfile.encode(), 0o644)}.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
    return out_dir


def environment_prefix(home: str = "/home/user") -> str:
    """Shell text that sets up a command's environment as Apptainer's `shell --cleanenv` and Endless' harness do:
    Apptainer's PATH, `%environment` sourced (its commands included), then HOME (generator/env.py sets it last)."""
    return (
        f"export PATH={_BASE_PATH} HOME={shlex.quote(home)}; "
        f"[ -f {APPTAINER_ENV_FILE} ] && . {APPTAINER_ENV_FILE}; export HOME={shlex.quote(home)}; "
        f"cd {shlex.quote(home)} 2>/dev/null || true\n"
    )


def endless_pytest_command(test: str, tests_dir: str = "/tests") -> str:
    """The verifier's pytest of an Endless test file in `tests_dir` (beside our own pytest.ini): `python3 -I` (no cwd,
    PYTHON* or user site on sys.path), no cache, no ini file or conftest.py above `tests_dir`."""
    d = shlex.quote(tests_dir)
    return (
        f"exec python3 -I -m pytest -q -p no:cacheprovider -c {d}/pytest.ini --rootdir={d} "
        f"--confcutdir={d} {d}/{shlex.quote(test)}"
    )
