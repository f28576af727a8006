"""Whether the broker's store still takes writes, and what clients are told when not.

The store refuses every append once one failed (an I/O error, a full disk) or
once it is closed, until it is reopened. The broker notices at the first
refused SEND: it logs the cause at ERROR, answers that SEND and every later
one with StoreUnavailableError (retriable, so producers send to another
broker), turns /readyz to 503 and withdraws its etcd registration (the app
listens here). Clients never see the store's own message, which can name
filesystem paths: every StoreError that reaches a handler is logged and
answered with a generic message of the same code.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from ferry.errors import StoreError, StoreUnavailableError

log = logging.getLogger(__name__)

GENERIC_STORE_MESSAGE = "the broker's store failed; see the broker log"


class StoreHealth:
    """The store's health as the broker has seen it; failures are sticky."""

    def __init__(self) -> None:
        self.failure: str | None = None
        # Not sticky: set while the commit log is not being flushed (housekeeping's
        # FlushWatchdog), cleared when flushing moves again.
        self.stalled: str | None = None
        # Not sticky either: set while the disk alarm is up (disk.py), the DiskFullError
        # message; readiness stays (the broker still serves reads, which free space).
        self.full: str | None = None
        self._listeners: list[Callable[[], None]] = []

    @property
    def healthy(self) -> bool:
        return self.failure is None and self.stalled is None

    def set_stalled(self, reason: str | None) -> None:
        """Mark the store's flushing stalled (`reason`) or moving again (None)."""
        if reason is not None and self.stalled is None:
            log.error("the store's flushing is stalled; refusing SENDs and leaving readiness: "
                      "%s", reason, extra={"error": reason})
        elif reason is None and self.stalled is not None:
            log.warning("the store's flushing moves again; taking SENDs")
        self.stalled = reason

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` (once) when the store is first seen failed."""
        self._listeners.append(listener)

    def unavailable(self, exc: BaseException, sticky: bool = True) -> StoreUnavailableError:
        """Record a refused write (unless not `sticky`); the error to answer it with."""
        if sticky and self.failure is None:
            self.failure = f"{type(exc).__name__}: {exc}"
            log.error("the store refuses writes; answering SENDs with StoreUnavailableError "
                      "and leaving readiness: %s", self.failure, extra={"error": self.failure})
            for listener in self._listeners:
                try:
                    listener()
                except Exception:
                    log.exception("store-failure listener failed")
        return StoreUnavailableError("this broker's store cannot take writes; "
                                     "send to another broker")

    @staticmethod
    def hide(exc: StoreError) -> StoreError:
        """Log a store error's detail; the same class with a message fit for clients."""
        log.error("store error: %s: %s", type(exc).__name__, exc, extra={"error": str(exc)})
        return type(exc)(GENERIC_STORE_MESSAGE)
