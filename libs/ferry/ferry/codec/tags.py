"""The tag hash: what consume-queue entries carry so that pulls filter without the log."""
from __future__ import annotations

from crc32c import crc32c


def tag_hash(tag: str) -> int:
    """Stable hash of a tag: CRC32C of its UTF-8 plus one; "" -> 0 (no tag)."""
    if not tag:
        return 0
    return crc32c(tag.encode()) + 1


def tag_bytes_hash(tag_b: bytes) -> int:
    """`tag_hash` of a tag already encoded as UTF-8."""
    return crc32c(tag_b) + 1 if tag_b else 0
