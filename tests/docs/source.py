"""What the code has, collected from the source tree when the tests run."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import re
from collections.abc import Iterator
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests.docs.pages import ROOT

HERE = Path(__file__).resolve().parent

# Where the code lives: what a page names must be found here.
SOURCE_DIRS = ("libs", "services", "spark", "deploy", "bench", "tests")
SOURCE_FILES = ("Makefile",)
SOURCE_SUFFIXES = {".py", ".toml", ".yml", ".yaml", ".sh", ".cfg", ".ini", ".conf", ".json", ""}
SKIP_PARTS = {".venv", "__pycache__", "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
# Where the installed packages live (the config dataclasses are imported from them).
PACKAGE_DIRS = ("libs", "services", "spark")
# Top-level rooms of the repository: a backticked path starting with one is checked.
ROOMS = ("libs", "services", "spark", "deploy", "bench", "tests", "docs")


def walk(top: Path) -> Iterator[Path]:
    for path in top.rglob("*"):
        if path.is_file() and not SKIP_PARTS.intersection(path.parts) \
                and not any(p.endswith(".egg-info") for p in path.parts):
            yield path


@cache
def tree_files() -> frozenset[str]:
    """Every file and directory of the repository (relative, '/'-separated), minus caches."""
    out: set[str] = set()
    for room in [*ROOMS, *SOURCE_FILES, "README.md", "pyproject.toml", "requirements-dev.txt"]:
        top = ROOT / room
        if top.is_file():
            out.add(room)
            continue
        for path in walk(top):
            rel = path.relative_to(ROOT).as_posix()
            out.add(rel)
            parts = rel.split("/")
            for i in range(1, len(parts)):
                out.add("/".join(parts[:i]))
    return frozenset(out)


@cache
def source() -> tuple[tuple[Path, str], ...]:
    """The code's text (tests included: their knobs such as FERRY_FUZZ_SEED are documented;
    these doc tests not: the names they quote would vouch for themselves)."""
    files = [ROOT / f for f in SOURCE_FILES]
    for d in SOURCE_DIRS:
        files += [p for p in walk(ROOT / d)
                  if p.suffix in SOURCE_SUFFIXES and p.name != "README.md"
                  and HERE not in p.parents]
    out = []
    for path in files:
        try:
            out.append((path, path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return tuple(out)


@cache
def syntax(path: Path) -> ast.Module:
    """A source file's syntax tree, parsed once for every collector."""
    return ast.parse(path.read_text(encoding="utf-8"))


