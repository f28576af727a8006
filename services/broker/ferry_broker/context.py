"""What every request handler needs: the store, the managers and the connection it serves.

The app builds one `BrokerContext` at start; the server gives each handler
the context, the `ConnInfo` of the connection the request came on, and the
request frame. Handlers hold no state of their own.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from ferry.store import MessageStore
from ferry.wire import Frame

from ferry_broker.config import BrokerConfig
from ferry_broker.consumer_offsets import ConsumerOffsetManager
from ferry_broker.consumers import ConsumerManager
from ferry_broker.durability import DurabilityWaiter
from ferry_broker.health import StoreHealth
from ferry_broker.hooks.delay import DelayHook
from ferry_broker.hooks.ttl import ExpiryFilter, TtlHook, TtlQueues
from ferry_broker.long_poll import LongPollManager
from ferry_broker.put_pipeline import DurabilityHook, PutPipeline, WakePullsHook
from ferry_broker.topics import TopicManager

TTL_QUEUES_FILE = Path("config") / "ttl_queues.json"


@dataclass(frozen=True)
class ConnInfo:
    """One client connection as handlers see it."""

    conn_id: int
    peer: str  # "host:port" of the client; stored as a message's born_host


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
    # Built from the parts above (the hooks need the context itself).
    pipeline: PutPipeline = field(init=False)
    expiry: ExpiryFilter = field(init=False)

    def __post_init__(self) -> None:
        ttl_queues = TtlQueues(self.config.data_path / TTL_QUEUES_FILE)
        self.expiry = ExpiryFilter(ttl_queues)
        # Before-put hooks run in this order, after-put hooks in reverse: pulls are
        # woken before the durability wait (as RocketMQ does).
        self.pipeline = PutPipeline(self, [
            DurabilityHook(self), WakePullsHook(self),
            DelayHook(self.topics, self.config.max_delay_ms), TtlHook(ttl_queues)])


Handler = Callable[[BrokerContext, ConnInfo, Frame], Awaitable[Frame | None]]
