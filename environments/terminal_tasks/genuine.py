"""Which of the integrity check's suspects are genuine published files (issue 34; docs/security.md).

In the engine's diff an honest install and a plant look alike: setuptools' `distutils-precedence.pth`, Debian's
`python3.11` and its `sitecustomize.py`, fakeroot's loader configuration. The agent was root, so whatever the
container says about a file (dpkg's lists and status, pip's RECORD) is only a claim of who published it. The
verifier fetches that publication itself: the claimed package's .deb, downloaded and unpacked by apt in a fresh
container of the pristine task image (never the agent's), or the claimed wheel from PyPI on the host. A file
whose bytes (a link: whose target) equal the published file's is genuine; a false claim finds no equal bytes.

A genuine hook still runs what it imports: every module name a start-up hook can import (the image's hooks, and
the added ones found genuine) must be unchanged or genuine wherever the diff adds or changes it, and so on for
what those modules import. The loader is checked the same way: every soname the image's loader cache resolves
must resolve to the same file in the container's cache, or to a genuine one, and an added `lib*.so*` whose name
or ELF soname is one of the image's must be genuine (a later `ldconfig`, as a test's apt install runs, would
put it first). Where a publication cannot be fetched, the suspect stays flagged and the flag says why.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import shlex
import ssl
import struct
import tarfile
import zipfile
from dataclasses import dataclass, field

import httpx

from backends.task_container import TaskContainer, TaskContainerSpec
from environments.terminal_tasks.py_imports import (
    RUNNER_IMPORTS,
    cache_map,
    elf_soname,
    imported_names,
    module_paths,
    pytest11_modules,
)
from environments.terminal_tasks.reach import TOOL_FLAG, shadowing, tests_path

__all__ = ["GenuineCheck", "PY_HOOKS", "review_flags"]

_SITE = re.compile(r"^(?P<site>.*/(site|dist)-packages)/")
_PY_PROGRAM = re.compile(r"/s?bin/python[\d.]*$")
_BIN = re.compile(r"(^|/)s?bin/[^/]+$")
_LIBNAME = re.compile(r"^(lib|ld-)[^/]*\.so(\.[\d.]+)?$")
# Start-up hooks: a *.pth in a site directory, a sitecustomize/usercustomize anywhere on the path (container_run's too).
PY_HOOKS = re.compile(r"/(site|dist)-packages/[^/]*\.pth$|/(sitecustomize|usercustomize)\.py$")
# Data trees neither ldconfig nor the loader search (a changed ld.so.conf, which could add one, is flagged itself):
# postfix copies libresolv and friends into its chroot under /var/spool.
# A genuine standard-library module imports only the standard library by name (not followed further).
_STDLIB_FILE = re.compile(r"/lib/python3(\.\d+)?/(?!(site|dist)-packages/)")
_OFF_LOADER = re.compile(r"^/(var|srv)/")
_LDCONF = re.compile(r"^/etc/ld\.so\.conf\.d/")
_PROBE_HOOKS = (
    "find / -xdev \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o \\( -path '*-packages/*.pth' -o "
    "-name sitecustomize.py -o -name usercustomize.py \\) -print 2>/dev/null | while read -r f; do "
    'echo "==>HOOK $f"; cat "$f" 2>/dev/null; echo; done'
)


@dataclass(frozen=True)
class GenuineCheck:
    """Where the verifier fetches the publications a suspect is compared with."""

    ca_bundle: bytes | None = None  # PEM: the CAs the host's HTTPS to PyPI is verified with (the machine's proxy)
    apt: bool = True  # a .deb by apt in a container of the pristine image (its own network, not the agent's)
    pypi: bool = True
    pypi_url: str = "https://pypi.org"
    timeout_s: float = 900.0
    max_wheels: int = 4  # wheels of one release tried before a file is called not genuine


@dataclass
class _Facts:
    """What the verifier read: the container's claims (data only) and the publications it fetched."""

    box: TaskContainer
    check: GenuineCheck | None
    pristine: TaskContainer
    dpkg_owner: dict[str, str] | None = None  # path -> package[:arch]
    dpkg_version: dict[str, str] = field(default_factory=dict)
    debs: dict[str, dict[str, str] | str] = field(default_factory=dict)  # package=version -> path->hash, or why not
    wheels: dict[str, list[dict[str, str]] | str] = field(default_factory=dict)  # name==version -> RECORDs, or why not
    records: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)  # path -> [(name, version, site)]
    wheel_tags: dict[str, frozenset[str]] = field(default_factory=dict)  # site/name-version -> its WHEEL's tags
    apt_updated: bool = False
    entries: dict[str, str] = field(default_factory=dict)  # the container's files read so far (path -> identity)
    read_roots: set[str] = field(default_factory=set)


