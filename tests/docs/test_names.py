"""Names a page uses: environment variables, dotted names, imports in examples, error
classes, bench suites and ports (the checks are described in tests/docs/__init__.py)."""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests.docs.env import ENV_TOKEN, env_known, env_names
from tests.docs.pages import PAGES, ROOT, lines, page_id, pages_text
from tests.docs.source import (
    cli_parser,
    config_defaults,
    error_classes,
    numeric_constants,
    resolves,
    routes,
    source,
    subcommands,
    syntax,
    tree_files,
)


def _env_mentions(page: Path) -> Iterator[tuple[int, str, bool]]:
    for number, line in lines(page):
        for m in ENV_TOKEN.finditer(line):
            token = m.group(0)
            after = line[m.end():m.end() + 1]
            open_ended = token.endswith("_") or after in ("<", "*", "{")
            yield number, token.rstrip("_") if not open_ended else token, open_ended


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_environment_variables_exist(page: Path) -> None:
    bad = [f"{page_id(page)}:{n}: {token}{'*' if open_ended else ''}"
           for n, token, open_ended in _env_mentions(page) if not env_known(token, open_ended)]
    assert not bad, "variables no code reads:\n" + "\n".join(bad)


DOTTED = re.compile(r"(?<![\w/.-])(ferry(?:_[a-z_]+)?(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_dotted_names_resolve(page: Path) -> None:
    """`ferry.client.consuming.allocation`, `ferry_broker.config.BrokerConfig`: importable (or a name
    the code writes as a string, such as the span attribute `ferry.outcome`)."""
    bad = [f"{page_id(page)}:{n}: {m.group(1)}" for n, line in lines(page)
           for m in DOTTED.finditer(line) if not resolves(m.group(1).rstrip("."))]
    assert not bad, "names that do not import:\n" + "\n".join(bad)


IMPORT = re.compile(r"\bfrom\s+((?:ferry|ferry_[a-z_]+)[\w.]*)\s+import\s+(\([^)]*\)|[^\n#`]+)")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_example_imports_resolve(page: Path) -> None:
    """`from ferry.store import MessageStore, StoreConfig` in an example: every name imports."""
    bad = []
    text = re.sub(r"<!--.*?-->", "", pages_text(page), flags=re.S)
    for m in IMPORT.finditer(text):
        module, names = m.group(1), m.group(2).strip("() \n")
        for part in names.split(","):
            name = part.split(" as ")[0].strip()
            if re.fullmatch(r"[A-Za-z_]\w*", name) and not resolves(f"{module}.{name}"):
                bad.append(f"{page_id(page)}: from {module} import {name}")
    assert not bad, "example imports that fail:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_error_classes_exist(page: Path) -> None:
    """`BusyError`, `InvalidDelayError`, ...: each a class the code defines (or Python's)."""
    bad = [f"{page_id(page)}:{n}: {m.group(1)}" for n, line in lines(page)
           for m in re.finditer(r"(?<![\w.])([A-Z][A-Za-z0-9]*Error_?)\b", line)
           if m.group(1) not in error_classes()]
    assert not bad, "error classes the code does not define:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_bench_suites_exist(page: Path) -> None:
    """`make bench BENCH=<name>` names a suite bench/bench_<name>.py."""
    bad = [f"{page_id(page)}:{n}: BENCH={name}" for n, line in lines(page)
           for name in re.findall(r"BENCH=([a-z_]+)", line)
           if not (ROOT / "bench" / f"bench_{name}.py").is_file()]
    assert not bad, "bench suites that do not exist:\n" + "\n".join(bad)


# Ferry's own default ports (namesrv 9876, brokers and services 10911 and up).
PORT = re.compile(r"(?<![\d.])(9876|109\d\d)(?![\d.])")


@cache
def port_literals() -> frozenset[int]:
    out: set[int] = set()
    for path, text in source():
        if path.suffix == ".py" and path.relative_to(ROOT).parts[0] != "tests":
            out.update(n.value for n in ast.walk(syntax(path))
                       if isinstance(n, ast.Constant) and type(n.value) is int)
        elif path.suffix != ".py":
            out.update(int(p) for p in PORT.findall(text))
    return frozenset(out)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_ports_exist(page: Path) -> None:
    """A port a page names is a default somewhere in the code, deploy/ or the Makefile."""
    bad = [f"{page_id(page)}:{n}: {port}" for n, line in lines(page)
           for port in PORT.findall(line) if int(port) not in port_literals()]
    assert not bad, "ports no code uses:\n" + "\n".join(bad)


def test_the_checks_see_the_code() -> None:
    """The collectors find what they look for (an empty set would pass every page)."""
    names, _ = env_names()
    assert "FERRY_NAMESRV" in names and len(names) > 50
    assert len(routes()) > 10
    assert len(subcommands(cli_parser())) > 5
    assert "Makefile" in tree_files()
    assert len(config_defaults()) > 50
    # Each service's settings are found (else their tables would go unchecked): a service
    # whose config moved where the collector does not look fails here, not silently.
    services = [e.name for e in entry_points(group="console_scripts")
                if e.name.startswith("ferry-")]
    for service in services:
        prefix = "FERRY_" + service.removeprefix("ferry-").upper().replace("-", "_") + "_"
        assert any(v.startswith(prefix) for v in config_defaults()), f"no settings of {service}"
    assert numeric_constants()["MAX_QUEUES"] == {1024}
