"""What Python code can import, read from its text, and what the loader resolves: the genuine-file review's
helpers (genuine.py). Pure functions over text and bytes; nothing here runs or reads a container."""

from __future__ import annotations

import ast
import re
import struct

__all__ = ["RUNNER_IMPORTS", "cache_map", "elf_soname", "imported_names", "module_paths", "pytest11_modules"]

_CACHE_LINE = re.compile(r"^\s*(\S+) \(([^)]*)\) => (\S+)$")


# What pytest imports at start besides itself (its dependencies; py.py is its shim of the old `py` library).
RUNNER_IMPORTS = {"pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "pygments", "exceptiongroup", "tomli"}


def imported_names(source: str, pth: bool) -> set[str]:
    """Top-level module names a hook (or module) can import: import statements, `__import__('x')` and
    `import_module('x')`; `*` where it imports a computed name."""
    chunks = [line for line in source.splitlines() if re.match(r"import[ \t]", line)] if pth else [source]
    names: set[str] = set()
    dynamic = False
    for chunk in chunks:
        try:
            tree = ast.parse(chunk)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                value = node.args[0].value
                if func in ("__import__", "import_module") and isinstance(value, str):
                    names.add(value.split(".")[0])
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
                dynamic = True
    if dynamic:  # an import by a computed name: any module at all (every changed module must then be genuine)
        names.add("*")
    return names


def pytest11_modules(entry_points: str) -> set[str]:
    """Top-level module names of an `entry_points.txt`'s `[pytest11]` entries (what pytest imports at start)."""
    section, names = "", set()
    for line in entry_points.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]").strip()
        elif section == "pytest11" and "=" in line:
            names.add(line.split("=", 1)[1].strip().split(":")[0].split(".")[0].strip())
    return {n for n in names if n}


def module_paths(name: str, changes: dict[str, str], dirs: set[str], workdir: str) -> list[str]:
    # Where an import finds it: directly in a site directory, the standard library or its lib-dynload.
    any_name = r"[A-Za-z_]\w*" if name == "*" else re.escape(name)  # an importable name (not a .dist-info)
    pattern = re.compile(r"/((site|dist)-packages|python[\d.]+|lib-dynload)/" + any_name + r"(/|\.[^/]*$)")
    return sorted(
        p
        for p, kind in changes.items()
        if kind != "deleted"
        and p not in dirs
        and pattern.search(p)
        and not p.startswith(workdir)
        and "/__pycache__/" not in p
    )


def elf_soname(data: bytes) -> str | None:
    """DT_SONAME of a 64-bit little-endian ELF shared object (the name ldconfig files it under)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    shoff, shentsize, shnum = struct.unpack_from("<Q", data, 0x28)[0], *struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    for sec in sections:
        if sec[1] == 6:  # SHT_DYNAMIC; its sh_link is the string table
            strtab = sections[sec[6]]
            for off in range(sec[4], sec[4] + sec[5], 16):
                tag, val = struct.unpack_from("<qQ", data, off)
                if tag == 14:  # DT_SONAME
                    start = strtab[4] + val
                    return data[start : data.index(b"\0", start)].decode(errors="replace")
    return None


def cache_map(listing: str) -> dict[tuple[str, str], str]:
    """`ldconfig -p` -> (soname, arch) -> the path the loader takes: the first entry, or a `glibc-hwcaps` one (glibc
    2.33+ prefers it on a CPU that has the level; ldconfig lists it under its own `hwcap:` key)."""
    found: dict[tuple[str, str], str] = {}
    for line in listing.splitlines():
        m = _CACHE_LINE.match(line)
        if m:
            arch, hwcap = re.subn(r",\s*hwcap:.*$", "", m.group(2))
            if hwcap:
                found[(m.group(1), arch)] = m.group(3)
            else:
                found.setdefault((m.group(1), arch), m.group(3))
    return found
