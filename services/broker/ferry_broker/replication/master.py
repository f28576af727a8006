"""The master's side of replication: a TCP server that streams the commit log to slaves.

Each slave opens a link with HELLO (its id, the epoch it follows, its log end and
its epoch entries; with auth on an AUTH frame first, see admission.py). The master
checks the peer, computes where the two logs stop
agreeing (`divergence_point`), answers WELCOME (start there, plus its own epoch
entries) and streams DATA chunks from `read_log` whenever `notify()` says new
records were put or the slave is behind. The slave ACKs its new end after each
chunk (after its fsync in SYNC flush mode); `wait_replicated` resolves once
every slave of the in-sync set (`set_required`, kept by ferry_broker.insync)
acknowledged the offset. The server reports what changes that set to its
`listener`: a slave that caught up with the log end, a slave unlinked, slaves
that let a waiter time out. Without a listener (no set kept) a wait needs any one
linked slave's ACK, and fails at once when none is linked. An idle link gets a
HEARTBEAT with the master's end (a slave learns its lag and ACKs: the master learns
it lives). Beside the stream, each link sends the consumer-offset table: whole at
first, then what changed, about once a second (offsets_feed.py).

Garbage on the port (no HELLO first, bad magic, oversized or truncated frame, unknown
type) closes that connection with a warning; a HELLO from the wrong group, an unknown
peer or a linked one gets a REFUSE and a close. The server goes on either way.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Iterable
from typing import Protocol

from ferry.errors import FerryError, SlaveNotAvailableError
from ferry.log_limit import LogLimiter
from ferry.store import MessageStore
from ferry.store.epochs import EpochLog, divergence_point

from . import protocol as p
from .admission import (
    HANDSHAKE_TIMEOUT_MS,
    PendingPeers,
    SlaveAdmission,
    SlaveAuth,
    describe_failure,
    peer_of,
)
from .offsets_feed import OffsetsFeed, feed_offsets
from .waiters import AckWaiters
from .watch import until_first_ends, watch_idle

log = logging.getLogger(__name__)

#: An idle link gets a HEARTBEAT this often; the slave answers with an ACK.
HEARTBEAT_INTERVAL_MS = 500
#: A slave silent this long (no ACK, not even to heartbeats) is dropped.
LINK_IDLE_TIMEOUT_MS = 6_000
#: How often a link checks whether the consumer-offset table changed.
OFFSETS_INTERVAL_MS = 1_000
#: Connections past their first judgement (linked slaves, authenticated handshakes) served
#: at once, besides the admission.MAX_PENDING ones not judged yet.
MAX_CONNECTIONS = 32
#: A slave outside the in-sync set whose ACK is at most this far behind the log
#: end is reported caught up (the set keeper then makes writes wait for it until
#: it has the end of that moment: a margin, or it would never join under load).
CAUGHT_UP_LAG_BYTES = 1 << 20


class InSyncListener(Protocol):
    """What the in-sync set keeper hears from the server (all called on the loop)."""

    def caught_up(self, broker_id: int) -> None:
        """A slave outside the set acknowledged up to CAUGHT_UP_LAG_BYTES of the end."""

    def unlinked(self, broker_id: int) -> None:
        """A slave's link ended."""

    def lagging(self, broker_ids: list[int]) -> None:
        """These set slaves had not acknowledged a write when its wait timed out."""


class _Link:
    """One slave that passed the handshake: where its stream is and what it acknowledged."""

    __slots__ = ("broker_id", "addr", "writer", "next_offset", "acked_offset", "wake",
                 "sent_entries", "heard_at")

    def __init__(self, broker_id: int, addr: str, writer: asyncio.StreamWriter, start: int,
                 entries: list[p.Entry]) -> None:
        self.broker_id = broker_id
        self.addr = addr
        self.writer = writer
        self.next_offset = start  # the next byte of commit log to send
        self.acked_offset = start  # the slave's log agrees with ours up to here
        self.wake = asyncio.Event()
        self.sent_entries = entries
        self.heard_at = asyncio.get_running_loop().time()  # the slave's last frame


