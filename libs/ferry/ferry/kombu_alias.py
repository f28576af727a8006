"""Make kombu resolve `ferry://` as soon as kombu is loaded, without importing kombu.

kombu has no plugin lookup for transports: a scheme resolves only through
`kombu.transport.TRANSPORT_ALIASES`. `import ferry` calls `install()`, so a
program that has imported Ferry can write `Celery(broker="ferry://...")` with
no further import. Importing kombu itself (~50 ms) on every `import ferry`
would tax every service and CLI call, so when kombu is not loaded yet a
one-shot import hook adds the alias right after `kombu.transport` loads.
This module imports nothing of kombu or Celery.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

ALIAS = "ferry"
TRANSPORT_PATH = "ferry.celery.transport:Transport"
_KOMBU_TRANSPORT = "kombu.transport"


def _add_alias(module: ModuleType) -> None:
    aliases = getattr(module, "TRANSPORT_ALIASES", None)
    if isinstance(aliases, dict):
        aliases.setdefault(ALIAS, TRANSPORT_PATH)


class _AfterKombuTransport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: lets `kombu.transport` load as usual, then adds the alias."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _KOMBU_TRANSPORT:
            return None
        _uninstall()
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_alias(module: ModuleType) -> None:
            exec_module(module)
            _add_alias(module)
        loader.exec_module = exec_then_alias  # type: ignore[method-assign]
        return spec


def _uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterKombuTransport)]


def install() -> None:
    """Register `ferry://` with kombu now if it is loaded, else right after it loads."""
    loaded = sys.modules.get(_KOMBU_TRANSPORT)
    if loaded is not None:
        _add_alias(loaded)
    elif not any(isinstance(f, _AfterKombuTransport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterKombuTransport())