def dataclass_fields(tree: ast.Module) -> dict[str, tuple[list[str], list[str]]]:
    """Each dataclass of a module: its field names and the names of its bases."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        decorators = [ast.unparse(d) for d in node.decorator_list]
        if not any("dataclass" in d for d in decorators):
            continue
        fields = [s.target.id for s in node.body
                  if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                  and "ClassVar" not in ast.unparse(s.annotation)]
        bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                 for b in node.bases]
        out[node.name] = (fields, bases)
    return out


def string_prefixes(tree: ast.Module) -> set[str]:
    """"FERRY_BROKER_" and the like, as string constants (a comment's "FERRY_BROKER_TLS_*"
    is not one)."""
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and re.fullmatch(r"FERRY_[A-Z0-9_]*_", n.value)}


def module_name(path: Path) -> str:
    """`ferry_broker.config` for services/broker/ferry_broker/config.py: up to the first
    directory that is not a package."""
    parts = [path.stem] if path.stem != "__init__" else []
    parent = path.parent
    while (parent / "__init__.py").exists():
        parts.insert(0, parent.name)
        parent = parent.parent
    return ".".join(parts)


@cache
def config_defaults() -> dict[str, object]:
    """Variable -> default, for every field of a dataclass read under a service prefix:
    the dataclasses of a module that names a "FERRY_<SERVICE>_" prefix, and their bases."""
    out: dict[str, object] = {}
    for path, text in source():
        if path.suffix != ".py" or path.relative_to(ROOT).parts[0] not in PACKAGE_DIRS:
            continue
        if "dataclass" not in text:
            continue
        tree = syntax(path)
        prefixes = {p for p in string_prefixes(tree) if p != "FERRY_"}
        classes = dataclass_fields(tree) if prefixes else {}
        if not classes:
            continue
        module = importlib.import_module(module_name(path))
        for name in classes:
            cls = getattr(module, name, None)
            if cls is None or not dataclasses.is_dataclass(cls):
                continue
            for field in dataclasses.fields(cls):
                if field.default is not dataclasses.MISSING:
                    default: object = field.default
                elif field.default_factory is not dataclasses.MISSING:
                    default = field.default_factory()
                else:
                    continue
                for prefix in prefixes:
                    out.setdefault(prefix + field.name.upper(), default)
    return out


@cache
def dotted_literals() -> frozenset[str]:
    """"ferry.outcome" and the like: span attributes and keys the code writes as strings."""
    return frozenset(name for _, text in source()
                     for name in re.findall(r"[\"'](ferry(?:_[a-z_]+)?\.[\w.]+)[\"']", text))


def resolves(name: str) -> bool:
    """A module, or an attribute of the longest module prefix (`ferry.store.MessageStore`)."""
    if name in dotted_literals():
        return True
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@cache
def error_classes() -> frozenset[str]:
    import builtins

    names = {n for n in dir(builtins) if n.endswith("Error")}
    for _, text in source():
        names.update(re.findall(r"^\s*class ([A-Z]\w*Error_?)\b", text, re.M))
    return frozenset(names)


@cache
def routes() -> frozenset[tuple[str, ...]]:
    """Every "/v1/..." and "/console/..." string constant in the services: their routers,
    route tables and OpenAPI documents."""
    out: set[tuple[str, ...]] = set()
    for path, _ in source():
        if path.suffix != ".py" or "services" not in path.relative_to(ROOT).parts[:1]:
            continue
        for node in ast.walk(syntax(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"/(?:v1|console)/[\w{}/.-]+", node.value):
                out.add(tuple(node.value.strip("/").split("/")))
    return frozenset(out)


class Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@cache
def script_parser(script: str) -> argparse.ArgumentParser:
    """The parser a console script (`ferry`, `ferry-broker`) builds, captured in-process."""
    (found,) = [e for e in entry_points(group="console_scripts") if e.name == script]
    module_name, _, func_name = found.value.partition(":")
    main = getattr(importlib.import_module(module_name), func_name)

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise Captured(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", capture)
        mp.setattr(argparse.ArgumentParser, "parse_known_args", capture)
        try:
            main(["--help"])
        except Captured as got:
            return got.parser
    raise AssertionError(f"the {script} console script built no parser")


def cli_parser() -> argparse.ArgumentParser:
    return script_parser("ferry")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """Option string -> whether it takes a value."""
    return {opt: action.nargs != 0 for action in parser._actions for opt in action.option_strings}


SAFE_NODES = (ast.Expression, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Name, ast.Load,
              ast.operator, ast.unaryop)


@cache
def numeric_constants() -> dict[str, frozenset[float]]:
    """UPPER_CASE names assigned a number in the packages (module level or in a class, such
    as an enum's members), with every value each name has somewhere. Arithmetic over
    numbers and earlier constants of the same scope is evaluated (`4 * 1024 * 1024`)."""
    out: dict[str, set[float]] = {}
    for path, _ in source():
        if path.suffix != ".py" or path.relative_to(ROOT).parts[0] not in PACKAGE_DIRS:
            continue
        tree = syntax(path)
        scopes = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        for body in scopes:
            known: dict[str, object] = {}
            for node in body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    target, value = node.target, node.value
                else:
                    continue
                if not isinstance(target, ast.Name) \
                        or not re.fullmatch(r"[A-Z][A-Z0-9_]*", target.id):
                    continue
                expr = ast.Expression(value)
                if not all(isinstance(n, SAFE_NODES) for n in ast.walk(expr)):
                    continue
                try:
                    number = eval(compile(expr, str(path), "eval"), {"__builtins__": {}}, known)
                except Exception:  # a name from elsewhere: not evaluated here
                    continue
                if isinstance(number, int | float) and not isinstance(number, bool):
                    known[target.id] = number
                    out.setdefault(target.id, set()).add(number)
    return {name: frozenset(values) for name, values in out.items()}
