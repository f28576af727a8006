"""The slave's side of replication: follow a master's commit log into the local store.

`follow(addr, epoch, master_id)` starts a task that connects, sends HELLO (its log end
and epoch entries; with credentials, an AUTH frame first that signs it for that master),
and on WELCOME truncates its log to the point where it agrees
with the master (a returning old master drops the tail of its own term), makes
its epoch log equal the master's, then appends each DATA chunk as it is
(`append_replicated`; off the event loop in SYNC flush mode, where it waits for
the fsync) and ACKs its new end. A lost link, a REFUSE or a bad frame is logged and
retried with back-off until `stop()` or the next `follow()`.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable

from ferry.auth.credentials import Credentials
from ferry.auth.signing import sign_repl
from ferry.auth.tls import client_context_from_env
from ferry.errors import FerryError
from ferry.store import FlushMode, MessageStore
from ferry.store.epochs import EpochLog
from ferry.tasks import cancel_and_wait

from . import protocol as p
from .link import LinkProtocol
from .watch import until_first_ends, watch_idle

log = logging.getLogger(__name__)

#: Back-off between connection attempts: doubles from the first to the last.
RETRY_FIRST_MS = 100
RETRY_MAX_MS = 2_000
#: A master silent this long (it heartbeats every 500 ms) is taken for dead.
MASTER_IDLE_TIMEOUT_MS = 3_000
#: Connecting and the HELLO/WELCOME exchange must finish within this.
CONNECT_TIMEOUT_MS = 3_000


class _Refused(Exception):
    """The master answered REFUSE."""


class ReplicaFollower:
    """Keeps the local store a copy of one master's commit log while following it."""

    def __init__(self, store: MessageStore, epochs: EpochLog, *, cluster: str, name: str,
                 broker_id: int, on_append: Callable[[set[tuple[str, int]]], None],
                 on_offsets: Callable[[bytes], None],
                 credentials: Credentials | None = None) -> None:
        self.store = store
        #: This broker's identity: signs an AUTH frame after the HELLO (None: no AUTH).
        self.credentials = credentials
        #: TLS to the master's replication port (FERRY_TLS_CA); None: plain TCP.
        self.tls = client_context_from_env()
        self.epochs = epochs
        self.cluster = cluster
        self.name = name
        self.broker_id = broker_id
        self._on_append = on_append
        self._on_offsets = on_offsets
        self._master: str | None = None
        self._master_id = -1  # the broker id of the master followed (an AUTH names it)
        self._epoch = 0
        self._master_end = 0
        self._connected = False
        self._linked = False
        self._heard_at = 0.0  # loop time of the master's last frame
        self._master_entries: list[p.Entry] = []
        self._task: asyncio.Task[None] | None = None
        self._in_thread: asyncio.Future[int] | None = None  # store work off the loop

    async def follow(self, master_repl_addr: str, epoch: int, master_id: int) -> None:
        """(Re)start following `master_repl_addr` ("host:port"), broker `master_id`, the
        master of `epoch`."""
        if (self._task is not None and not self._task.done()
                and (self._master, self._epoch, self._master_id)
                == (master_repl_addr, epoch, master_id)):
            return
        await self.stop()
        self._master, self._epoch, self._master_id = master_repl_addr, epoch, master_id
        self._task = asyncio.create_task(self._run(master_repl_addr, epoch))

    async def stop(self) -> None:
        """Stop following (the local store is left as it is)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self._in_thread is not None:
            # The store work of a cancelled link still runs in its thread: wait, so that
            # whoever writes next (a promoted master) finds the log end settled.
            with contextlib.suppress(Exception):
                await self._in_thread
            self._in_thread = None
        self._connected = False

    def status(self) -> dict:
        """Whom this slave follows and how far behind it is."""
        end = self.store.commit_log_max_offset
        return {"master": self._master, "epoch": self._epoch, "end_offset": end,
                "master_end": self._master_end, "lag_bytes": max(0, self._master_end - end),
                "connected": self._connected}

    # -- the link ------------------------------------------------------------------------

    async def _run(self, addr: str, epoch: int) -> None:
        backoff_ms = RETRY_FIRST_MS
        while True:
            self._linked = False
            try:
                await self._session(addr, epoch)
            except _Refused as exc:
                log.warning("replication: master %s refused us: %s", addr, exc)
            except (p.ReplicationProtocolError, asyncio.IncompleteReadError, TimeoutError,
                    OSError, FerryError) as exc:
                log.warning("replication: link to master %s ended: %s", addr,
                            str(exc) or type(exc).__name__)
            except Exception:
                log.exception("replication: following %s crashed; retrying", addr)
            finally:
                self._connected = False
            # A link that worked is retried soon; a master that keeps failing, ever later.
            backoff_ms = RETRY_FIRST_MS if self._linked else min(backoff_ms * 2, RETRY_MAX_MS)
            await asyncio.sleep(backoff_ms / 1000)

    async def _session(self, addr: str, epoch: int) -> None:
        """One connection: handshake, then apply frames until it fails (raises)."""
        host, _, port = addr.rpartition(":")
        loop = asyncio.get_running_loop()
        transport, link = await asyncio.wait_for(
            loop.create_connection(LinkProtocol, host, int(port), ssl=self.tls,
                                   server_hostname=host if self.tls is not None else None),
            CONNECT_TIMEOUT_MS / 1000)
        try:
            await self._handshake(link, epoch)
            self._connected = self._linked = True
            log.info("replication: following %s (epoch %d) from %d", addr, epoch,
                     self.store.commit_log_max_offset)
            self._heard_at = asyncio.get_running_loop().time()
            await until_first_ends(
                self._apply_frames(link),
                watch_idle(lambda: self._heard_at, MASTER_IDLE_TIMEOUT_MS, "master"))
        finally:
            transport.close()

    async def _handshake(self, link: LinkProtocol, epoch: int) -> None:
        hello = p.Hello(p.MAGIC, p.VERSION, self.broker_id, epoch,
                        self.store.commit_log_max_offset, self.cluster, self.name,
                        self.epochs.entries)
        parts = p.encode_hello(hello)
        if self.credentials is not None:
            # AUTH first: a master with auth on reads nothing larger from an unknown peer.
            digest = hashlib.sha256(b"".join(parts)[p.LENGTH.size + p.TYPE.size:]).digest()
            master = p.master_target(self.cluster, self.name, self._master_id)
            signed = sign_repl(self.credentials, master, digest)
            link.write(p.encode_auth(signed.access_key, signed.ts_ms, signed.nonce,
                                     signed.signature, digest))
        link.write(parts)
        await link.drain()
        ftype, payload = await asyncio.wait_for(link.read_frame(), CONNECT_TIMEOUT_MS / 1000)
        if ftype is p.FrameType.REFUSE:
            master_epoch, reason = p.decode_refuse(payload)
            side = "higher" if master_epoch > epoch else "lower" if master_epoch < epoch else "equal"
            raise _Refused(f"{reason} (master epoch {master_epoch}, {side} than ours {epoch})")
        if ftype is not p.FrameType.WELCOME:
            raise p.ReplicationProtocolError(f"expected WELCOME or REFUSE, got {ftype.name}")
        welcome = p.decode_welcome(payload)
        self._master_end = welcome.master_end
        self._master_entries = welcome.entries
        end = await self._off_loop(self._rejoin, welcome.start_offset)
        link.write(p.encode_offset(p.FrameType.ACK, end))
        await link.drain()

    async def _off_loop(self, fn: Callable[..., int], *args: object) -> int:
        """Run store work in a thread; a cancel leaves it running and `stop` waits for it."""
        fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        self._in_thread = fut
        return await asyncio.shield(fut)

    def _rejoin(self, start: int) -> int:
        """Worker thread: drop what diverges from the master, take its epochs; the new end."""
        end = self.store.commit_log_max_offset
        if start > end:
            raise p.ReplicationProtocolError(f"the master starts at {start}, past our end {end}")
        if start < end:
            log.warning("replication: truncating the log from %d to %d (diverged from the "
                        "master)", end, start)
            self.store.truncate_to(start)
            self.epochs.truncate_from(start)
        self._sync_epochs(start)
        return start

    def _sync_epochs(self, end: int) -> int:
        """Make the epoch log equal the master's entries that start within our log."""
        want = [e for e in self._master_entries if e[1] <= end]
        if self.epochs.entries != want:
            # One durable write: a kill -9 here leaves the old list or the master's, never
            # an empty one (which would share no epoch with anybody: a full re-copy).
            self.epochs.replace(want)
        return end

    async def _apply_frames(self, link: LinkProtocol) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # (payload: a view of the link's buffer, valid until the next read_frame)
            ftype, payload = await link.read_frame()
            self._heard_at = loop.time()
            if ftype is p.FrameType.DATA:
                end = await self._append(*p.decode_data(payload))
            elif ftype is p.FrameType.HEARTBEAT:
                self._master_end = p.decode_offset("HEARTBEAT", payload)
                end = self.store.commit_log_max_offset
            elif ftype is p.FrameType.OFFSETS:
                self._offsets(bytes(payload))
                continue
            elif ftype is p.FrameType.EPOCHS:
                self._master_entries = p.decode_epochs(payload)
                await self._off_loop(self._sync_epochs, self.store.commit_log_max_offset)
                continue
            else:
                raise p.ReplicationProtocolError(f"a master sent {ftype.name}")
            link.write(p.encode_offset(p.FrameType.ACK, end))
            await link.drain()

    async def _append(self, phy_offset: int, master_end: int, chunk: memoryview) -> int:
        """Append one DATA chunk, wake long polls of its queues; the new end.

        The chunk is a view of the frame's payload all the way into the store (no
        copy); the store reports which queues got records, so the chunk is walked
        once (by its checks), not again here.
        """
        self._master_end = master_end
        touched: set[tuple[str, int]] = set()
        if self.store.config.flush_mode is FlushMode.SYNC:
            # append_replicated waits for the fsync: off the loop.
            end = await self._off_loop(self._append_sync, phy_offset, chunk, touched)
        else:
            # A write to the page cache: a thread hop would cost more than it saves
            # (the in-process bench of sync replication lost a third to it).
            end = self._append_sync(phy_offset, chunk, touched)
        if touched:
            try:
                self._on_append(touched)
            except Exception:
                log.exception("replication: the on_append callback failed")
        return end

    def _append_sync(self, phy_offset: int, chunk: memoryview,
                     touched: set[tuple[str, int]]) -> int:
        end = self.store.append_replicated(phy_offset, chunk, touched)
        self._sync_epochs(end)
        return end

    def _offsets(self, snapshot: bytes) -> None:
        try:
            self._on_offsets(snapshot)
        except Exception:
            log.exception("replication: loading the master's consumer offsets failed")

