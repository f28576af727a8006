"""What every request handler needs: the store, the managers and the connection it serves.

The app builds one `BrokerContext` at start; the server gives each handler
the context, the `ConnInfo` of the connection the request came on, and the
request frame. Handlers hold no state of their own.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ferry.store import MessageStore
from ferry.telemetry import tracing
from ferry.wire import Frame

from ferry_broker.config import BrokerConfig
from ferry_broker.consumer_offsets import ConsumerOffsetManager
from ferry_broker.consumers import ConsumerManager
from ferry_broker.delivery_latency import DeliveryLatency
from ferry_broker.disk import DiskAlarm
from ferry_broker.durability import DurabilityWaiter
from ferry_broker.filters import FilterCache
from ferry_broker.health import StoreHealth
from ferry_broker.history_stats import HistoryStats
from ferry_broker.hooks.delay import DelayHook
from ferry_broker.hooks.replication import ReplicationNotifyHook, ReplicationWaitHook
from ferry_broker.hooks.trace import TraceHook
from ferry_broker.hooks.ttl import ExpiryFilter, TtlHook, TtlQueues
from ferry_broker.hooks.txn import TxnHook
from ferry_broker.limits import WireLimits
from ferry_broker.long_poll import LongPollManager
from ferry_broker.offset_resets import PendingResets
from ferry_broker.producers import ProducerManager, Push
from ferry_broker.put_pipeline import DurabilityHook, PutHook, PutPipeline, WakePullsHook
from ferry_broker.queue_locks import QueueLockTable
from ferry_broker.roles import RoleManager
from ferry_broker.topics import TopicManager
from ferry_broker.transactions import TxnStats
from ferry_broker.txn_batch import EndBatcher

if TYPE_CHECKING:  # auth.py imports the handler package, which imports this module
    from ferry_broker.auth import BrokerAuth

TTL_QUEUES_FILE = Path("config") / "ttl_queues.json"


def _cannot_push(frame: Frame) -> bool:
    return False


@dataclass(frozen=True)
class ConnInfo:
    """One client connection as handlers see it."""

    conn_id: int
    peer: str  # "host:port" of the client; stored as a message's born_host
    # Sends a one-way request frame to the client on this connection (the server's
    # CHECK_TRANSACTION); False when it cannot (closed, or the client does not read).
    push: Push = _cannot_push


@dataclass
class BrokerContext:
    """The broker's components, shared by every handler."""

    config: BrokerConfig
    store: MessageStore
    offsets: ConsumerOffsetManager
    consumers: ConsumerManager
    long_poll: LongPollManager
    topics: TopicManager
    durability: DurabilityWaiter
    health: StoreHealth = field(default_factory=StoreHealth)
    filters: FilterCache = field(default_factory=FilterCache)  # compiled PULL/HEARTBEAT filters
    auth: BrokerAuth | None = None  # request verification (FERRY_AUTH=on), else None
    histories: HistoryStats = field(default_factory=HistoryStats)  # replaced-history answers
    # Operator resets the group's members have not picked up yet (offset_resets.py).
    resets: PendingResets = field(default_factory=PendingResets)
    # Messages delivered per group and topic and how long they waited (delivery_latency.py).
    delivery: DeliveryLatency = field(default_factory=DeliveryLatency)
    # Built from the parts above (the hooks need the context itself).
    pipeline: PutPipeline = field(init=False)
    expiry: ExpiryFilter = field(init=False)
    producers: ProducerManager = field(init=False)
    txn_stats: TxnStats = field(init=False)
    txn_ends: EndBatcher = field(init=False)
    locks: QueueLockTable = field(init=False)
    roles: RoleManager = field(init=False)  # master or slave (issue 9); writes check it
    limits: WireLimits = field(init=False)  # connection admission and refusal counters
    disk: DiskAlarm = field(init=False)  # the disk high-water alarm (disk.py)

    def __post_init__(self) -> None:
        self.limits = WireLimits(self.config)
        self.disk = DiskAlarm(self.config, self.health)
        self.long_poll.on_refuse = self.limits.count
        ttl_queues = TtlQueues(self.config.data_path / TTL_QUEUES_FILE)
        self.expiry = ExpiryFilter(ttl_queues)
        self.producers = ProducerManager(self.config.consumer_expiry_ms)
        self.txn_stats = TxnStats()
        auth = self.auth
        self.roles = RoleManager(self.config, self.store, self.offsets, self.long_poll.notify,
                                 auth)
        # Before-put hooks run in this order, after-put hooks in reverse: pulls are
        # woken before the durability wait (as RocketMQ does). The txn hook goes
        # before the delay hook, so that a delayed half is refused, not scheduled.
        # Replication: slaves are woken first of all, the slave wait and the
        # leadership check come after the durability wait. A sync master's pulls see
        # records only once the in-sync slaves have them (handlers/pull.py), so there
        # pulls are woken last, after that wait. The tracing hook comes last of the core
        # (so it runs right after the write, before the waits): its `store` span marks
        # the write, not the ack. With tracing off (FERRY_TRACING=off) it is not there.
        core: list[PutHook] = [TxnHook(self.topics, self.txn_stats),
                               DelayHook(self.topics, self.config.max_delay_ms),
                               TtlHook(ttl_queues)]
        if tracing().enabled:  # set up by BrokerApp.start before the context is built
            core.append(TraceHook(self.config.name))
        durable = DurabilityHook(self.config, self.store, self.durability, self.health)
        wake = WakePullsHook(self.long_poll.notify)
        mode = self.config.replication
        hooks: list[PutHook]
        if mode == "none":
            hooks = [durable, wake, *core]
        elif mode == "async":
            hooks = [ReplicationWaitHook(self.config, self.roles), durable, wake, *core,
                     ReplicationNotifyHook(self.roles)]
        else:
            hooks = [wake, ReplicationWaitHook(self.config, self.roles), durable, *core,
                     ReplicationNotifyHook(self.roles)]
        self.pipeline = PutPipeline(self.store, self.health, self.roles, hooks)
        self.txn_ends = EndBatcher(self.pipeline)
        self.locks = QueueLockTable(self.config.lock_expiry_ms)
        # A member that unregisters or stops heart-beating loses its queue locks.
        self.consumers.on_leave.append(self.locks.drop_client)


Handler = Callable[[BrokerContext, ConnInfo, Frame], Awaitable[Frame | None]]
