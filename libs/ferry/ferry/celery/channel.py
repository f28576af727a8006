"""The kombu channel and QoS of the `ferry://` transport: kombu's calls → the transport's.

kombu's virtual transport calls a channel's `_put`, `_get`, `_purge`, ... and
its QoS's `ack` / `reject`; here each becomes a call on the connection (the
`ferry.celery.transport.Transport`, seen through `QueueBackend` so this module
does not import it), which does the Ferry side.
"""
from __future__ import annotations

from typing import Any, Protocol

from kombu.transport import virtual
from kombu.transport.base import to_rabbitmq_queue_arguments

from ferry.celery.fanout import FanoutChannel, direct_route
from ferry.celery.feed import Settlement
from ferry.celery.naming import FERRY_PRIORITIES


class QueueBackend(Protocol):
    """What a channel needs from its connection (the transport)."""

    def declare_queue(self, queue: str, priority_levels: int | None = None,
                      auto_delete: bool = False) -> None: ...
    def has_topic(self, queue: str) -> bool: ...
    def publish(self, queue: str, message: dict[str, Any]) -> None: ...
    def take(self, queue: str) -> dict[str, Any]: ...
    def lag(self, queue: str) -> int: ...
    def purge(self, queue: str) -> int: ...
    def open_feed(self, queue: str) -> Any: ...
    def cancel_feed(self, queue: str) -> None: ...
    def settle(self, tag: str, outcome: Settlement) -> None: ...


class QoS(virtual.QoS):
    """kombu's unacked-message book, settling each outcome with the record's feed."""

    restore_at_shutdown = False   # never put back: uncommitted offsets are redelivered

    def ack(self, delivery_tag: str) -> None:
        self.channel.connection.settle(delivery_tag, Settlement.ACK)
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self.channel.connection.settle(delivery_tag,
                                       Settlement.REQUEUE if requeue else Settlement.DROP)
        self._quick_ack(delivery_tag)

    def restore_unacked(self) -> list[Any]:
        # basic_recover(requeue=True): hand every unacked message out again.
        self._flush()
        for tag in list(self._delivered):
            self.channel.connection.settle(tag, Settlement.REQUEUE)
        self._delivered.clear()
        return []


class Channel(FanoutChannel, virtual.Channel):
    """A kombu channel whose queues are Ferry topics."""

    QoS = QoS
    do_restore = False
    connection: QueueBackend

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._no_ack: set[str] = set()   # queues consumed with no_ack here
        super().__init__(*args, **kwargs)

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        # A queue declared with a max priority (Celery's `task_queue_max_priority`,
        # kombu's `Queue(max_priority=...)`) gets a topic with Ferry's priority levels.
        arguments = kwargs.get("arguments") or {}
        levels = FERRY_PRIORITIES if arguments.get("x-max-priority") else None
        self.connection.declare_queue(queue, levels, bool(kwargs.get("auto_delete")))

    def prepare_queue_arguments(self, arguments: Any, **kwargs: Any) -> Any:
        # kombu's Queue options (max_priority, expires, ...) as RabbitMQ's x- arguments.
        return to_rabbitmq_queue_arguments(arguments, **kwargs)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return self.connection.has_topic(queue)

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self.connection.publish(queue, message)

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        payload = self.take_from(queue)
        if queue in self._no_ack:   # acknowledged as it is delivered (AMQP's no_ack)
            self.connection.settle(payload["properties"]["delivery_tag"], Settlement.ACK)
        return payload

    def _size(self, queue: str) -> int:
        return self.connection.lag(queue)

    def _purge(self, queue: str) -> int:
        return self.connection.purge(queue)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        pass   # a durable queue's topic stays (`ferry topic delete`); auto-delete: basic_cancel

    def basic_consume(self, queue: str, no_ack: bool, callback: Any, consumer_tag: str,
                      **kwargs: Any) -> Any:
        # A no_ack consumer (kombu's mailbox reply queue) never acks: its records are
        # committed as they are taken, or the next consumer of the queue (the caller's
        # next `inspect()`, same reply queue) would get the last reply again.
        if no_ack:
            self._no_ack.add(queue)
        else:
            self._no_ack.discard(queue)
        self.open_queue(queue)
        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> None:
        queue = self._tag_to_queue.get(consumer_tag)
        super().basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:   # its last consumer here
            self.connection.cancel_feed(queue)

    def _lookup(self, exchange: str, routing_key: str, default: str | None = None) -> list[str]:
        # Bindings live in each process's memory: a direct exchange this process has
        # no binding for routes by Celery's convention (routing key = queue name).
        queues: list[str] = super()._lookup(exchange, routing_key, default)
        if not queues and routing_key and self.typeof(exchange).type == "direct":
            return [direct_route(exchange, routing_key)]
        return queues
