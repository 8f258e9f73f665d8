"""Regenerate environments/data/swe_smith/profiles.json from SWE-smith's published repository profiles.

    pip download swesmith --no-deps -d /work/dl && python scripts/swe_smith_profiles.py /work/dl/swesmith-*.whl

SWE-smith keeps one `RepoProfile` subclass per repository (swesmith/profiles/<language>.py) with its
owner, repo, commit and test command. Importing the package needs Docker and GitHub clients, so this
reads the class definitions with `ast` instead and writes, per mirror name
(`swesmith/<owner>__<repo>.<commit[:8]>`), the test command, the install commands, the language and
the image name.
"""

from __future__ import annotations

import ast
import json
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "environments" / "data" / "swe_smith" / "profiles.json"
FIELDS = ("owner", "repo", "commit", "test_cmd", "install_cmds", "org_dh", "arch")


def _value(node: ast.AST, names: dict[str, object]) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if (  # a dataclass default: field(default_factory=lambda: [...])
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "field"
        and [k.arg for k in node.keywords] == ["default_factory"]
        and isinstance(node.keywords[0].value, ast.Lambda)
    ):
        return _value(node.keywords[0].value.body, names)
    if isinstance(node, ast.JoinedStr):  # f"... {ENV_NAME} ..." with module-level constants
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and v.value.id in names:
                parts.append(str(names[v.value.id]))
            else:
                raise ValueError("unresolvable f-string")
        return "".join(parts)
    raise ValueError(f"unresolvable {ast.dump(node)[:60]}")


def read_sources(path: Path) -> dict[str, str]:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as z:
            return {n: z.read(n).decode() for n in z.namelist() if n.startswith("swesmith/") and n.endswith(".py")}
    return {str(p.relative_to(path)): p.read_text() for p in path.rglob("swesmith/**/*.py")}


def main(source: Path) -> None:
    files = read_sources(source)
    constants: dict[str, object] = {}
    for tree in (ast.parse(files[n]) for n in files if n.endswith("constants.py")):
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    constants[node.targets[0].id] = _value(node.value, constants)
                except ValueError:
                    pass
    classes: dict[str, tuple[list[str], dict[str, object], str]] = {}
    for name, text in files.items():
        if "/profiles/" not in name:
            continue
        language = Path(name).stem
        for node in ast.parse(text).body:
            if not isinstance(node, ast.ClassDef):
                continue
            attrs: dict[str, object] = {}
            for stmt in node.body:
                target = (
                    stmt.targets[0]
                    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    else getattr(stmt, "target", None)
                )
                value = getattr(stmt, "value", None)
                if isinstance(target, ast.Name) and target.id in FIELDS and value is not None:
                    try:
                        attrs[target.id] = _value(value, constants)
                    except ValueError:
                        pass
            classes[node.name] = ([b.id for b in node.bases if isinstance(b, ast.Name)], attrs, language)

    def resolved(cls: str) -> dict[str, object]:
        bases, attrs, _ = classes.get(cls, ([], {}, ""))
        merged: dict[str, object] = {}
        for base in bases:
            merged |= resolved(base)
        return merged | attrs

    profiles = {}
    for cls, (_, _, language) in classes.items():
        p = resolved(cls)
        if not all(p.get(k) for k in ("owner", "repo", "commit")):
            continue  # a language base class
        repo_name = f"{p['owner']}__{p['repo']}.{str(p['commit'])[:8]}"
        org_dh = p.get("org_dh") or constants.get("ORG_NAME_DH", "swebench")
        image = f"{org_dh}/swesmith.{p.get('arch') or 'x86_64'}.{p['owner']}_1776_{p['repo']}.{str(p['commit'])[:8]}".lower()
        profiles[f"swesmith/{repo_name}"] = {
            "test_cmd": p.get("test_cmd", ""),
            "language": language,
            "image_name": image,
            # what the image runs in a checkout to install the repository (--env.deps.mode venv runs it too)
            **({"install_cmds": p["install_cmds"]} if isinstance(p.get("install_cmds"), list) else {}),
        }
    OUT.write_text(json.dumps({"source": source.name, "profiles": dict(sorted(profiles.items()))}, indent=1) + "\n")
    print(f"wrote {len(profiles)} profiles to {OUT}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/swe_smith_profiles.py <swesmith wheel or source checkout>")
    main(Path(sys.argv[1]))
