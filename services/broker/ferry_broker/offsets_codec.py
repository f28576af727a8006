"""The two byte formats of the committed-offset table: its file, and the batches a master
sends its slaves (OFFSETS frames, docs/replication.md).

File (version 1; `histories` and `owners` absent when empty)::

    {"version": 1, "offsets": {"<group>": {"<topic>": {"<queue_id>": <offset>}}},
     "histories": {... same nesting ...: "<history id>"},
     "owners": {... same nesting ...: "<access key>"}}

`histories` (issue 16) holds the history id of the record before each committed
offset, as the consumer sent it. `owners` (issue 24) names the identity whose commit
created each entry (auth on): what its per-identity limit counts. A reader that
predates `owners` ignores it.

Replication batch (version 2)::

    {"version": 2, "entries": [[group, topic, queue_id, offset, hist|null, owner|null], ...]}

A batch carries whole entries, each independent of the others: a slave applies each
batch as it arrives. `encode_batches` cuts a list of entries into batches of at most
BATCH_ENTRIES entries, each far below the frame limit (names, history ids and access
keys are bounded); a batch that would still exceed `max_bytes` is split again, never
cut short. Everything here is pure: the master encodes in a worker thread.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import NamedTuple, TypeVar

from ferry.errors import StoreError

FILE_VERSION = 1
BATCH_VERSION = 2
#: Entries in one replication batch: about 300 bytes each at most (names of 127
#: characters, a 32-character history id, a 64-character access key), under 1 MiB.
BATCH_ENTRIES = 2048

OffsetKey = tuple[str, str, int]
V = TypeVar("V")


class Entry(NamedTuple):
    """One committed offset: immutable, so a shallow copy of the table is a snapshot."""

    offset: int
    hist: str | None    # the history of the record before the offset (issue 16)
    owner: str | None   # the identity whose commit created the entry (auth on)
    version: int        # the table version of its last change (0: loaded from the file)


Table = dict[OffsetKey, Entry]
#: An entry as a batch carries it (no version: the receiver gives its own).
Change = tuple[OffsetKey, int, str | None, str | None]


# -- the file ------------------------------------------------------------------------------


def decode_file(raw: bytes) -> Table:
    """A table from the file's format; StoreError when it is not that format."""
    try:
        doc = json.loads(raw)
        if doc.get("version") != FILE_VERSION:
            raise ValueError(f"unknown version {doc.get('version')!r}")
        return {key: Entry(offset, hist, owner, 0) for key, offset, hist, owner in _unnest(doc)}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StoreError(f"not a consumer-offset table: {exc}") from exc


def _unnest(doc: dict) -> list[Change]:
    hists = _flat(doc.get("histories", {}), str)
    owners = _flat(doc.get("owners", {}), str)
    return [(key, offset, hists.get(key), owners.get(key))
            for key, offset in _flat(doc["offsets"], int).items()]


def _flat(nested: dict, kind: type[V]) -> dict[OffsetKey, V]:
    return {(group, topic, int(qid)): kind(value)  # type: ignore[call-arg]
            for group, topics in nested.items()
            for topic, queues in topics.items()
            for qid, value in queues.items()}


def _nest(table: Mapping[OffsetKey, V]) -> dict[str, dict[str, dict[str, V]]]:
    nested: dict[str, dict[str, dict[str, V]]] = {}
    for (group, topic, qid), value in table.items():
        nested.setdefault(group, {}).setdefault(topic, {})[str(qid)] = value
    return nested


def encode_file(table: Table) -> bytes:
    """The file content of a table: compact JSON, keys sorted."""
    doc: dict[str, object] = {
        "version": FILE_VERSION, "offsets": _nest({k: e.offset for k, e in table.items()})}
    hists = {k: e.hist for k, e in table.items() if e.hist is not None}
    if hists:
        doc["histories"] = _nest(hists)
    owners = {k: e.owner for k, e in table.items() if e.owner is not None}
    if owners:
        doc["owners"] = _nest(owners)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


# -- replication batches -------------------------------------------------------------------


def encode_batches(entries: Sequence[tuple[OffsetKey, Entry]], max_bytes: int) -> list[bytes]:
    """`entries` as batches of at most BATCH_ENTRIES, each under `max_bytes` bytes."""
    out: list[bytes] = []
    for start in range(0, len(entries), BATCH_ENTRIES):
        _encode_into(out, entries[start:start + BATCH_ENTRIES], max_bytes)
    return out


def _encode_into(out: list[bytes], part: Sequence[tuple[OffsetKey, Entry]],
                 max_bytes: int) -> None:
    raw = json.dumps({"version": BATCH_VERSION,
                      "entries": [[g, t, q, e.offset, e.hist, e.owner] for (g, t, q), e in part]},
                     separators=(",", ":")).encode()
    if len(raw) <= max_bytes:
        out.append(raw)
    elif len(part) > 1:  # split, never cut
        half = len(part) // 2
        _encode_into(out, part[:half], max_bytes)
        _encode_into(out, part[half:], max_bytes)
    else:
        raise StoreError(f"one consumer-offset entry encodes to {len(raw)} bytes, over "
                         f"{max_bytes}")


def decode_changes(raw: bytes) -> list[Change]:
    """The entries of a replication batch, or of a whole file (a master from before
    issue 24 sends its file); StoreError for anything else."""
    try:
        doc = json.loads(raw)
        version = doc.get("version")
        if version == FILE_VERSION:
            return _unnest(doc)
        if version != BATCH_VERSION:
            raise ValueError(f"unknown version {version!r}")
        out: list[Change] = []
        for group, topic, qid, offset, hist, owner in doc["entries"]:
            if not (isinstance(group, str) and isinstance(topic, str) and type(qid) is int
                    and type(offset) is int and isinstance(hist, str | None)
                    and isinstance(owner, str | None)):
                raise ValueError(f"a bad entry {[group, topic, qid, offset, hist, owner]!r}")
            out.append(((group, topic, qid), offset, hist, owner))
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StoreError(f"not a consumer-offset batch: {exc}") from exc
