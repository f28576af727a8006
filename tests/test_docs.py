"""Every page of docs/ (and the READMEs) against the code.

docs/protocol.md and docs/store-format.md have tests of their own that parse
their tables. This one holds the names every other page uses to the tree as it
is at test time, so a page cannot name what the code does not have:

- every `FERRY_*` environment variable is read somewhere in the source tree;
- every `ferry <command> <action> --flag` names a command, action and flag of
  the `ferry` CLI's own parser (built in-process from its console script);
- every relative link points at a file that exists;
- every repository path written in backticks (`bench/run.py`,
  `ferry/store/`) exists;
- every `/v1/...` HTTP route is served by some service;
- every settings table (`| key | default | flag |`) matches the service's config
  dataclass and flags; every default port is one the code uses;
- every `ferry.x.y` name and every example's `from ferry... import` imports, every `XxxError` is a class of the code, and every
  `make bench BENCH=x` suite exists.

Nothing here names a module of the code: variables, routes and paths are
collected from the tree when the test runs, so moving a module moves nothing
in this file (and makes the pages that name its old path fail, as they should).
"""
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

ROOT = Path(__file__).resolve().parents[1]
# Where the code lives: what a page names must be found here.
SOURCE_DIRS = ("libs", "services", "spark", "deploy", "bench", "tests")
SOURCE_FILES = ("Makefile",)
SOURCE_SUFFIXES = {".py", ".toml", ".yml", ".yaml", ".sh", ".cfg", ".ini", ".conf", ".json", ""}
SKIP_PARTS = {".venv", "__pycache__", "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
# Where the installed packages live (the config dataclasses are imported from them).
PACKAGE_DIRS = ("libs", "services", "spark")
# Top-level rooms of the repository: a backticked path starting with one is checked.
ROOMS = ("libs", "services", "spark", "deploy", "bench", "tests", "docs")

PAGES = sorted(
    [*ROOT.glob("docs/**/*.md"), ROOT / "README.md", *ROOT.glob("services/*/README.md"),
     *ROOT.glob("spark/README.md")]
)


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _walk(top: Path) -> Iterator[Path]:
    for path in top.rglob("*"):
        if path.is_file() and not SKIP_PARTS.intersection(path.parts) \
                and not any(p.endswith(".egg-info") for p in path.parts):
            yield path


@cache
def _tree_files() -> frozenset[str]:
    """Every file and directory of the repository (relative, '/'-separated), minus caches."""
    out: set[str] = set()
    for room in [*ROOMS, *SOURCE_FILES, "README.md", "pyproject.toml", "requirements-dev.txt"]:
        top = ROOT / room
        if top.is_file():
            out.add(room)
            continue
        for path in _walk(top):
            rel = path.relative_to(ROOT).as_posix()
            out.add(rel)
            parts = rel.split("/")
            for i in range(1, len(parts)):
                out.add("/".join(parts[:i]))
    return frozenset(out)


@cache
def _source() -> tuple[tuple[Path, str], ...]:
    """The code's text (tests included: their knobs such as FERRY_FUZZ_SEED are documented)."""
    files = [ROOT / f for f in SOURCE_FILES]
    for d in SOURCE_DIRS:
        files += [p for p in _walk(ROOT / d)
                  if p.suffix in SOURCE_SUFFIXES and p.name != "README.md"
                  and p != Path(__file__).resolve()]
    out = []
    for path in files:
        try:
            out.append((path, path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return tuple(out)


def _pages_text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _lines(page: Path) -> list[tuple[int, str]]:
    """The page's lines, numbered, without HTML comments (notes to editors, not shown to
    readers, such as `<!-- lead: update -->`)."""
    return [(n, re.sub(r"<!--.*?-->", "", line))
            for n, line in enumerate(_pages_text(page).splitlines(), start=1)]


# -- environment variables -----------------------------------------------------------------

ENV_TOKEN = re.compile(r"FERRY_[A-Z0-9_]*")
PREFIX_PART = re.compile(r"^[A-Z][A-Z0-9_]*_$")


def _dataclass_fields(tree: ast.Module) -> dict[str, tuple[list[str], list[str]]]:
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


def _string_prefixes(tree: ast.Module) -> set[str]:
    """"FERRY_BROKER_" and the like, as string constants (a comment's "FERRY_BROKER_TLS_*"
    is not one)."""
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and re.fullmatch(r"FERRY_[A-Z0-9_]*_", n.value)}


def _composed_suffix(node: ast.AST) -> str | None:
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
def _env_names() -> tuple[frozenset[str], tuple[re.Pattern[str], ...]]:
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
    for path, text in _source():
        names.update(t for t in ENV_TOKEN.findall(text) if not t.endswith("_"))
        if path.suffix != ".py":
            continue
        tree = ast.parse(text)
        for prefix in _string_prefixes(tree):
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
            suffix = _composed_suffix(node)
            if suffix:
                suffixes.add(suffix)
        dataclasses = _dataclass_fields(tree)
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


def _env_known(token: str, open_ended: bool) -> bool:
    names, patterns = _env_names()
    if open_ended:  # "FERRY_BROKER_*", "FERRY_<SERVICE>_<KEY>": some variable starts so
        return any(n.startswith(token) for n in names) or token == "FERRY_" \
            or any(p.pattern.startswith(re.escape(token)) for p in patterns)
    return token in names or any(p.fullmatch(token) for p in patterns)


def _env_mentions(page: Path) -> Iterator[tuple[int, str, bool]]:
    for number, line in _lines(page):
        for m in ENV_TOKEN.finditer(line):
            token = m.group(0)
            after = line[m.end():m.end() + 1]
            open_ended = token.endswith("_") or after in ("<", "*", "{")
            yield number, token.rstrip("_") if not open_ended else token, open_ended


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_environment_variables_exist(page: Path) -> None:
    bad = [f"{_page_id(page)}:{n}: {token}{'*' if open_ended else ''}"
           for n, token, open_ended in _env_mentions(page) if not _env_known(token, open_ended)]
    assert not bad, "variables no code reads:\n" + "\n".join(bad)


# -- the ferry CLI ---------------------------------------------------------------------------

class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@cache
def _script_parser(script: str) -> argparse.ArgumentParser:
    """The parser a console script (`ferry`, `ferry-broker`) builds, captured in-process."""
    (found,) = [e for e in entry_points(group="console_scripts") if e.name == script]
    module_name, _, func_name = found.value.partition(":")
    main = getattr(importlib.import_module(module_name), func_name)

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Captured(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", capture)
        mp.setattr(argparse.ArgumentParser, "parse_known_args", capture)
        try:
            main(["--help"])
        except _Captured as got:
            return got.parser
    raise AssertionError(f"the {script} console script built no parser")


def _cli_parser() -> argparse.ArgumentParser:
    return _script_parser("ferry")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """Option string -> whether it takes a value."""
    return {opt: action.nargs != 0 for action in parser._actions for opt in action.option_strings}


SHELL_STOP = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "&", "#"}
# A command line: `ferry` first, after an optional prompt, environment assignments or a venv path.
CLI_START = re.compile(r"^(?:\$\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\S*/)?ferry\s+(?P<rest>.*)$")


def _is_placeholder(token: str) -> bool:
    return token.startswith(("<", "{", "[", "...", "…")) or token.isupper() or "=" in token


def _check_cli(line: str) -> str | None:
    """Why `ferry ...` (the text after `ferry`) is not a command of the CLI, or None."""
    tokens = line.replace("[", " ").replace("]", " ").split()
    if tokens and tokens[0].endswith(":"):
        return None  # "ferry source: option ..." is a message that names its program
    parsers = [_cli_parser()]
    i = 0
    while i < len(tokens):
        token = tokens[i].strip("`'\"(),")
        if token in SHELL_STOP or token.startswith(("#", "|", ">")):
            break
        if token.startswith("-"):
            flag = token.split("=", 1)[0]
            known: dict[str, bool] = {}
            for p in parsers:
                known.update(_options(p))
            if flag not in known and flag not in ("-", "--"):
                return f"no option {flag} in `ferry {' '.join(tokens[:i])}`"
            if known.get(flag) and "=" not in token:
                i += 1
            i += 1
            continue
        subs = _subcommands(parsers[-1])
        if subs:
            if _is_placeholder(token):
                return None
            alternatives = token.replace("\\|", "|").split("|")  # a table's `get\|key\|time`
            if len(alternatives) > 1:
                missing = [a for a in alternatives if a not in subs]
                return f"no command(s) {missing} under `ferry {' '.join(tokens[:i])}`" \
                    if missing else None
            if token not in subs:
                where = " ".join(tokens[:i]) or "(top level)"
                return f"no command {token!r} under `ferry {where}`; known: {sorted(subs)}"
            parsers.append(subs[token])
        i += 1
    return None


def _code_spans(page: Path) -> Iterator[tuple[int, str]]:
    """Inline code spans and the lines of fenced blocks (continuation lines joined)."""
    fenced = False
    pending = ""
    start = 0
    for number, line in _lines(page):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            if pending:
                line = pending + " " + line.strip()
            else:
                start = number
            if line.rstrip().endswith("\\"):
                pending = line.rstrip()[:-1]
                continue
            pending = ""
            yield start, line.strip()
        else:
            for m in re.finditer(r"`([^`]+)`", line):
                yield number, m.group(1).strip()


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_cli_commands_exist(page: Path) -> None:
    bad = []
    for number, span in _code_spans(page):
        m = CLI_START.match(span)
        if m:
            why = _check_cli(m.group("rest"))
            if why:
                bad.append(f"{_page_id(page)}:{number}: {why}")
    assert not bad, "commands the ferry CLI does not have:\n" + "\n".join(bad)


# -- links and paths -------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_relative_links_exist(page: Path) -> None:
    bad = []
    for number, line in _lines(page):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                bad.append(f"{_page_id(page)}:{number}: {target}")
    assert not bad, "links to files that do not exist:\n" + "\n".join(bad)


PATH_TOKEN = re.compile(rf"^(?:{'|'.join(ROOMS)}|ferry|ferry_[a-z_]+)/[\w./-]*$")


def _path_exists(token: str) -> bool:
    files = _tree_files()
    token = token.rstrip("/")
    if token.split("/", 1)[0] in ROOMS:
        return token in files
    # `ferry/store/` or `ferry_broker/config.py`: a path inside a package.
    return any(f.endswith("/" + token) for f in files)


# A Python file named anywhere in a page: `handlers/pull.py`, test_send_pull.py.
PY_FILE = re.compile(r"(?<![\w/.<*-])([\w/.-]*\w\.py)\b")


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_repository_paths_exist(page: Path) -> None:
    """Backticked paths into the repository's rooms, and every `*.py` file a page names
    (as the end of some path in the repository)."""
    bad = []
    for number, line in _lines(page):
        for m in re.finditer(r"`([^`\s]+)`", line):
            token = m.group(1).split(":", 1)[0]
            if PATH_TOKEN.match(token) and not _path_exists(token):
                bad.append(f"{_page_id(page)}:{number}: {token}")
        for m in PY_FILE.finditer(line):
            token = m.group(1)
            if not any(f == token or f.endswith("/" + token) for f in _tree_files()):
                bad.append(f"{_page_id(page)}:{number}: {token}")
    assert not bad, "paths that are not in the repository:\n" + "\n".join(bad)


# -- dotted names ----------------------------------------------------------------------------

DOTTED = re.compile(r"(?<![\w/.-])(ferry(?:_[a-z_]+)?(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


@cache
def _dotted_literals() -> frozenset[str]:
    """"ferry.outcome" and the like: span attributes and keys the code writes as strings."""
    return frozenset(name for _, text in _source()
                     for name in re.findall(r"[\"'](ferry(?:_[a-z_]+)?\.[\w.]+)[\"']", text))


def _resolves(name: str) -> bool:
    """A module, or an attribute of the longest module prefix (`ferry.store.MessageStore`)."""
    if name in _dotted_literals():
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


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_dotted_names_resolve(page: Path) -> None:
    """`ferry.client.allocation`, `ferry_broker.config.BrokerConfig`: importable (or a name
    the code writes as a string, such as the span attribute `ferry.outcome`)."""
    bad = [f"{_page_id(page)}:{n}: {m.group(1)}" for n, line in _lines(page)
           for m in DOTTED.finditer(line) if not _resolves(m.group(1).rstrip("."))]
    assert not bad, "names that do not import:\n" + "\n".join(bad)


# -- imports in examples ----------------------------------------------------------------------

IMPORT = re.compile(r"\bfrom\s+((?:ferry|ferry_[a-z_]+)[\w.]*)\s+import\s+(\([^)]*\)|[^\n#`]+)")


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_example_imports_resolve(page: Path) -> None:
    """`from ferry.store import MessageStore, StoreConfig` in an example: every name imports."""
    bad = []
    text = re.sub(r"<!--.*?-->", "", _pages_text(page), flags=re.S)
    for m in IMPORT.finditer(text):
        module, names = m.group(1), m.group(2).strip("() \n")
        for part in names.split(","):
            name = part.split(" as ")[0].strip()
            if re.fullmatch(r"[A-Za-z_]\w*", name) and not _resolves(f"{module}.{name}"):
                bad.append(f"{_page_id(page)}: from {module} import {name}")
    assert not bad, "example imports that fail:\n" + "\n".join(bad)


# -- error classes ---------------------------------------------------------------------------

@cache
def _error_classes() -> frozenset[str]:
    import builtins

    names = {n for n in dir(builtins) if n.endswith("Error")}
    for _, text in _source():
        names.update(re.findall(r"^\s*class ([A-Z]\w*Error_?)\b", text, re.M))
    return frozenset(names)


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_error_classes_exist(page: Path) -> None:
    """`BusyError`, `InvalidDelayError`, ...: each a class the code defines (or Python's)."""
    bad = [f"{_page_id(page)}:{n}: {m.group(1)}" for n, line in _lines(page)
           for m in re.finditer(r"(?<![\w.])([A-Z][A-Za-z0-9]*Error_?)\b", line)
           if m.group(1) not in _error_classes()]
    assert not bad, "error classes the code does not define:\n" + "\n".join(bad)


# -- bench suites ----------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_bench_suites_exist(page: Path) -> None:
    """`make bench BENCH=<name>` names a suite bench/bench_<name>.py."""
    bad = [f"{_page_id(page)}:{n}: BENCH={name}" for n, line in _lines(page)
           for name in re.findall(r"BENCH=([a-z_]+)", line)
           if not (ROOT / "bench" / f"bench_{name}.py").is_file()]
    assert not bad, "bench suites that do not exist:\n" + "\n".join(bad)


# -- HTTP routes -----------------------------------------------------------------------------

ROUTE = re.compile(r"/v1/[A-Za-z0-9_{}<>%.:*-]*(?:/[A-Za-z0-9_{}<>%.:*-]*)*")


@cache
def _routes() -> frozenset[tuple[str, ...]]:
    """Every "/v1/..." string constant in the services: their routers and route tables."""
    out: set[tuple[str, ...]] = set()
    for path, text in _source():
        if path.suffix != ".py" or "services" not in path.relative_to(ROOT).parts[:1]:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"/v1/[\w{}/.-]+", node.value):
                out.add(tuple(node.value.strip("/").split("/")))
    return frozenset(out)


def _is_param(segment: str) -> bool:
    return segment.startswith(("{", "<", ":")) or segment in ("*", "…", "...")


def _route_known(mention: str) -> bool:
    mention = mention.removesuffix("**").rstrip(".,:;")
    open_ended = mention.endswith(("/", "*", "..."))
    segments = [s for s in mention.strip("/").split("/") if s not in ("*", "...", "…")]
    if len(segments) < 2:
        return True  # "/v1/" alone names the API, not a route
    for route in _routes():
        if len(route) < len(segments) or (len(route) != len(segments) and not open_ended):
            continue
        if all(d == r or r.startswith("{") or (_is_param(d) and r.startswith("{"))
               for d, r in zip(segments, route, strict=False)):
            return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_http_routes_exist(page: Path) -> None:
    bad = []
    for number, line in _lines(page):
        for m in ROUTE.finditer(line):
            if not _route_known(m.group(0).split("?", 1)[0]):
                bad.append(f"{_page_id(page)}:{number}: {m.group(0)}")
    assert not bad, "routes no service serves:\n" + "\n".join(bad)


# -- configuration tables --------------------------------------------------------------------

def _module_name(path: Path) -> str:
    """`ferry_broker.config` for services/broker/ferry_broker/config.py: up to the first
    directory that is not a package."""
    parts = [path.stem] if path.stem != "__init__" else []
    parent = path.parent
    while (parent / "__init__.py").exists():
        parts.insert(0, parent.name)
        parent = parent.parent
    return ".".join(parts)


@cache
def _config_defaults() -> dict[str, object]:
    """Variable -> default, for every field of a dataclass read under a service prefix:
    the dataclasses of a module that names a "FERRY_<SERVICE>_" prefix, and their bases."""
    out: dict[str, object] = {}
    for path, text in _source():
        if path.suffix != ".py" or path.relative_to(ROOT).parts[0] not in PACKAGE_DIRS:
            continue
        if "dataclass" not in text:
            continue
        tree = ast.parse(text)
        prefixes = {p for p in _string_prefixes(tree) if p != "FERRY_"}
        classes = _dataclass_fields(tree) if prefixes else {}
        if not classes:
            continue
        module = importlib.import_module(_module_name(path))
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


def _same_value(doc: str, code: object) -> bool:
    doc = doc.strip()
    if isinstance(code, bool):
        return doc.lower() in (("true", "on", "yes", "1") if code else ("false", "off", "no", "0"))
    if isinstance(code, int | float):
        try:
            return float(doc.replace("_", "").replace(",", "")) == float(code)
        except ValueError:
            return False
    if isinstance(code, tuple | list | frozenset | set):
        return doc == ",".join(map(str, code)) or doc == " ".join(map(str, code))
    return doc == str(code)


def _tables(page: Path) -> Iterator[tuple[str | None, list[str], list[tuple[int, list[str]]]]]:
    """Each table with a `default` column: the `FERRY_<X>_` prefix named last before it, its
    header and its rows."""
    prefix = None
    lines = _lines(page)
    i = 0
    while i < len(lines):
        number, line = lines[i]
        m = re.search(r"(FERRY_[A-Z0-9_]+_)(?:<KEY>|\*)", line)
        if m:
            prefix = m.group(1)
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1][1].startswith("|---"):
            header = [c.strip().lower() for c in line.strip().strip("|").split("|")]
            rows = []
            i += 2
            while i < len(lines) and lines[i][1].startswith("|"):
                rows.append((lines[i][0], [c.strip() for c in lines[i][1].strip().strip("|")
                                           .split("|")]))
                i += 1
            if "default" in header and header[0] in ("key", "variable"):
                yield prefix, header, rows
            continue
        i += 1


def _first_value(cell: str) -> str | None:
    """The value a default cell states: its first code span, else its first word; None when
    it states none in a checkable form ("(= HOST)", "unset", "(empty)")."""
    m = re.match(r"\s*`([^`]*)`", cell)
    if m:
        return m.group(1)
    word = cell.split(" ", 1)[0] if cell else ""
    return None if not word or word.startswith("(") or word in ("unset", "none") else word


def _service_script(variable: str) -> str | None:
    """`ferry-broker` for FERRY_BROKER_..., the console script whose flags set it."""
    for e in entry_points(group="console_scripts"):
        if e.name.startswith("ferry-"):
            prefix = "FERRY_" + e.name.removeprefix("ferry-").upper().replace("-", "_") + "_"
            if variable.startswith(prefix):
                return e.name
    return None


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_configuration_tables_match_the_code(page: Path) -> None:
    """A table of settings (`| key | default | flag |` under "FERRY_BROKER_<KEY>", or
    `| variable | default |`): each is a field of the service's config with that default,
    and each flag is one of the service's own."""
    defaults = _config_defaults()
    bad = []
    for prefix, header, rows in _tables(page):
        for number, cells in rows:
            row = dict(zip(header, cells, strict=False))
            name = row[header[0]].strip("`")
            if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
                continue
            variable = name if header[0] == "variable" else (prefix or "") + name
            where = f"{_page_id(page)}:{number}: {variable}"
            if not variable.startswith("FERRY_"):
                continue
            if variable not in defaults:
                if not _env_known(variable, False):
                    bad.append(f"{where}: no code reads it")
                continue
            stated = _first_value(row["default"])
            if stated is not None and not _same_value(stated, defaults[variable]):
                bad.append(f"{where}: documented default {stated!r}, code {defaults[variable]!r}")
            flags = re.findall(r"--[\w\[\]-]+", row.get("flag", ""))
            script = _service_script(variable)
            if flags and script:
                known = _options(_script_parser(script))
                for flag in flags:
                    forms = [flag.replace("[no-]", ""), flag.replace("[no-]", "no-")] \
                        if "[no-]" in flag else [flag]
                    bad += [f"{where}: {script} has no {f}" for f in forms if f not in known]
    assert not bad, "settings tables that differ from the code:\n" + "\n".join(bad)


# -- client parameters -----------------------------------------------------------------------

UNITS = {"KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}


def _stated_default(cell: str) -> object:
    """The value a client table's default cell states, or `...` when it states none that
    can be compared ("the group's `retry_max`, else 16", "`$FERRY_NAMESRV` or ...")."""
    text = cell.strip()
    m = re.fullmatch(r"([\d ]+)(?: ([KMG]iB))?(?: \(.*\))?", text)
    if m:
        return int(m.group(1).replace(" ", "")) * UNITS.get(m.group(2) or "", 1)
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    if text.startswith("None ("):
        return None
    m = re.fullmatch(r"`([a-z_]+)`", text)
    return m.group(1) if m else ...


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_client_parameters_match_the_code(page: Path) -> None:
    """A `| client | parameter | default |` table: each parameter is a keyword of that
    client class (exported by `ferry`), with the default the table states."""
    import inspect

    import ferry

    bad = []
    for number, line in _lines(page):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or not cells[1].startswith("`"):
            continue
        clients = {"all": ["Producer", "Consumer"]}.get(cells[0], cells[0].split("/"))
        if not all(c in getattr(ferry, "__all__", ()) for c in clients):
            continue
        name = cells[1].strip("`")
        for client in clients:
            params = inspect.signature(getattr(ferry, client).__init__).parameters
            where = f"{_page_id(page)}:{number}: {client}({name}=)"
            if name not in params:
                if name != "other keywords":
                    bad.append(f"{where}: no such parameter")
                continue
            stated, default = _stated_default(cells[2]), params[name].default
            if cells[2] == "required":
                if default is not inspect.Parameter.empty:
                    bad.append(f"{where}: documented required, has default {default!r}")
            elif stated is not ... and stated != default:
                bad.append(f"{where}: documented default {stated!r}, code {default!r}")
    assert not bad, "client parameters that differ from the code:\n" + "\n".join(bad)


# -- ports ---------------------------------------------------------------------------------

# Ferry's own default ports (namesrv 9876, brokers and services 10911 and up).
PORT = re.compile(r"(?<![\d.])(9876|109\d\d)(?![\d.])")


@cache
def _port_literals() -> frozenset[int]:
    out: set[int] = set()
    for path, text in _source():
        if path.suffix == ".py" and path.relative_to(ROOT).parts[0] != "tests":
            out.update(n.value for n in ast.walk(ast.parse(text))
                       if isinstance(n, ast.Constant) and type(n.value) is int)
        elif path.suffix != ".py":
            out.update(int(p) for p in PORT.findall(text))
    return frozenset(out)


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_ports_exist(page: Path) -> None:
    """A port a page names is a default somewhere in the code, deploy/ or the Makefile."""
    bad = [f"{_page_id(page)}:{n}: {port}" for n, line in _lines(page)
           for port in PORT.findall(line) if int(port) not in _port_literals()]
    assert not bad, "ports no code uses:\n" + "\n".join(bad)


def test_the_checks_see_the_code() -> None:
    """The collectors find what they look for (an empty set would pass every page)."""
    names, _ = _env_names()
    assert "FERRY_NAMESRV" in names and len(names) > 50
    assert len(_routes()) > 10
    assert len(_subcommands(_cli_parser())) > 5
    assert "Makefile" in _tree_files()
    assert len(_config_defaults()) > 50