class ReplicationServer:
    """Listens on the replication port while this broker is master; one link per slave."""

    def __init__(self, store: MessageStore, epochs: EpochLog, *, cluster: str, name: str,
                 broker_id: int, epoch: Callable[[], int], is_peer: Callable[[int], bool],
                 offsets: OffsetsFeed, lag_bytes_max: int,
                 listener: InSyncListener | None = None, auth: SlaveAuth | None = None,
                 handshake_timeout_ms: int = HANDSHAKE_TIMEOUT_MS) -> None:
        self.store = store
        self._admission = SlaveAdmission(cluster=cluster, name=name, broker_id=broker_id,
                                         is_peer=is_peer, auth=auth)
        self._handshake_s = handshake_timeout_ms / 1000
        self._pending = PendingPeers()
        self.epochs = epochs
        self.cluster = cluster
        self.name = name
        self.broker_id = broker_id
        self._epoch = epoch
        self._offsets = offsets
        self.lag_bytes_max = lag_bytes_max
        self._links: dict[int, _Link] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._waiters = AckWaiters(on_timeout=self._timed_out)
        self._listener = listener
        #: The slaves whose ACKs a sync write waits for (the in-sync set's, without us).
        self._required: frozenset[int] = frozenset()
        #: Fewer required slaves than this: sync writes fail at once (min_insync_replicas - 1).
        self._min_slaves = 0
        # Anyone reaching the replication port can cause these lines: rate-limited per kind.
        self._limited = LogLimiter(log)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        """Listen on host:port (port 0: a free one, see `port`); TLS with `tls`."""
        # A TLS handshake is bounded like the AUTH and HELLO that follow it.
        self._server = await asyncio.start_server(
            self._on_connection, host, port, reuse_address=True, ssl=tls,
            ssl_handshake_timeout=self._handshake_s if tls is not None else None)
        log.info("replication server listening on %s:%d", host, self.port)

    @property
    def port(self) -> int:
        """The port listened on (after `start`)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Close the listener and every link; fail every replication waiter."""
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        self._waiters.fail_all("the replication server stopped")

    # -- what the broker calls -----------------------------------------------------------

    def notify(self) -> None:
        """New records were put: wake the streaming of every link."""
        for link in self._links.values():
            link.wake.set()

    async def wait_replicated(self, end_offset: int, timeout_ms: int, *,
                              enforce_min: bool = True) -> None:
        """Return once every required slave acknowledged `end_offset` (at once when none
        is required); SlaveNotAvailableError at once when fewer slaves are required than
        the minimum (unless not `enforce_min`: a joining slave's wait), or after
        `timeout_ms`."""
        if self._listener is None:
            return await self._wait_any(end_offset, timeout_ms)
        required = self._required
        if enforce_min and len(required) < self._min_slaves:
            raise SlaveNotAvailableError(
                f"the in-sync set has {len(required) + 1} member(s), fewer than "
                f"min_insync_replicas {self._min_slaves + 1}")
        if not required or self._covered() >= end_offset:
            return
        await self._waiters.wait(end_offset, timeout_ms)

    async def _wait_any(self, end_offset: int, timeout_ms: int) -> None:
        """No in-sync set kept: any one linked slave's ACK will do."""
        if not self._links:
            raise SlaveNotAvailableError("no slave is connected")
        if max(link.acked_offset for link in self._links.values()) >= end_offset:
            return
        await self._waiters.wait(end_offset, timeout_ms)

    def set_required(self, broker_ids: Iterable[int], min_slaves: int) -> None:
        """The slaves sync writes wait for from now on (waiting ones included)."""
        self._required = frozenset(broker_ids)
        self._min_slaves = min_slaves
        if len(self._required) < min_slaves:
            self._waiters.fail_all(f"the in-sync set has {len(self._required) + 1} member(s), "
                                   f"fewer than min_insync_replicas {min_slaves + 1}")
        else:
            self._waiters.acked(self._covered())

    @property
    def confirmed_offset(self) -> int:
        """The offset every required (in-sync) slave acknowledged; the log end when none
        is required (-1 while a required one is unlinked)."""
        return self._covered()

    def _covered(self) -> int:
        """The offset every required slave acknowledged (an unlinked one: nothing)."""
        links = self._links
        return min((links[i].acked_offset if i in links else -1 for i in self._required),
                   default=self.store.commit_log_max_offset)

    def _timed_out(self, end_offset: int) -> None:
        """A sync write's wait timed out: the required slaves below its end lag."""
        links = self._links
        late = sorted(i for i in self._required
                      if i not in links or links[i].acked_offset < end_offset)
        if late and self._listener is not None:
            try:
                self._listener.lagging(late)
            except Exception:
                log.exception("replication: the in-sync listener failed")

    def slaves(self) -> list[dict]:
        """Each connected slave: id, address, acknowledged offset, lag and whether it lags."""
        end = self.store.commit_log_max_offset
        out = []
        for link in sorted(self._links.values(), key=lambda lk: lk.broker_id):
            lag = max(0, end - link.acked_offset)
            out.append({"broker_id": link.broker_id, "addr": link.addr,
                        "acked_offset": link.acked_offset, "lag_bytes": lag,
                        "lagging": lag > self.lag_bytes_max,
                        "in_sync": link.broker_id in self._required})
        return out

    # -- one connection ------------------------------------------------------------------

    async def _on_connection(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = peer_of(writer)
        link: _Link | None = None
        try:
            if len(self._tasks) - len(self._pending) >= MAX_CONNECTIONS:
                self._limited.warning("too-many", "replication: refusing %s: %d connections open",
                                      peer, MAX_CONNECTIONS)
                return
            self._tasks.add(task)
            self._pending.add(task, peer)
            # One deadline for the whole handshake: a silent or trickling peer holds a
            # pending slot for at most the handshake timeout, or until newer ones push it out.
            link = await asyncio.wait_for(self._handshake(reader, writer, peer, task),
                                          self._handshake_s)
            if link is not None:
                await self._serve(link, reader)
        except (p.ReplicationProtocolError, asyncio.IncompleteReadError, TimeoutError) as exc:
            what = "slave link" if link is not None else "connection"
            self._limited.warning("closed", "replication %s from %s closed: %s", what, peer,
                             describe_failure(exc))
        except (ConnectionError, OSError) as exc:
            self._limited.info("lost", "replication link from %s lost: %s", peer, exc)
        except FerryError as exc:
            self._limited.log(logging.ERROR, "failed", "replication link from %s failed: %s", peer, exc)
        except Exception:
            self._limited.log(logging.ERROR, "crashed", "replication link from %s crashed; closing it",
                         peer, exc_info=True)
        except asyncio.CancelledError:
            # stop() cancels the handler; ending it normally keeps asyncio's stream
            # callback from logging the cancelled task as an error.
            pass
        finally:
            self._tasks.discard(task)
            self._pending.discard(task)
            if link is not None:
                self._drop(link)
            writer.close()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         peer: str, task: asyncio.Task[None]) -> _Link | None:
        """Read and judge AUTH and HELLO; answer REFUSE (None) or WELCOME (the new link)."""
        opening = await self._admission.read_opening(reader, lambda: self._pending.discard(task))
        self._pending.discard(task)
        hello, reason, start, epoch = opening.hello, opening.refusal, 0, self._epoch()
        end, entries = self.store.commit_log_max_offset, self.epochs.entries
        if hello is not None and reason is None:
            old = self._links.get(hello.broker_id)
            reason = self._admission.refusal(hello, epoch, old.addr if old else None)
            # min(): a slave's entries cannot move the point past its own end
            start = min(divergence_point(hello.entries, entries, end, hello.end_offset),
                        hello.end_offset)
            if reason is None and start < self.store.commit_log_min_offset:
                reason = (f"the logs agree up to {start}, but this master's log now starts "
                          f"at {self.store.commit_log_min_offset} (retention)")
        if hello is None or reason is not None:
            self._limited.warning("refused", "replication: refusing %s from %s: %s",
                                  f"broker {hello.broker_id}" if hello else "a peer", peer,
                                  reason)
            writer.writelines(p.encode_refuse(epoch, reason or "refused"))
            await writer.drain()
            return None
        link = _Link(hello.broker_id, peer, writer, start, entries)
        writer.writelines(p.encode_welcome(p.Welcome(epoch, start, end, entries)))
        self._links[hello.broker_id] = link
        log.info("replication: slave %d at %s linked; its log agrees up to %d (its end %d, "
                 "ours %d)", hello.broker_id, peer, start, hello.end_offset, end)
        return link

    async def _serve(self, link: _Link, reader: asyncio.StreamReader) -> None:
        """Stream to the slave and read its ACKs until either side ends the link."""
        await until_first_ends(self._stream(link), self._read_acks(link, reader),
                               watch_idle(lambda: link.heard_at, LINK_IDLE_TIMEOUT_MS, "slave"),
                               feed_offsets(self._offsets, link.writer, OFFSETS_INTERVAL_MS))

    async def _read_acks(self, link: _Link, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        while True:
            ftype, payload = await p.read_frame(reader)
            link.heard_at = loop.time()
            if ftype is p.FrameType.AUTH:
                continue  # a slave with credentials, to a master with auth off
            if ftype is not p.FrameType.ACK:
                raise p.ReplicationProtocolError(f"a slave sent {ftype.name}")
            offset = p.decode_offset("ACK", payload)
            if offset > link.next_offset:
                raise p.ReplicationProtocolError(
                    f"the slave acknowledged {offset}, past what it was sent ({link.next_offset})")
            if offset > link.acked_offset:
                link.acked_offset = offset
                if self._listener is None:
                    self._waiters.acked(offset)
                elif link.broker_id in self._required:
                    self._waiters.acked(self._covered())
            if (link.broker_id not in self._required and self._listener is not None
                    and self.store.commit_log_max_offset - offset <= CAUGHT_UP_LAG_BYTES):
                self._listener.caught_up(link.broker_id)

    async def _stream(self, link: _Link) -> None:
        """Send the log from the slave's position on, then heartbeats when idle."""
        writer = link.writer
        while True:
            link.wake.clear()  # before reading the end: a notify() after this is not lost
            end = self.store.commit_log_max_offset
            self._send_epochs(link)
            if link.next_offset < end:
                # read_log copies at most CHUNK_BYTES from the page cache under the
                # store lock: short enough for the loop (puts run here too).
                chunk = self.store.read_log(link.next_offset, p.CHUNK_BYTES)
                writer.writelines(p.encode_data(link.next_offset, end, chunk))
                link.next_offset += len(chunk)
                await writer.drain()
                continue
            try:
                await asyncio.wait_for(link.wake.wait(), HEARTBEAT_INTERVAL_MS / 1000)
            except TimeoutError:
                writer.writelines(p.encode_offset(p.FrameType.HEARTBEAT, end))
                await writer.drain()

    def _send_epochs(self, link: _Link) -> None:
        """Tell the slave about a new term (an entry appended while the link is up)."""
        entries = self.epochs.entries
        if entries != link.sent_entries:
            link.writer.writelines(p.encode_epochs(entries))
            link.sent_entries = entries

    def _drop(self, link: _Link) -> None:
        if self._links.get(link.broker_id) is link:
            del self._links[link.broker_id]
            log.info("replication: slave %d at %s unlinked", link.broker_id, link.addr)
            if self._listener is None:
                if not self._links:
                    self._waiters.fail_all("no slave is connected")
            else:
                # (Waiters for it go on waiting: the set keeper removes it from the
                # set in etcd first, then from `set_required`, which releases them.)
                try:
                    self._listener.unlinked(link.broker_id)
                except Exception:
                    log.exception("replication: the in-sync listener failed")

