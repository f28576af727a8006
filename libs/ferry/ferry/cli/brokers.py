"""`ferry broker list`: broker groups, their members, roles, epochs and replication lag.

The members and their registered roles come from namesrv (`GET /v1/brokers`,
what routes are built from); each member's own view (role, epoch, commit-log
end, its slaves or the master it follows) from its `/v1/stats` at its
`http_addr`. A slave's lag is what its master last heard from it (acked
offset vs the master's end), else what the slave itself knows (its end vs the
master's end it last saw). A member registered "master" under an older epoch
than its group's master is a dead master whose key has not expired yet: shown
as `master?` (routes ignore it). In a sync group, `in_sync` says whether the
member is in the in-sync set its master reports (only members may be elected);
"-" for async groups and lone brokers.
"""
from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import aiohttp

from ferry.auth.http import client_session
from ferry.client.core.namesrv import NamesrvClient

#: How long one broker's /v1/stats may take before it is shown unreachable.
STATS_TIMEOUT_S = 3.0
COLUMNS = ("group", "id", "role", "epoch", "addr", "end_offset", "lag_bytes", "in_sync",
           "state")


async def _stats(session: aiohttp.ClientSession, http_addr: str) -> dict[str, Any] | None:
    if not http_addr:
        return None
    try:
        async with session.get(f"http://{http_addr}/v1/stats") as resp:
            if resp.status != 200:
                return None
            doc = await resp.json()
            return doc if isinstance(doc, dict) else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def _rows(brokers: list[dict[str, Any]], stats: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """One row per member, grouped by broker group, ordered by id."""
    top_epoch: dict[str, int] = {}
    acked_lag: dict[tuple[str, int], int] = {}
    insync: dict[str, set[int]] = {}   # group -> the in-sync set its master reports
    for b, st in zip(brokers, stats, strict=True):
        group = f"{b['cluster']}/{b['name']}"
        if b.get("role") == "master":
            top_epoch[group] = max(top_epoch.get(group, 0), int(b.get("epoch", 0)))
        repl = (st or {}).get("replication") or {}
        for s in repl.get("slaves") or ():
            acked_lag[(group, int(s["broker_id"]))] = int(s["lag_bytes"])
        if repl.get("role") == "master" and isinstance(repl.get("insync"), dict):
            insync[group] = {int(m) for m in repl["insync"].get("members") or ()}
    rows = []
    for b, st in zip(brokers, stats, strict=True):
        group = f"{b['cluster']}/{b['name']}"
        repl = (st or {}).get("replication") or {}
        role = repl.get("role", b.get("role", "")) if st else b.get("role", "")
        epoch = int(repl.get("epoch", b.get("epoch", 0)))
        if role == "master" and epoch < top_epoch.get(group, 0):
            role = "master?"
        lag: Any = "-"
        state = "unreachable" if st is None else ""
        follower = repl.get("follower") or {}
        if (group, int(b["id"])) in acked_lag:
            lag = acked_lag[(group, int(b["id"]))]
        elif follower:
            lag = int(follower.get("lag_bytes", 0))
        if st is not None:
            if role == "master":
                state = f"writable, {len(repl.get('slaves') or ())} slave(s)" \
                    if repl.get("writable") else "not writable"
            elif role == "slave":
                state = ("following " + str(follower.get("master"))
                         if follower.get("connected") else "not linked")
            else:
                state = "no replication"
        rows.append({"group": group, "id": int(b["id"]), "role": role or "-", "epoch": epoch,
                     "addr": b.get("addr", ""),
                     "end_offset": repl.get("end_offset", "-") if st else "-",
                     "lag_bytes": lag,
                     "in_sync": ("yes" if int(b["id"]) in insync[group] else "no")
                     if group in insync else "-",
                     "state": state})
    rows.sort(key=lambda r: (r["group"], r["id"]))
    return rows


async def broker_list(args: argparse.Namespace) -> int:
    client = NamesrvClient(args.namesrv)
    try:
        listed = await client.call("GET", "/v1/brokers")
    finally:
        await client.close()
    brokers = [b for b in listed.get("brokers", []) if isinstance(b, dict)]
    timeout = aiohttp.ClientTimeout(total=STATS_TIMEOUT_S)
    # Signed like the namesrv call: with auth on, /v1/stats needs admin read.
    async with client_session(client.credentials, timeout=timeout) as session:
        stats = await asyncio.gather(*(_stats(session, b.get("http_addr", "")) for b in brokers))
    rows = _rows(brokers, list(stats))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    widths = {c: max([len(c)] + [len(str(r[c])) for r in rows]) for c in COLUMNS}
    print("  ".join(c.ljust(widths[c]) for c in COLUMNS).rstrip())
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS).rstrip())
    return 0
