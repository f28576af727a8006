"""The checkpoint file: where each broker's scan stands and which halves are open.

`<data_dir>/checkpoint.json`, replaced atomically (temporary file, fdatasync,
rename, fsync of the directory) every `checkpoint_interval_ms` when something
changed, and at a clean stop. One JSON object (schema in docs/transactions.md):

    {"version": 1, "saved_ms": int, "epoch": int,
     "counters": {name: int, ...},
     "brokers": {"<broker name>": {
         "half_next": int,            # next %HALF% queue-0 offset to read
         "op_next": int,              # next %OP% queue-0 offset to read
         "half_hist": str | null,     # history id of the record before half_next
         "op_hist": str | null,       # history id of the record before op_next
         "open": [[msg_id, group, topic, half_offset, store_ms, immunity_ms,
                   checks, next_check_ms, prev_hist], ...],
         "early_ops": {msg_id: [half_offset, state], ...},
         "op_marks": [[half_offset, op_offset, prev_hist], ...]}},
     "discarded": [{msg_id, state, group, broker, topic, half_offset, store_ms,
                    checks, discarded_ms}, ...]}

Everything in it is one consistent snapshot of the book (taken in one event
loop turn), so a restart resumes each scan exactly where the snapshot stood:
records after it are pulled again, and the book skips none and counts none twice.
`epoch` is the election epoch of the term the book's state comes from: a new
term trusts the file only when it is the epoch just before (leading.py); a
file without it (from before leadership) counts as epoch 0.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ferry.atomic_file import load_versioned, replace_durably

CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_VERSION = 1


def encode(doc: dict[str, Any], epoch: int = 0) -> bytes:
    return json.dumps({"version": CHECKPOINT_VERSION, "saved_ms": int(time.time() * 1000),
                       "epoch": epoch, **doc}, separators=(",", ":")).encode()


def load(root: Path) -> dict[str, Any] | None:
    """The saved checkpoint document, or None for a new data directory."""
    return load_versioned(root / CHECKPOINT_FILE, CHECKPOINT_VERSION,
                          "restore it or remove the data directory (the checker then "
                          "rescans from the start)")


def save(root: Path, payload: bytes) -> None:
    """Replace the checkpoint atomically and durably (`payload` from `encode`)."""
    replace_durably(root / CHECKPOINT_FILE, payload)
