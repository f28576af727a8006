"""Replacing a small state file so that a crash leaves the old contents or the new, never part.

Used for the services' progress, checkpoint and registry files and the store's
checkpoint, epoch and history files: write a temp file beside it, fdatasync it,
rename it over the old one, fsync the directory (so the rename itself survives a
power loss). `load_versioned` reads one back. A leaf like `ferry.codec`: it
imports nothing of Ferry, so that `ferry.store` may use it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def replace_durably(path: str | os.PathLike[str], payload: bytes) -> None:
    """Make `payload` the whole content of `path`, atomically and durably."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(payload)
        while view:  # os.write may write less than asked
            view = view[os.write(fd, view):]
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load_versioned(path: Path, version: int, remedy: str) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when there is no such file.

    ValueError when it is not JSON, not an object, or not of `version`; the
    message names the file and `remedy` (what the operator may do about it)."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); {remedy}") from None
    found = data.get("version") if isinstance(data, dict) else None
    if found != version:
        raise ValueError(f"{path} has version {found}, expected {version}")
    return data  # type: ignore[no-any-return]
