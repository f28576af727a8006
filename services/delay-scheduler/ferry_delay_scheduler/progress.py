"""The progress file: how far recovery may trust the wheel's files, and what was taken.

`<data_dir>/progress.json`, replaced atomically (write a temporary file,
fdatasync, rename, fsync the directory) about once a second:

- `bucketed_through`: local queue offset; every local record below it has its
  bucket entry durable, so recovery re-derives entries only from here on;
- `closed_below`: the first wheel bucket not closed;
- `sources`: per "<broker>/<queue_id>" of %SCHEDULE%, the next broker queue
  offset to take (taken = durable in the local log). Pulling resumes from the
  larger of this and the broker's committed offset, so a commit lost in a
  crash does not take a record twice.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ferry.atomic_file import load_versioned, replace_durably

PROGRESS_FILE = "progress.json"
PROGRESS_VERSION = 1


@dataclass
class Progress:
    bucketed_through: int = 0
    closed_below: int = 0
    sources: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps({"version": PROGRESS_VERSION, "bucketed_through": self.bucketed_through,
                           "closed_below": self.closed_below, "sources": self.sources},
                          sort_keys=True).encode()


def source_key(broker: str, queue_id: int) -> str:
    return f"{broker}/{queue_id}"


def load_progress(root: Path) -> Progress | None:
    """The saved progress, or None for a new data directory."""
    data = load_versioned(root / PROGRESS_FILE, PROGRESS_VERSION,
                          "restore it or remove the data directory")
    if data is None:
        return None
    return Progress(int(data["bucketed_through"]), int(data["closed_below"]),
                    {str(k): int(v) for k, v in data.get("sources", {}).items()})


def save_progress(root: Path, progress: Progress) -> None:
    """Replace the progress file atomically and durably."""
    replace_durably(root / PROGRESS_FILE, progress.to_json())
