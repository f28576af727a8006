"""Turning I/O failures of store reads into the store's own error type."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ferry.errors import StoreError

_F = TypeVar("_F", bound=Callable[..., Any])


def os_errors_as_store_errors(method: _F) -> _F:
    """Make `method` raise StoreError for an OSError (a file that cannot be opened or
    mapped: no descriptor left, a deleted file), like every other store failure, so
    callers handle one error type."""
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except OSError as exc:
            raise StoreError(f"{method.__name__} failed: {exc}") from exc
    return call  # type: ignore[return-value]
