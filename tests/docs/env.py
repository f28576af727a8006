"""The environment variables the code reads, written out or built from a prefix."""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from tests.docs.source import dataclass_fields, source, string_prefixes, syntax

ENV_TOKEN = re.compile(r"FERRY_[A-Z0-9_]*")
PREFIX_PART = re.compile(r"^[A-Z][A-Z0-9_]*_$")


def composed_suffix(node: ast.AST) -> str | None:
    """"TLS_CERT" of `own + "TLS_CERT"`, "ACCESS_KEY" of f"{prefix}_ACCESS_KEY": a name
    read under whichever service prefix the expression holds."""
    tail: object = None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) \
            and not isinstance(node.left, ast.Constant) and isinstance(node.right, ast.Constant):
        tail = node.right.value
    elif isinstance(node, ast.JoinedStr) and len(node.values) == 2 \
            and isinstance(node.values[0], ast.FormattedValue) \
            and isinstance(node.values[1], ast.Constant):
        tail = node.values[1].value
    if isinstance(tail, str) and re.fullmatch(r"_?[A-Z][A-Z0-9_]*[A-Z0-9]", tail):
        return tail.lstrip("_")
    return None


@cache
def env_names() -> tuple[frozenset[str], tuple[re.Pattern[str], ...]]:
    """The variables the tree reads: written out, or built as `<prefix><FIELD>`.

    A service's config is a dataclass filled from `<prefix><FIELD>` (the prefix a
    string like "FERRY_BROKER_" in the same package); a nested group of settings
    adds a part of its own ("HTTP_" + the fields of its dataclass, read under
    every service's prefix). f-strings such as f"FERRY_MESH_{name}_PORT" become
    patterns.
    """
    names: set[str] = set()
    patterns: list[re.Pattern[str]] = []
    service_prefixes: set[str] = set()
    suffixes: set[str] = set()  # own + "TLS_CERT", f"{prefix}_ACCESS_KEY"
    prefixes_by_dir: dict[Path, set[str]] = {}
    classes: dict[str, list[tuple[list[str], list[str]]]] = {}
    modules: list[tuple[Path, dict[str, tuple[list[str], list[str]]], set[str]]] = []
    for path, text in source():
        names.update(t for t in ENV_TOKEN.findall(text) if not t.endswith("_"))
        if path.suffix != ".py":
            continue
        tree = syntax(path)
        for prefix in string_prefixes(tree):
            service_prefixes.add(prefix)
            prefixes_by_dir.setdefault(path.parent, set()).add(prefix)
        parts: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and PREFIX_PART.match(node.value) and not node.value.startswith("FERRY_"):
                parts.add(node.value)
            if isinstance(node, ast.JoinedStr) and node.values \
                    and isinstance(node.values[0], ast.Constant) \
                    and str(node.values[0].value).startswith("FERRY_"):
                regex = "".join(re.escape(str(v.value)) if isinstance(v, ast.Constant)
                                else "[A-Z0-9_]+" for v in node.values)
                patterns.append(re.compile(regex))
            suffix = composed_suffix(node)
            if suffix:
                suffixes.add(suffix)
        dataclasses = dataclass_fields(tree)
        for name, value in dataclasses.items():
            classes.setdefault(name, []).append(value)
        modules.append((path, dataclasses, parts))

    def fields_of(cls: str, seen: frozenset[str] = frozenset()) -> set[str]:
        out: set[str] = set()
        for fields, bases in classes.get(cls, []):
            out.update(fields)
            for base in bases:
                if base and base not in seen:
                    out |= fields_of(base, seen | {cls})
        return out

    names.update(p + s for p in service_prefixes for s in suffixes)
    for path, dataclasses, parts in modules:
        for cls in dataclasses:
            fields = {f.upper() for f in fields_of(cls)}
            for prefix in prefixes_by_dir.get(path.parent, ()):
                names.update(prefix + f for f in fields)
            for part in parts:
                names.update(p + part + f for p in service_prefixes for f in fields)
    return frozenset(names), tuple(patterns)


def env_known(token: str, open_ended: bool) -> bool:
    names, patterns = env_names()
    if open_ended:  # "FERRY_BROKER_*", "FERRY_<SERVICE>_<KEY>": some variable starts so
        return any(n.startswith(token) for n in names) or token == "FERRY_" \
            or any(p.pattern.startswith(re.escape(token)) for p in patterns)
    return token in names or any(p.fullmatch(token) for p in patterns)
