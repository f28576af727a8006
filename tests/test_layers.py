"""The layer contract of docs/architecture.md, held to the code by reading every import.

Parsed with `ast` (nothing imported, no new dependency), over the product code
of `libs/ferry`, `services/*` and `spark`. Every import counts: module level,
inside functions, and under `if TYPE_CHECKING:` (a type-only import is still a
dependency a reader has to follow, and it turns into a real one the day
somebody needs the name at run time).

The rules:
- no import cycle between modules, nor between packages (`ferry.<room>`, one
  service package, `ferry_spark`);
- no import from a lower layer to a higher one (LAYERS, lowest first);
- no service package imports another service's package;
- `ferry.store` imports no asyncio and no network module (Spark and tools use it).

A failure lists the offending edges. KNOWN_VIOLATIONS holds what is still
being removed: an entry may only go, and one that no longer happens fails
the test too, so the list cannot rot.
"""
from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Lowest first. A package may import its own layer and the ones below.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"ferry.codec", "ferry.errors", "ferry.names", "ferry.atomic_file", "ferry.tasks",
               "ferry.env", "ferry.log_limit", "ferry.cork", "ferry.extensions"}),
    frozenset({"ferry.store", "ferry.wire", "ferry.filter", "ferry.auth"}),
    frozenset({"ferry.telemetry", "ferry.routing"}),
    frozenset({"ferry.client"}),
    # `ferry` itself is the public facade (`from ferry import Producer`, `__version__`).
    frozenset({"ferry.idempotence", "ferry.celery", "ferry.kombu_alias", "ferry"}),
    frozenset({"ferry.service", "ferry.cli"}),
)
#: The top layer: every package that is not `ferry.*` (services and Spark).
TOP = len(LAYERS)
#: Imported by nothing of `ferry.store` (it must run without an event loop or network).
STORE_FORBIDDEN = frozenset({"asyncio", "aiohttp", "socket", "ssl", "selectors", "http",
                             "urllib", "aetcd", "redis", "grpc"})

#: Known violations allowed for now. Empty since issue 22: a new cycle or upward
#: import fails the test; an entry here would need an issue named beside it.
Violation = tuple[str, tuple[str, ...]]
KNOWN_VIOLATIONS: frozenset[Violation] = frozenset()


def _package_roots() -> list[Path]:
    services = sorted(p for p in (ROOT / "services").iterdir() if p.is_dir())
    return [ROOT / "libs" / "ferry", *services, ROOT / "spark"]


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for the product code."""
    mods: dict[str, Path] = {}
    for root in _package_roots():
        for path in root.rglob("*.py"):
            rel = path.relative_to(root)
            if rel.parts[0] in ("tests", "build") or any(p.endswith(".egg-info")
                                                          for p in rel.parts):
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts:
                mods[".".join(parts)] = path
    return mods


def _imported_names(path: Path, module: str) -> Iterator[str]:
    """Every dotted name `module` imports (absolute, relative imports resolved).

    `from p import x` counts as an import of the submodule `p.x` when there is
    one, else of `p` (as the issue-22 cycle count reads it): a package's `__init__` that
    re-exports its submodules is then no cycle with them."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                yield f"{source}.{alias.name}"  # a submodule, or a name in `source`


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> modules it imports, module -> outside top-level names it imports)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    outside: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for name in _imported_names(path, module):
            target = _resolve(name, mods)
            if target is None:
                outside[module].add(name.partition(".")[0])
            elif target != module:
                graph[module].add(target)
    return graph, outside


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(tuple(sorted(component)))
    return found


