"""The dependency direction of ARCHITECTURE.md, read from the source: codec, errors and names
are leaves (and extensions, which picks a hot module's compiled twin, and atomic_file, the store's and the services' durable file replace); store and
wire build on the leaves only; the client never imports the store."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "libs" / "ferry" / "ferry"
LEAVES = {"ferry.codec", "ferry.errors", "ferry.names", "ferry.atomic_file", "ferry.extensions"}


def _ferry_imports(package: str) -> set[str]:
    """The ferry modules imported anywhere under `package` (e.g. "codec", or a module
    "atomic_file.py"), as dotted names."""
    out: set[str] = set()
    paths = [PKG / package] if package.endswith(".py") else (PKG / package).rglob("*.py")
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "ferry" and node.level == 0:
                out.update(f"ferry.{alias.name}" for alias in node.names)  # its modules
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(alias.name for alias in node.names)
    return {m for m in out if m == "ferry" or m.startswith("ferry.")}


def _outside(imports: set[str], allowed: set[str]) -> set[str]:
    return {m for m in imports if not any(m == a or m.startswith(a + ".") for a in allowed)}


@pytest.mark.parametrize("package, allowed", [
    ("codec", LEAVES),
    ("atomic_file.py", set()),
    ("store", LEAVES | {"ferry.store"}),
    ("wire", LEAVES | {"ferry.wire"}),
])
def test_leaves_and_their_direct_users(package: str, allowed: set[str]) -> None:
    assert _outside(_ferry_imports(package), allowed) == set()


@pytest.mark.parametrize("package", ["client", "cli"])
def test_the_client_never_imports_the_store(package: str) -> None:
    assert {m for m in _ferry_imports(package) if m.startswith("ferry.store")} == set()
