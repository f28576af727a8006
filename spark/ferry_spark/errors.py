"""The data source's own errors (the rest are `ferry.errors` classes, raised as they come)."""
from __future__ import annotations

from ferry.errors import FerryError


class SourceOptionError(FerryError, ValueError):
    """An option of the `ferry` data source is missing, unknown or has a bad value."""