def package_of(module: str) -> str:
    """`ferry.<room>` for the library (`ferry` for its root module), else the top package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "ferry" else parts[0]


def layer_of(package: str) -> int:
    if not package.startswith("ferry.") and package != "ferry":
        return TOP
    for level, members in enumerate(LAYERS):
        if package in members:
            return level
    raise AssertionError(f"{package} is in no layer: place it in tests/test_layers.py LAYERS")


def _is_service(package: str) -> bool:
    return package.startswith("ferry_") and package != "ferry_spark"


def _cycle_edges(graph: dict[str, set[str]], members: tuple[str, ...],
                 convert: Callable[[str], str] = str) -> list[tuple[str, str]]:
    """The module edges inside a cycle (of packages, with `convert=package_of`)."""
    inside = set(members)
    return sorted({(a, b) for a in graph for b in graph[a]
                   if convert(a) in inside and convert(b) in inside and convert(a) != convert(b)})


GRAPH, OUTSIDE = _graph()


def _report(kind: str, found: set[Violation]) -> tuple[set[Violation], set[Violation]]:
    """(new violations, allowed ones that no longer happen) of one kind."""
    known = {v for v in KNOWN_VIOLATIONS if isinstance(v, tuple) and v[0] == kind}
    return found - known, known - found


def test_no_module_import_cycle() -> None:
    found: set[Violation] = {("cycle", c) for c in _cycles(GRAPH)}
    new, gone = _report("cycle", found)
    lines = []
    for _, members in sorted(new):
        lines.append(f"import cycle among {', '.join(members)}:")
        lines.append("\n".join(f"  {a} -> {b}" for a, b in _cycle_edges(GRAPH, members)))
    assert not new, "\n".join(lines)
    assert not gone, f"no longer cycles: remove them from KNOWN_VIOLATIONS: {sorted(gone)}"


def test_no_package_import_cycle() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        packages.setdefault(package_of(module), set()).update(
            package_of(t) for t in targets if package_of(t) != package_of(module))
    found: set[Violation] = {("pkg-cycle", c) for c in _cycles(packages)}
    new, gone = _report("pkg-cycle", found)
    lines = []
    for _, members in sorted(new):
        lines.append(f"package cycle among {', '.join(members)}, through:")
        lines.append("\n".join(f"  {a} -> {b}"
                               for a, b in _cycle_edges(GRAPH, members, package_of)))
    assert not new, "\n".join(lines)
    assert not gone, f"no longer cycles: remove them from KNOWN_VIOLATIONS: {sorted(gone)}"


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    found: set[Violation] = {
        ("layer", (a, b)) for a, targets in GRAPH.items() for b in targets
        if layer_of(package_of(a)) < layer_of(package_of(b))}
    new, gone = _report("layer", found)
    assert not new, "imports from a lower layer to a higher one:\n" + "\n".join(
        f"  {a} (layer {layer_of(package_of(a))}) -> {b} (layer {layer_of(package_of(b))})"
        for _, (a, b) in sorted(new))
    assert not gone, f"no longer happen: remove them from KNOWN_VIOLATIONS: {sorted(gone)}"


def test_no_service_imports_another_service() -> None:
    found: set[Violation] = {
        ("service", (a, b)) for a, targets in GRAPH.items() for b in targets
        if _is_service(package_of(a)) and _is_service(package_of(b))
        and package_of(a) != package_of(b)}
    found |= {("service", (a, name)) for a, names in OUTSIDE.items() for name in names
              if _is_service(package_of(a)) and _is_service(name) and name != package_of(a)}
    new, gone = _report("service", found)
    assert not new, "a service imports another service's package (reach it over the " \
        "network):\n" + "\n".join(f"  {a} -> {b}" for _, (a, b) in sorted(new))
    assert not gone, f"no longer happen: remove them from KNOWN_VIOLATIONS: {sorted(gone)}"


def test_the_store_imports_no_asyncio_and_no_network() -> None:
    bad = sorted((m, name) for m, names in OUTSIDE.items() for name in names
                 if package_of(m) == "ferry.store" and name in STORE_FORBIDDEN)
    assert not bad, "ferry.store must run without an event loop or a network:\n" + "\n".join(
        f"  {m} imports {name}" for m, name in bad)


def test_every_library_package_has_a_layer() -> None:
    for module in GRAPH:
        layer_of(package_of(module))  # raises with the package's name


def test_the_checker_sees_a_cycle_and_an_upward_import() -> None:
    """The graph reading itself: a known type-only edge and the cycle detection."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]
    # `if TYPE_CHECKING:` imports count: roles.py names the config only for types.
    assert "ferry_broker.config" in GRAPH["ferry_broker.roles"]
    assert layer_of("ferry.codec") < layer_of("ferry.client") < layer_of("ferry_broker")


#: The client library's rooms, lowest first (docs/architecture.md): a room imports
#: its own modules and rooms of a lower rank only.
CLIENT_ROOMS: dict[str, int] = {
    "core": 0, "producing": 1, "consuming": 1, "reading": 1, "transactions": 2, "admin": 2,
}


def test_client_rooms_import_only_lower_rooms() -> None:
    def room(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 3 and parts[:2] == ["ferry", "client"] else None

    rooms = {room(m) for m in GRAPH} - {None}
    assert rooms == set(CLIENT_ROOMS), f"client rooms on disk {sorted(r for r in rooms if r)}"
    bad = sorted((a, b) for a, targets in GRAPH.items() for b in targets
                 if room(a) and room(b) and room(a) != room(b)
                 and CLIENT_ROOMS[room(a)] <= CLIENT_ROOMS[room(b)])  # type: ignore[index]
    assert not bad, "a client room imports a room of its own rank or above:\n" + "\n".join(
        f"  {a} -> {b}" for a, b in bad)
