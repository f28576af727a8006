"""Which slave a master links with: reading and judging a peer's AUTH and HELLO, the pool
of peers not yet judged, and how a failed connection on the port is named in the log.

With auth on, a peer's first frame must be an AUTH of at most MAX_AUTH_BYTES: its
signature names this master and the SHA-256 of the HELLO that follows, so the peer
is authenticated before the master reads (or buffers) anything larger. Then the
HELLO (at most MAX_HELLO_BYTES) must have that digest, and the identity must be
granted `replicate` on `broker:<name>/<the HELLO's broker id>` (docs/security.md,
"Replication link"). With auth off an AUTH frame first is read and ignored.

A slave is refused (REFUSE, then the master closes) when it speaks another
protocol version, belongs to another broker group, claims the master's own
id, is not a live registered broker of the group, follows a newer epoch than
the master's, or fails the checks above.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ferry.errors import FerryError
from ferry.log_limit import LogLimiter

from . import protocol as p

log = logging.getLogger(__name__)

#: The default handshake timeout (FERRY_BROKER_REPL_HANDSHAKE_TIMEOUT_MS): a connection's
#: TLS handshake, then the rest of its handshake (AUTH and HELLO up to the master's
#: WELCOME or REFUSE), must each end within this.
HANDSHAKE_TIMEOUT_MS = 3_000
#: Connections not judged yet (no valid AUTH with auth on, no HELLO yet with auth off)
#: held at once; a new one beyond it closes the OLDEST of them, so silent or trickling
#: peers cannot keep a real slave (which sends its first frames at once) out.
MAX_PENDING = 32


class SlaveAuth(Protocol):
    """What the master asks the broker's auth about a slave (ferry_broker.auth)."""

    def authenticate_slave(self, auth: p.Auth, master: str) -> str:
        """The access key that signed `auth` for `master`; raises FerryError to refuse."""

    def authorize_slave(self, auth: p.Auth, name: str, broker_id: int) -> None:
        """Raise FerryError unless `access_key` may replicate as broker `name`/`broker_id`."""


@dataclass(frozen=True, slots=True)
class Opening:
    """A peer's opening: its HELLO, or why it is refused before one was judged."""

    hello: p.Hello | None
    refusal: str | None = None


class SlaveAdmission:
    """The master's judge of a slave's opening frames."""

    def __init__(self, *, cluster: str, name: str, broker_id: int,
                 is_peer: Callable[[int], bool], auth: SlaveAuth | None) -> None:
        self.cluster, self.name, self.broker_id = cluster, name, broker_id
        self._is_peer = is_peer
        #: With auth on: verifies a slave's AUTH frame and its right to its broker id.
        self._auth = auth
        self.target = p.master_target(cluster, name, broker_id)

    async def read_opening(self, reader: asyncio.StreamReader,
                           trusted: Callable[[], None]) -> Opening:
        """Read the peer's AUTH (auth on) and HELLO; call `trusted` once it is authenticated
        (auth off: once its HELLO is read). ReplicationProtocolError for bad frames."""
        ftype, size = await p.read_head(reader)
        if self._auth is None:
            if ftype is p.FrameType.AUTH:  # a slave with credentials, to a master with auth off
                await p.read_payload(reader, ftype, size, p.MAX_AUTH_BYTES)
                ftype, size = await p.read_head(reader)
            hello = p.decode_hello(await self._hello_payload(reader, ftype, size))
            trusted()
            return Opening(hello)
        if ftype is not p.FrameType.AUTH:
            return Opening(None, f"authentication required: auth is on and the peer sent "
                                 f"{ftype.name} first, not AUTH")
        auth = p.decode_auth(await p.read_payload(reader, ftype, size, p.MAX_AUTH_BYTES))
        try:
            self._auth.authenticate_slave(auth, self.target)
        except FerryError as exc:
            return Opening(None, str(exc))
        trusted()
        ftype, size = await p.read_head(reader)
        payload = await self._hello_payload(reader, ftype, size)
        if hashlib.sha256(payload).digest() != auth.hello_sha256:
            return Opening(None, "the HELLO is not the one the AUTH frame signed")
        hello = p.decode_hello(payload)
        try:
            self._auth.authorize_slave(auth, self.name, hello.broker_id)
        except FerryError as exc:
            return Opening(hello, str(exc))
        return Opening(hello)

    @staticmethod
    async def _hello_payload(reader: asyncio.StreamReader, ftype: p.FrameType,
                             size: int) -> bytes:
        if ftype is not p.FrameType.HELLO:
            raise p.ReplicationProtocolError(f"expected HELLO, got {ftype.name}")
        return await p.read_payload(reader, ftype, size, p.MAX_HELLO_BYTES)

    def refusal(self, hello: p.Hello, epoch: int, linked_from: str | None) -> str | None:
        """Why this HELLO is refused by a master of `epoch`, or None to accept it;
        `linked_from`: the address of the live link its broker id has, if any."""
        if hello.version != p.VERSION:
            return f"unsupported replication protocol version {hello.version}"
        if (hello.cluster, hello.name) != (self.cluster, self.name):
            return (f"this is broker group {self.cluster}/{self.name}, "
                    f"not {hello.cluster}/{hello.name}")
        if hello.broker_id == self.broker_id:
            return f"broker id {hello.broker_id} is this master's own"
        try:
            peer_ok = self._is_peer(hello.broker_id)
        except Exception:
            log.exception("replication: the peer check failed")
            peer_ok = False
        if not peer_ok:
            return f"broker {hello.broker_id} is not a live broker of the group"
        if hello.epoch > epoch:
            return f"this master's epoch {epoch} is older than the slave's {hello.epoch}"
        if linked_from is not None:
            # The live link keeps its place (a HELLO is no proof that its slave died): it
            # ends when its connection does, or LINK_IDLE_TIMEOUT_MS after its last frame.
            return (f"broker {hello.broker_id} is linked already (from {linked_from}); a new "
                    "link is taken once that one ends")
        return None


class PendingPeers:
    """The connections not judged yet, oldest first: a new one beyond `limit` cancels the
    oldest (its handler closes it), so the port always takes a newcomer's first frames."""

    def __init__(self, limit: int = MAX_PENDING) -> None:
        self.limit = limit
        self._tasks: dict[asyncio.Task[None], None] = {}  # insertion order: oldest first
        self._limited = LogLimiter(log)  # anyone reaching the port can cause the line

    def add(self, task: asyncio.Task[None], peer: str) -> None:
        """Take in `task`, the connection from `peer`, closing the oldest beyond the limit."""
        while len(self._tasks) >= self.limit:
            oldest = next(iter(self._tasks))
            del self._tasks[oldest]
            oldest.cancel()
            self._limited.warning("evicted", "replication: %d connections not judged yet: "
                                  "closed the oldest for %s", self.limit, peer)
        self._tasks[task] = None

    def discard(self, task: asyncio.Task[None]) -> None:
        """`task` was judged, or ended."""
        self._tasks.pop(task, None)

    def __len__(self) -> int:
        return len(self._tasks)


def describe_failure(exc: BaseException) -> str:
    """Why a connection on the replication port ended, for its log line."""
    if isinstance(exc, asyncio.IncompleteReadError):
        return (f"the peer closed mid-frame ({len(exc.partial)} of {exc.expected} bytes)"
                if exc.partial else "the peer closed the connection")
    if isinstance(exc, TimeoutError):
        return "timed out waiting for the peer"
    return str(exc)


def peer_of(writer: asyncio.StreamWriter) -> str:
    """The peer's "host:port" ("?" when unknown)."""
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if peer else "?"
