"""Most caught-up slave first: a broker's candidacy in its group's election (issue 9).

Each member publishes its position (last epoch of its EpochLog, commit-log
end) at `{etcd_prefix}replicas/{cluster}/{name}/{id}` under its election lease,
so the key vanishes with the member. When the leader key is free, a candidate
whose live sibling is strictly ahead declines it for at most
MAX_DECLINED_ROUNDS rounds in a row (a stuck sibling delays a takeover by a
bounded time only; fencing is the election's epoch and lease). In sync mode a
hard rule comes first: only in-sync set members may stand
(ferry_broker.insync), and only members count as ahead.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ferry_broker.insync import InSyncSet, may_lead

if TYPE_CHECKING:
    from ferry.routing.election import Election

    from ferry_broker.config import BrokerConfig

log = logging.getLogger(__name__)

#: Rounds with a free leader key that a candidate behind a live sibling sits out.
MAX_DECLINED_ROUNDS = 3
#: How often a member republishes its replica position.
PUBLISH_S = 1.0


class Candidacy:
    """Publishes this broker's position and decides whether it stands for master."""

    def __init__(self, config: BrokerConfig, position: Callable[[], tuple[int, int]]) -> None:
        self._config = config
        self._position = position  # (last epoch, commit-log end) of this store
        self._election: Election | None = None
        self._insync: InSyncSet | None = None
        #: Free-key rounds declined in a row (reset once a leader is seen).
        self.declined = 0
        self._published: tuple[int | None, tuple[int, int]] | None = None
        self._outside_logged = False

    def attach(self, election: Election, insync: InSyncSet | None) -> None:
        """The election to stand in (and, in sync mode, the in-sync set that gates it)."""
        self._election, self._insync = election, insync

    def _replica_key(self, election: Election, broker_id: int | str = "") -> bytes:
        cfg = self._config
        prefix = election.registry.prefix
        return f"{prefix}replicas/{cfg.cluster}/{cfg.name}/{broker_id}".encode()

    async def publish(self) -> None:
        """Put this broker's position under its election lease (once per change)."""
        election = self._election
        if election is None or election.lease_id is None:
            return
        state = (election.lease_id, self._position())
        if state == self._published:
            return
        epoch, end = state[1]
        value = json.dumps({"epoch": epoch, "end_offset": end}).encode()
        client = election.registry.client
        await client.put(self._replica_key(election, self._config.id), value,
                         lease=election.lease_id)
        self._published = state

    async def publish_loop(self) -> None:
        while True:
            try:
                await self.publish()
            except Exception as exc:  # etcd away, or our lease just ended: next round
                log.debug("could not publish the replica position: %s", exc)
            await asyncio.sleep(PUBLISH_S)

    async def eligible(self) -> bool:
        """Sync: only a member of the in-sync set; then decline a free leader key while
        a live sibling (of the set) is strictly ahead (bounded)."""
        election = self._election
        assert election is not None
        members: list[int] | None = None
        if self._insync is not None:
            allowed, members = await may_lead(election, self._insync.key, self._config.id)
            if not allowed:
                if not self._outside_logged:   # once per absence, not every round
                    log.warning("not standing for master: not in the in-sync set %s", members)
                    self._outside_logged = True
                return False
            self._outside_logged = False
        mine = self._position()
        try:
            await self.publish()
            kvs = await election.registry.client.get_prefix(self._replica_key(election))
        except Exception as exc:  # cannot compare: do not hold the group up
            log.warning("cannot read sibling positions (%s); standing anyway", exc)
            return True
        ahead = []
        for kv in kvs:
            sibling = kv.key.rsplit(b"/", 1)[-1].decode(errors="replace")
            if sibling == str(self._config.id) or (
                    members is not None and sibling not in {str(m) for m in members}):
                continue
            try:
                doc = json.loads(kv.value)
                pos = (int(doc["epoch"]), int(doc["end_offset"]))
            except (ValueError, KeyError, TypeError):
                continue
            if pos > mine:
                ahead.append((sibling, pos))
        if not ahead:
            self.declined = 0
            return True
        if self.declined >= MAX_DECLINED_ROUNDS:
            log.warning("standing for master although %s are ahead of %s: they did not "
                        "take over within %d rounds", ahead, mine, MAX_DECLINED_ROUNDS)
            self.declined = 0
            return True
        self.declined += 1
        log.info("not standing for master: %s ahead of %s (round %d)", ahead, mine,
                 self.declined)
        return False
