"""The put pipeline: every way a message enters the store, and the hooks around it.

SEND → parse → before-put hooks in order → store → after-put hooks in reverse
→ acknowledge. Before-put hooks are synchronous: per-connection order depends
on nothing awaiting between a request's arrival and its store write. They may
redirect a flagged message (delay → `%SCHEDULE%`) or note something about it
(TTL). After-put hooks wake long polls and the replication links, wait for
durability, then (sync replication) for a slave, and check that the broker
still leads before the ack (`hooks/replication.py`; the role is checked first,
in `_check_writable`, before anything is stored).

Two inputs share the after-put side:
- `put_encoded`: a SEND batch with no hooked flag, written as it came (the fast
  path: no object per message; entries that carry a hooked flag anyway are
  refused by the store, since the frame did not announce them);
- `put_messages`: decoded messages (a flagged SEND, DELIVER_DUE, SEND_BACK),
  which pass through the before-put hooks first.

New behaviour on the way into the store is a hook here, not a branch in a handler.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ferry.codec import HOOKED_FLAGS, REAL_QUEUE_ID, REAL_TOPIC
from ferry.errors import DiskFullError, FlushTimeoutError, StoreError
from ferry.store import BatchPutResult, MessageIn, PutResult, encode_properties

if TYPE_CHECKING:
    from ferry.store import MessageStore

    from ferry_broker.config import BrokerConfig
    from ferry_broker.durability import DurabilityWaiter
    from ferry_broker.health import StoreHealth
    from ferry_broker.roles import RoleManager


@dataclass(slots=True)
class PutBatch:
    """Decoded messages of one request on their way into the store.

    `topic`/`queue_id` are where the request asked to write; a hook that
    redirects message i replaces `messages[i]` (another topic or queue) and the
    answer then reports -1 as its offset in the asked queue.
    """

    topic: str
    queue_id: int
    messages: list[MessageIn]


@dataclass(slots=True)
class PutDone:
    """What a put wrote, as the after-put hooks see it."""

    queues: set[tuple[str, int]]   # every (topic, queue) that got a message
    end_offset: int                # just past the last record written
    results: list[PutResult] | None = None   # per message (decoded puts only)
    batch: BatchPutResult | None = None       # the fast path's result
    extra: dict[str, object] = field(default_factory=dict)
    messages: list[MessageIn] | None = None   # what was written (decoded puts only)
    # The fast path's SEND body, topic and queue when its frame announced TRACED
    # (None otherwise: the tracing hook then has nothing to look at).
    traced_body: tuple[bytes | memoryview, str, int] | None = None


def redirected(msg: MessageIn, props: dict[str, str], topic: str, queue_id: int,
               keys: str | None = None) -> MessageIn:
    """`msg` as a hook stores it in an internal topic: the same id and parts (its keys
    replaced when given), its real topic and queue in its properties."""
    props = {**props, REAL_TOPIC: msg.topic, REAL_QUEUE_ID: str(msg.queue_id)}
    return msg._replace(topic=topic, queue_id=queue_id,
                        keys=msg.keys if keys is None else keys,
                        properties=encode_properties(props))


class PutHook:
    """A step of the pipeline; the defaults do nothing."""

    #: True for a hook whose `after_put` does nothing for a fast-path put that announced
    #: no TRACED entry (`PutDone.traced_body` None): the pipeline skips it there, which
    #: saves a coroutine per request on the common path.
    traced_only: bool = False

    def before_put(self, batch: PutBatch) -> None:
        """Inspect or redirect decoded messages; raise a FerryError to refuse the request."""

    async def after_put(self, done: PutDone) -> None:
        """Runs once the messages are in the store (in reverse hook order)."""


class WakePullsHook(PutHook):
    """Wakes the long polls parked on every queue that got a message."""

    def __init__(self, notify: Callable[[str, int], object]) -> None:
        self._notify = notify  # the long-poll manager's

    async def after_put(self, done: PutDone) -> None:
        for topic, queue_id in done.queues:
            self._notify(topic, queue_id)


class DurabilityHook(PutHook):
    """Sync-flush brokers answer only once the store has fsynced the last record."""

    def __init__(self, config: BrokerConfig, store: MessageStore, durability: DurabilityWaiter,
                 health: StoreHealth) -> None:
        self._sync = config.flush_mode == "sync"
        self._timeout_ms = config.flush_timeout_ms
        self._store, self._durability, self._health = store, durability, health

    async def after_put(self, done: PutDone) -> None:
        if not self._sync:
            return
        try:
            # The flush starts once this loop turn's puts are in (durability.py).
            store = self._store
            await self._durability.wait(store.wait_durable(done.end_offset, start=False),
                                        store.start_flush)
        except FlushTimeoutError:
            raise FlushTimeoutError(
                f"stored but not flushed within {self._timeout_ms} ms") from None
        except StoreError as exc:  # the flush thread failed: stored, never durable here
            raise self._health.unavailable(exc) from None


class PutPipeline:
    """Runs the hooks around the store's two put calls."""

    def __init__(self, store: MessageStore, health: StoreHealth, roles: RoleManager,
                 hooks: Sequence[PutHook]) -> None:
        self._store, self._health, self._roles = store, health, roles
        self.hooks = list(hooks)
        self._after = [h for h in reversed(self.hooks)
                       if type(h).after_put is not PutHook.after_put]
        self._before = [h for h in self.hooks if type(h).before_put is not PutHook.before_put]
        self._after_untraced = [h for h in self._after if not h.traced_only]

    def _check_writable(self) -> None:
        """Refuse a write before it reaches the store: not the master, a stalled store, or
        a disk at its high-water mark (disk.py).

        The role check is one property read per request (never per message)."""
        if not self._roles.writable:
            raise self._roles.not_master()
        health = self._health
        if health.stalled is not None:  # acknowledging now would promise nothing
            raise health.unavailable(StoreError(health.stalled), sticky=False)
        if health.full is not None:
            raise DiskFullError(health.full)

    async def put_encoded(self, topic: str, queue_id: int, body: bytes | memoryview,
                          born_host: str, max_messages: int,
                          traced: bool = False) -> BatchPutResult:
        """Store a SEND body as it came (no hooked flag announced), then the after hooks.

        `traced`: the frame announced MessageFlag.TRACED (some entry carries trace
        context): the body is handed to the after-put hooks for the tracing hook."""
        self._check_writable()
        try:
            res = self._store.put_encoded_batch(topic, queue_id, body, born_host=born_host,
                                              max_messages=max_messages,
                                              refuse_flags=HOOKED_FLAGS)
        except (StoreError, OSError) as exc:
            # A failed or closed store: retriable, so the producer sends elsewhere.
            raise self._health.unavailable(exc) from None
        if traced:
            done = PutDone({(topic, queue_id)}, res.end_offset, batch=res,
                           traced_body=(body, topic, queue_id))
            hooks = self._after
        else:
            done = PutDone({(topic, queue_id)}, res.end_offset, batch=res)
            hooks = self._after_untraced
        for hook in hooks:
            await hook.after_put(done)
        return res

    def prepare(self, batch: PutBatch) -> None:
        """Run the before-put hooks (synchronously: nothing may await before the store)."""
        for hook in self._before:
            hook.before_put(batch)

    async def put_messages(self, batch: PutBatch) -> list[PutResult]:
        """Run the before hooks, store the (possibly redirected) messages, the after hooks."""
        self.prepare(batch)
        return await self.store_prepared(batch.messages)

    async def store_prepared(self, messages: list[MessageIn]) -> list[PutResult]:
        """Store messages the before hooks have seen, then run the after hooks."""
        results, done = self.write_prepared(messages)
        await self.after_put(done)
        return results

    def write_prepared(self, messages: list[MessageIn]) -> tuple[list[PutResult], PutDone]:
        """The synchronous half of `store_prepared`: one store write, no after hooks yet.

        For a caller that must act between the write and the first await (the
        END_TRANSACTION group commit); it then awaits `after_put(done)`.
        """
        self._check_writable()
        try:
            results = self._store.put_batch(messages)
        except (StoreError, OSError) as exc:
            raise self._health.unavailable(exc) from None
        queues = {(m.topic, m.queue_id) for m in messages}
        return results, PutDone(queues, max(r.end_offset for r in results), results=results,
                                messages=messages)

    async def after_put(self, done: PutDone) -> None:
        """Run the after-put hooks of a write (in reverse hook order)."""
        for hook in self._after:
            await hook.after_put(done)
