"""Replication test helpers: real MessageStores in one process, linked over real TCP.

A `Master` is a store, its epoch log and a ReplicationServer on a free port of
127.0.0.1; a `Slave` is a store, its epoch log and a ReplicaFollower that records
what its callbacks got. Every store uses 4 MiB segments (both sides must agree).
"""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ferry.store import MessageIn, MessageStore, StoreConfig
from ferry.store.epochs import EpochLog
from ferry_broker.consumer_offsets import ConsumerOffsetManager
from ferry_broker.replication import ReplicaFollower, ReplicationServer
from ferry_broker.replication import protocol as p
from ferry_broker.replication.admission import SlaveAuth
from ferry_broker.replication.master import InSyncListener

CLUSTER, NAME = "ReplCluster", "broker-a"
SEGMENT_BYTES = 4 << 20
TOPICS = ("orders", "audit", "%RETRY%g1")


def store_config(root: Path, **kw: object) -> StoreConfig:
    base: dict[str, object] = dict(
        root_dir=str(root), commitlog_segment_bytes=SEGMENT_BYTES,
        max_message_bytes=256 * 1024, cq_entries_per_segment=1024, index_max_slots=1024,
        index_max_entries=16384, checkpoint_interval_ms=50, flush_interval_ms=20,
        warm_ahead_bytes=0)
    base.update(kw)
    return StoreConfig(**base)  # type: ignore[arg-type]


@dataclass
class Master:
    """A master store serving replication on `port`."""

    store: MessageStore
    epochs: EpochLog
    offsets: ConsumerOffsetManager   # what the links send as OFFSETS
    epoch: int = 1
    peers: set[int] = field(default_factory=lambda: {1, 2, 3})
    lag_bytes_max: int = 1 << 20
    server: ReplicationServer | None = None
    listener: InSyncListener | None = None   # the in-sync set keeper, if any
    auth: SlaveAuth | None = None  # judges a slave's AUTH frame and broker id (auth on)

    async def start(self, port: int = 0) -> None:
        self.server = ReplicationServer(
            self.store, self.epochs, cluster=CLUSTER, name=NAME, broker_id=0,
            epoch=lambda: self.epoch, is_peer=lambda i: i in self.peers,
            offsets=self.offsets, lag_bytes_max=self.lag_bytes_max,
            listener=self.listener, auth=self.auth)
        await self.server.start("127.0.0.1", port)

    @property
    def addr(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    def put(self, count: int, rng: random.Random, max_body: int = 4000) -> int:
        """Put `count` messages in one batch, wake the links; the new log end."""
        fill(self.store, count, rng, max_body)
        if self.server is not None:
            self.server.notify()
        return self.store.commit_log_max_offset


@dataclass
class Slave:
    """A slave store and its follower; `appended` and `offsets` record the callbacks."""

    store: MessageStore
    epochs: EpochLog
    broker_id: int = 1
    name: str = NAME
    appended: set[tuple[str, int]] = field(default_factory=set)
    offsets: list[bytes] = field(default_factory=list)
    follower: ReplicaFollower = field(init=False)

    def __post_init__(self) -> None:
        self.follower = ReplicaFollower(
            self.store, self.epochs, cluster=CLUSTER, name=self.name, broker_id=self.broker_id,
            on_append=self.appended.update, on_offsets=self.offsets.append)


def open_master(root: Path, epoch: int = 1) -> Master:
    store = MessageStore(store_config(root))
    epochs = EpochLog(str(root))
    if epochs.last is None or epochs.last[0] < epoch:
        epochs.append(epoch, store.commit_log_max_offset)
    return Master(store, epochs, ConsumerOffsetManager(root / "consumer_offsets.json"), epoch)


def open_slave(root: Path, broker_id: int = 1, **store_kw: object) -> Slave:
    return Slave(MessageStore(store_config(root, **store_kw)), EpochLog(str(root)), broker_id)


def fill(store: MessageStore, count: int, rng: random.Random, max_body: int = 4000) -> None:
    """Put `count` keyed messages on random queues in one batch."""
    store.put_batch([MessageIn(rng.choice(TOPICS), rng.randint(0, 2),
                               rng.randbytes(rng.randint(0, max_body)),
                               keys=f"k{rng.randint(0, 99)}", tags=rng.choice(["", "a"]))
                     for _ in range(count)])


def whole_log(store: MessageStore) -> bytes:
    parts, pos = [], store.commit_log_min_offset
    while chunk := store.read_log(pos, 1 << 20):
        parts.append(chunk)
        pos += len(chunk)
    return b"".join(parts)


def queue_ends(store: MessageStore) -> dict[tuple[str, int], int]:
    return {(t, q): store.max_offset(t, q) for t, qs in store.topic_queues().items() for q in qs}


async def until(cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll `cond` until true; fail after `timeout_s` (a hang, not a timing target)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.01)


def hello(broker_id: int = 1, *, epoch: int = 1, end: int = 0, cluster: str = CLUSTER,
          name: str = NAME, magic: int = p.MAGIC, version: int = p.VERSION,
          entries: list[p.Entry] | None = None) -> bytes:
    """The bytes of a HELLO frame (any field may be wrong on purpose)."""
    return b"".join(p.encode_hello(p.Hello(magic, version, broker_id, epoch, end, cluster,
                                           name, entries or [])))
