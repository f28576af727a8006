"""The record of a group's offset resets in etcd (issue 25): who moved which offsets when.

One key per reset, `{prefix}offset-resets/{group}/{at_ms:016d}-{id}`, so that
concurrent resets never overwrite each other; the value is the reset as JSON (who,
when, topic, target and each queue's from/to). A group keeps its newest
`MAX_RESETS_KEPT` records: older keys are deleted as new ones are added.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

from ferry.names import validate_group
from ferry.routing.registry import EtcdRegistry

#: Reset records kept per group (the newest).
MAX_RESETS_KEPT = 50


def _prefix(registry: EtcdRegistry, group: str) -> bytes:
    return f"{registry.prefix}offset-resets/{validate_group(group)}/".encode()


async def add_reset(registry: EtcdRegistry, group: str, record: dict[str, Any]) -> None:
    """Store one reset record (it must carry `at_ms`) and drop the group's oldest ones
    beyond MAX_RESETS_KEPT."""
    prefix = _prefix(registry, group)
    key = prefix + f"{int(record['at_ms']):016d}-{uuid.uuid4().hex[:8]}".encode()
    await registry.client.put(key, json.dumps(record, sort_keys=True).encode())
    keys = sorted(kv.key for kv in await registry.client.get_prefix(prefix))
    for old in keys[:-MAX_RESETS_KEPT]:
        await registry.client.delete(old)


async def list_resets(registry: EtcdRegistry, group: str) -> list[dict[str, Any]]:
    """The group's reset records, newest first."""
    kvs = sorted(await registry.client.get_prefix(_prefix(registry, group)),
                 key=lambda kv: kv.key, reverse=True)
    out = []
    for kv in kvs:
        try:
            out.append(json.loads(kv.value))
        except ValueError:
            continue   # not ours to fix; the rest still show
    return out
