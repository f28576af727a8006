"""The store directory's lock: one process at a time opens a store.

Two processes appending to one commit log would interleave records and each
recover over the other's tail, so MessageStore takes an exclusive, non-blocking
flock on `<root>/lock` when it opens and holds it until close.
"""
from __future__ import annotations

import fcntl
import os

from ferry.errors import StoreError


def lock_directory(root: str) -> int:
    """Hold an exclusive lock on the store directory for the life of the process."""
    fd = os.open(os.path.join(root, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StoreError(f"store directory {root} is in use by another process") from None
    return fd
