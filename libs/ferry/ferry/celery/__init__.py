"""ferry.celery: Celery on Ferry (see docs/celery.md).

- the kombu transport behind `Celery(broker="ferry://127.0.0.1:9876")`
  (`ferry.celery.transport.Transport`): `import ferry` (or this package)
  registers the `ferry` scheme with kombu (`ferry.kombu_alias`); the `celery`
  command imports it by itself through the `celery.commands` entry point;
- the topic → task bridge (`ferry.celery.bridge`, `ferry celery-bridge`);
- idempotent tasks (`ferry.celery.idempotent`): a ledger row per task id in
  the task's own transaction, so a redelivered task never runs twice.
"""
from __future__ import annotations

from typing import Any

from ferry.kombu_alias import ALIAS as TRANSPORT_ALIAS
from ferry.kombu_alias import TRANSPORT_PATH


def register() -> None:
    """Make kombu resolve `ferry://` URLs to Ferry's transport (idempotent)."""
    from kombu.transport import TRANSPORT_ALIASES
    TRANSPORT_ALIASES.setdefault(TRANSPORT_ALIAS, TRANSPORT_PATH)


register()


def __getattr__(name: str) -> Any:
    # The helpers import kombu/Celery lazily: `import ferry.celery` stays cheap.
    if name == "Transport":
        from ferry.celery.transport import Transport
        return Transport
    if name in ("idempotent_task", "TaskRef"):
        from ferry.celery import idempotent
        return getattr(idempotent, name)
    raise AttributeError(name)


__all__ = ["TRANSPORT_ALIAS", "TRANSPORT_PATH", "TaskRef", "Transport", "idempotent_task",
           "register"]