_BULK = re.compile(r"^(/usr/lib/python3\.\d+)/|^(.*/(site|dist)-packages/[^/]+)/")


async def _entry(facts: _Facts, path: str) -> str | None:
    """A file's identity: `sha256:<hex>` of a regular file, `link:<target>` of a symlink, `dir`; None if absent.
    A file of a package directory or of a new standard library is read with the whole directory (one archive)."""
    if path in facts.entries:
        return facts.entries[path]
    m = _BULK.match(path)
    root = (m.group(1) or m.group(2)) if m else path
    if root in facts.read_roots:
        return None
    facts.read_roots.add(root)
    try:
        data = await facts.box.read_tar(root)
    except FileNotFoundError:
        return None
    parent = root.rsplit("/", 1)[0]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            name = f"{parent}/{member.name}"
            if member.issym():
                facts.entries[name] = f"link:{member.linkname}"
            elif member.isfile() and (handle := tar.extractfile(member)) is not None:
                facts.entries[name] = f"sha256:{hashlib.sha256(handle.read()).hexdigest()}"
            else:
                facts.entries[name] = "dir"
    return facts.entries.get(path)


async def _text(box: TaskContainer, path: str) -> str:
    try:
        return (await box.read_file(path)).decode(errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return ""


# --- the claims: dpkg's lists and status, pip's RECORD files (read as data through the engine) ---


async def _dpkg_claims(facts: _Facts) -> None:
    if facts.dpkg_owner is not None:
        return
    facts.dpkg_owner = {}
    try:
        data = await facts.box.read_tar("/var/lib/dpkg/info")
    except FileNotFoundError:
        return
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            if m.isfile() and m.name.endswith(".list"):
                handle = tar.extractfile(m)
                package = m.name.rsplit("/", 1)[-1][: -len(".list")]
                for line in handle.read().decode(errors="replace").splitlines() if handle else []:
                    facts.dpkg_owner.setdefault(line, package)
    for stanza in (await _text(facts.box, "/var/lib/dpkg/status")).split("\n\n"):
        fields = dict(re.findall(r"^(Package|Version|Architecture): (.+)$", stanza, re.M))
        if "Package" in fields and "Version" in fields:
            arch = fields.get("Architecture", "all")
            facts.dpkg_version[fields["Package"]] = fields["Version"]
            facts.dpkg_version[f"{fields['Package']}:{arch}"] = fields["Version"]


async def _pip_claims(facts: _Facts, changes: dict[str, str]) -> None:
    """RECORD files the diff adds or changes (an unchanged image's RECORD claims only unchanged files)."""
    for path in sorted(changes):
        m = re.match(r"^(.*/(site|dist)-packages)/([^/]+)-([^/-]+)\.dist-info/RECORD$", path)
        if not m or changes[path] == "deleted":
            continue
        site, name, version = m.group(1), m.group(3), m.group(4)
        wheel = await _text(facts.box, f"{site}/{name}-{version}.dist-info/WHEEL")  # once per distribution
        tags = (line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:"))
        facts.wheel_tags[f"{site}/{name}-{version}"] = frozenset(tags)
        for row in (await _text(facts.box, path)).splitlines():
            rel = row.rsplit(",", 2)[0] if row.count(",") >= 2 else ""
            if rel and not rel.startswith(".."):
                facts.records.setdefault(f"{site}/{rel}", []).append((name, version, site))


# --- the publications, fetched by the verifier ---


async def _deb_files(facts: _Facts, package: str, version: str) -> dict[str, str] | str:
    key = f"{package}={version}"
    if key in facts.debs:
        return facts.debs[key]
    if facts.check is None or not facts.check.apt:
        facts.debs[key] = "fetching .debs is off (GenuineCheck.apt)"
        return facts.debs[key]
    box = facts.pristine  # the task's image as built: nothing the agent did is in it
    update = "" if facts.apt_updated else "apt-get update -qq >/dev/null 2>&1; "
    script = (
        f'set -e; {update}d=$(mktemp -d); cd "$d"; apt-get download -qq {shlex.quote(key)} >/dev/null 2>&1 || '
        f"{{ echo 'apt-get download failed'; exit 3; }}; dpkg-deb --fsys-tarfile ./*.deb > /tmp/genuine.tar; rm -rf \"$d\""
    )
    run = await box.exec(script, timeout=facts.check.timeout_s, user="root", workdir="/", login=False)
    facts.apt_updated = True
    if run.exit_code != 0:
        facts.debs[key] = (
            f"cannot fetch {key} with apt in the pristine image ({run.output.strip()[-120:] or 'no network?'})"
        )
        return facts.debs[key]
    tar_bytes = await box.read_file("/tmp/genuine.tar")
    files: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        for m in tar.getmembers():
            path = "/" + m.name.lstrip("./")
            if m.issym():
                files[path] = f"link:{m.linkname}"
            elif m.isfile() and (handle := tar.extractfile(m)) is not None:
                files[path] = f"sha256:{hashlib.sha256(handle.read()).hexdigest()}"
    facts.debs[key] = files
    return files


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_rank(filename: str, cp: str, tags: frozenset[str]) -> tuple[bool, bool, bool, bool]:
    """The wheel the installed WHEEL file names first (a claim: it orders the fetches, the bytes decide), then pure
    wheels, then this interpreter's (cp313) x86_64 Linux ones."""
    py, abi, plats = filename[: -len(".whl")].split("-")[-3:]
    named = any(f"{py}-{abi}-{plat}" in tags for plat in plats.split("."))
    return (
        not named,
        "none-any" not in filename,
        f"-{cp}-" not in filename,
        "linux" not in plats or "x86_64" not in plats,
    )


async def _wheel_files(
    facts: _Facts, name: str, version: str, cp: str, tags: frozenset[str] = frozenset()
) -> list[dict[str, str]] | str:
    """The RECORD (path -> sha256 b64) of each wheel PyPI publishes for name==version (up to max_wheels)."""
    key = f"{name}=={version} {sorted(tags)}"
    if key in facts.wheels:
        return facts.wheels[key]
    if facts.check is None or not facts.check.pypi:
        return "fetching wheels is off (GenuineCheck.pypi)"
    verify: ssl.SSLContext | bool = True
    if facts.check.ca_bundle is not None:
        verify = ssl.create_default_context(cadata=facts.check.ca_bundle.decode(errors="replace"))
    records: list[dict[str, str]] = []
    try:
        async with httpx.AsyncClient(verify=verify, timeout=120, follow_redirects=True) as client:
            # The simple index's JSON form (PEP 691): what pip itself reads, served by mirrors too.
            index = await client.get(
                f"{facts.check.pypi_url}/simple/{_normal(name)}/",
                headers={"Accept": "application/vnd.pypi.simple.v1+json"},
            )
            index.raise_for_status()
            urls = [
                {"filename": f["filename"], "url": f["url"], "sha256": f.get("hashes", {}).get("sha256")}
                for f in index.json().get("files", [])
                if f["filename"].endswith(".whl")
                and _normal(f["filename"].split("-")[0]) == _normal(name)
                and f["filename"].split("-")[1] == version
            ]
            for u in sorted(urls, key=lambda u: _wheel_rank(u["filename"], cp, tags))[: facts.check.max_wheels]:
                wheel = await client.get(u["url"])
                wheel.raise_for_status()
                if hashlib.sha256(wheel.content).hexdigest() != u["sha256"]:
                    continue  # not what PyPI says it published
                with zipfile.ZipFile(io.BytesIO(wheel.content)) as z:
                    record = next((n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)), None)
                    rows = z.read(record).decode(errors="replace").splitlines() if record else []
                records.append({r.split(",")[0]: r.split(",")[1] for r in rows if r.count(",") >= 2})
    except (httpx.HTTPError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        first = (str(exc).splitlines() or [""])[0][:100]
        facts.wheels[key] = f"cannot fetch {key} from PyPI ({type(exc).__name__}: {first})"
        return facts.wheels[key]
    if not records:
        facts.wheels[key] = f"PyPI publishes no wheel of {key}"
        return facts.wheels[key]
    facts.wheels[key] = records
    return records


async def _why_not_genuine(facts: _Facts, path: str, changes: dict[str, str]) -> str | None:
    """None if `path` in the container is the published file its claimed owner ships, else why not."""
    if changes.get(path) == "deleted":
        return "deleted"
    mine = await _entry(facts, path)
    if mine is None:
        return "absent"
    pip_why = ""
    if path in facts.records:  # several distributions may ship one file (cmeel.pth): any genuine one clears it
        whys = []
        for name, version, site in facts.records[path]:
            m = re.search(r"/python3\.(\d+)/", site)
            tags = facts.wheel_tags.get(f"{site}/{name}-{version}", frozenset())
            wheels = await _wheel_files(facts, name, version, f"cp3{m.group(1)}" if m else "cp3", tags)
            if isinstance(wheels, str):
                whys.append(f"not cleared: {wheels}")
            elif not mine.startswith("sha256:"):
                whys.append(f"not a regular file, as {name} {version} ships it")
            else:
                want = "sha256=" + base64.urlsafe_b64encode(bytes.fromhex(mine[7:])).rstrip(b"=").decode()
                if any(rec.get(path[len(site) + 1 :]) == want for rec in wheels):
                    return None
                whys.append(f"not the bytes {name} {version} publishes on PyPI")
        pip_why = "; ".join(whys)  # Debian ships dist-info RECORDs too (python3-pip): its .deb may still clear it
    await _dpkg_claims(facts)
    assert facts.dpkg_owner is not None
    # Merged /usr: a package's /lib/x.so is the container's /usr/lib/x.so (and the other way round).
    aliases = [path, re.sub(r"^/usr/(?=(s?bin|lib\w*)/)", "/", path)]
    if aliases[1] == path:
        aliases[1] = re.sub(r"^/(?=(s?bin|lib\w*)/)", "/usr/", path)
    package = next((facts.dpkg_owner[a] for a in aliases if a in facts.dpkg_owner), None)
    if package is None and _LDCONF.search(path) and mine.startswith("link:"):
        # An alternative (update-alternatives' link chain, owned by no package): the file it ends at must be genuine.
        target, entry = path, mine or ""
        for _ in range(8):
            if not entry or not entry.startswith("link:"):
                break
            link = entry[5:]
            target = link if link.startswith("/") else target.rsplit("/", 1)[0] + "/" + link
            entry = (await _entry(facts, target)) or ""
        if entry.startswith("sha256:") and await _why_not_genuine(facts, target, changes) is None:
            return None
        return f"its link's end {target} is not a genuine package file"
    if package is None:
        return pip_why or "no package in the container claims it"
    deb_version = facts.dpkg_version.get(package)
    if deb_version is None:
        return f"dpkg lists {package} without a version"
    files = await _deb_files(facts, package, deb_version)
    if isinstance(files, str):
        return f"not cleared: {files}"
    if any(files.get(a) == mine for a in aliases):
        return None
    return f"not the file Debian's {package} {deb_version} ships"


async def review_flags(
    box: TaskContainer,
    changes_list: list[tuple[str, str]],
    flagged: list[tuple[str, str]],
    workdir: str,
    check: GenuineCheck | None,
    *,
    env: dict[str, str] | None = None,
    tests_text: str | None = None,
    test_sh: str = "",
) -> list[str]:
    """The flag lines that stand: `flagged` (path, line) less the genuine, plus the hook-import and loader suspects
    that are not genuine. Runs the pristine image (never the agent's container) to list its hooks and sonames.

    With `tests_text` (a Harbor task's test files; `env` test.sh's environment), an added program with a tool's
    name that no test can run by name is no suspect (reach.py)."""
    changes = {p: k for k, p in changes_list}
    dirs = {p.rsplit("/", 1)[0] for p in changes}
    work = workdir.rstrip("/") + "/"
    site_touched = any(_SITE.search(p) or "/python3" in p for p in changes if p not in dirs)
    loader_touched = "/etc/ld.so.cache" in changes or any(_LIBNAME.match(p.rsplit("/", 1)[-1]) for p in changes)
    # Added programs where a Harbor task's tests may look for them by name (reach.py decides which shadow one).
    added_programs = [
        p
        for p, kind in changes.items()
        if tests_text is not None
        and kind == "added"
        and p not in dirs
        and _BIN.search(p)
        and not p.startswith(work)
        and not p.endswith("/docker-init")  # the engine's own init (TaskContainers runs with init=True)
    ]
    if not (flagged or site_touched or loader_touched or added_programs):
        return []
    spec = TaskContainerSpec(
        image=box.spec.image, workdir="/", user="root", network=bool(check and check.apt), cpus=1, memory_mb=2048
    )
    async with box.engines.container(spec, f"{box.name}-genuine") as pristine:
        facts = _Facts(box, check, pristine)
        if tests_text is not None:
            view = await tests_path(pristine, changes, env or {}, workdir)
            flagged = [(p, line) for p, line in flagged if not line.endswith(TOOL_FLAG) or view.reaches(p, tests_text)]
            named = {p for p, _ in flagged}
            flagged += [f for f in shadowing(view, added_programs, tests_text, test_sh) if f[0] not in named]
        await _pip_claims(facts, changes)
        suspects: dict[str, str] = dict((p, line) for p, line in flagged)
        image_cache = ""
        if loader_touched:
            image_cache = (await pristine.exec("ldconfig -p", timeout=120, user="root", login=False)).output
            image_sonames = {s for s, _ in cache_map(image_cache)}
            if "/etc/ld.so.cache" in changes:
                theirs = await box.read_file("/etc/ld.so.cache")
                await pristine.put_files("/tmp/agent", {"ld.so.cache": (theirs, 0o644)})
                listing = await pristine.exec(
                    "ldconfig -p -C /tmp/agent/ld.so.cache", timeout=120, user="root", login=False
                )
                now = cache_map(listing.output)
                for key, path in cache_map(image_cache).items():
                    if now.get(key, path) != path:
                        suspects.setdefault(
                            now[key], f"{now[key]} (the loader's cache now gives it for the image's {key[0]})"
                        )
            for p, kind in changes.items():
                name = p.rsplit("/", 1)[-1]
                if kind != "added" or p.startswith(work) or _OFF_LOADER.match(p) or not _LIBNAME.match(name):
                    continue
                try:
                    soname = elf_soname(await box.read_file(p))
                except (FileNotFoundError, IsADirectoryError, struct.error, ValueError, IndexError):
                    soname = None
                if name in image_sonames or soname in image_sonames:
                    suspects.setdefault(p, f"added {p} (a library named like the image's {soname or name})")
        names: set[str] = set()
        hook_names: set[str] = set()  # the names a start-up hook imports: what those modules import is followed too
        if site_touched:
            hooks = (await pristine.exec(_PROBE_HOOKS, timeout=300, user="root", login=False)).output
            for chunk in hooks.split("==>HOOK ")[1:]:
                head, _, body = chunk.partition("\n")
                names |= imported_names(body, head.endswith(".pth"))
            # pytest imports its dependencies and each `pytest11` entry point's module at start: each must be genuine,
            # but what a genuine one imports is its package's business (pygments imports computed names).
            hook_names |= names
            names |= RUNNER_IMPORTS
            for p, kind in changes.items():
                if kind != "deleted" and p.endswith(".dist-info/entry_points.txt") and not p.startswith(work):
                    plugins = pytest11_modules(await _text(box, p))
                    if plugins:
                        suspects.setdefault(p, f"{kind} {p} (registers pytest plugins: {', '.join(sorted(plugins))})")
                        names |= plugins
        # An added interpreter found genuine runs its new tree's files: each must be genuine (not its site dirs).
        if any(_PY_PROGRAM.search(p) and changes[p] == "added" for p, _ in flagged):
            for p, kind in changes.items():
                if (
                    kind == "added"
                    and p not in dirs
                    and re.match(r"^/usr/lib/python3(\.\d+)?/", p)
                    and (not _SITE.search(p) or PY_HOOKS.search(p))
                ):
                    if not p.endswith(".pyc"):
                        suspects.setdefault(p, f"added {p} (the standard library of an added interpreter)")
        standing: list[str] = []
        seen: set[str] = set()
        queue = list(suspects)
        while queue or names - seen:
            for name in sorted(names - seen):
                seen.add(name)
                for p in module_paths(name, changes, dirs, work):
                    if p not in suspects:
                        who = "pytest" if name in RUNNER_IMPORTS and name not in hook_names else "a start-up hook"
                        suspects[p] = f"{changes[p]} {p} (a module named {name}, which {who} imports)"
                        queue.append(p)
            if not queue:
                continue
            path = queue.pop(0)
            why = await _why_not_genuine(facts, path, changes)
            if why is not None:
                standing.append(f"{suspects[path]}: {why}")
            elif PY_HOOKS.search(path) or (
                path.endswith(".py")
                and "start-up hook" in suspects.get(path, "")
                and not _STDLIB_FILE.search(path)  # its computed imports (encodings') are the caller's names
            ):
                imported = imported_names(await _text(box, path), path.endswith(".pth"))
                hook_names |= imported
                names |= imported
        return standing
