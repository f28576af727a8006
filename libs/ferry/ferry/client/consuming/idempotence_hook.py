"""How `consumer.run(handler, idempotence=check)` reaches `ferry.idempotence` without importing it.

The checks (a Redis claim, a ledger, a check of your own) and their counts
live in `ferry.idempotence`, which builds on the client (its records, the
runner's batch hook, tracing): the dependency runs one way. The consumer
calls the wiring installed here; the `ferry` package's `__init__` installs
`ferry.idempotence`'s (imported at the first idempotent run only, so that
`import ferry` does not load Redis and SQL drivers for clients that never
use them).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ferry.errors import FerryError

Handler = Callable[..., Awaitable[Any]]


class IdempotenceWiring(Protocol):
    """Puts `handler` behind `check`, counting outcomes in `stats` (a new one for None);
    returns the wrapped handler and the stats (`consumer.idempotence_stats`)."""

    def __call__(self, handler: Handler, check: object, *, group: str,
                 stats: Any) -> tuple[Handler, Any]: ...


_wiring: IdempotenceWiring | None = None


def use_idempotence_wiring(wiring: IdempotenceWiring) -> None:
    """Install what `consumer.run(..., idempotence=...)` wires its handler with."""
    global _wiring
    _wiring = wiring


def wire_idempotence(handler: Handler, check: object, *, group: str,
                     stats: Any) -> tuple[Handler, Any]:
    """`handler` behind `check` through the installed wiring (see the module doc)."""
    if _wiring is None:
        raise FerryError("idempotence= needs ferry.idempotence's wiring: import ferry")
    return _wiring(handler, check, group=group, stats=stats)
