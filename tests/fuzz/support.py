"""What the fuzz tests measure of a service process."""
from __future__ import annotations

from pathlib import Path


def rss_anon_bytes(pid: int) -> int:
    """The process's anonymous resident memory (heap): what a leak grows.

    RssAnon leaves out file pages (the store's mapped segments), which the
    kernel may keep or drop and which are not the process's own allocations.
    """
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RssAnon in /proc/{pid}/status")
